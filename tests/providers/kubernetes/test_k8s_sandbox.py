"""The coding environment's sandbox in the rendered Pod (issue 30.16).

No Kubernetes node runs here. The Pod's security settings are mapped onto their Docker
equivalents and the real image (``corral build`` of the echo environment, which carries
corral and so the coding environment) runs the coding environment's preflight under
them on this machine's Docker engine:

=====================================  =========================================
Pod (container securityContext)        ``docker run``
=====================================  =========================================
runAsUser 10001, runAsNonRoot          ``--user 10001:10001``
capabilities drop ALL                  ``--cap-drop ALL``
allowPrivilegeEscalation false         ``--security-opt no-new-privileges``
readOnlyRootFilesystem, /tmp emptyDir  ``--read-only --tmpfs /tmp``
seccompProfile RuntimeDefault          Docker's default seccomp profile
seccompProfile Unconfined              ``--security-opt seccomp=unconfined``
procMount Unmasked                     ``--security-opt systempaths=unconfined``
=====================================  =========================================

Not exercised: ``hostUsers: false`` (Docker has user namespaces per daemon, not per
container; in the cluster it only makes the Pod's uids nobody on the node, which adds a
boundary and removes none), AppArmor profiles of a cluster's nodes, and gVisor/Kata.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
from tests.support.k8s_models import roundtrip

from corral.providers.docker import BuiltImage
from corral.providers.kubernetes.pods import ServerTemplate
from corral.sandbox.probe import ALLOW_WEAK_ENV

PREFLIGHT = (
    "from corral.envs.coding import CodingEnv\n"
    "try:\n"
    "    print(CodingEnv.preflight())\n"
    "except Exception as exc:\n"
    "    print('REFUSED', exc)\n"
)


def docker_options(pod_spec: dict[str, Any]) -> list[str]:
    """The ``docker run`` options of a rendered Pod spec's server container (the table).

    The CLI, not the SDK: ``systempaths=unconfined`` is the CLI's (it clears the masked
    and read-only paths), the SDK has no such option.
    """
    container = pod_spec["containers"][0]
    security = container["securityContext"]
    pod_security = pod_spec["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    options = [
        f"--user={pod_security['runAsUser']}:{pod_security['runAsGroup']}",
        "--cap-drop=ALL",
        "--read-only",
        "--tmpfs=/tmp",
    ]
    if security["allowPrivilegeEscalation"] is False:
        options.append("--security-opt=no-new-privileges")
    seccomp = security.get("seccompProfile") or pod_security["seccompProfile"]
    if seccomp["type"] == "Unconfined":
        options.append("--security-opt=seccomp=unconfined")
    else:
        assert seccomp["type"] == "RuntimeDefault"
    if security.get("procMount") == "Unmasked":
        options.append("--security-opt=systempaths=unconfined")
    options += [f"--env={e['name']}={e['value']}" for e in container["env"] if "value" in e]
    return options


def run_preflight(image: str, template: ServerTemplate) -> str:
    docker = shutil.which("docker")
    assert docker is not None, "a Docker engine without its CLI"
    done = subprocess.run(
        [docker, "run", "--rm", *docker_options(template.pod_spec()), image,
         "python", "-c", PREFLIGHT],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_rendered_settings_per_sandbox_choice() -> None:
    namespaces = ServerTemplate(name="x", image="x", sandbox="namespaces").pod("p")
    assert roundtrip(namespaces, "V1Pod") == namespaces
    spec = namespaces["spec"]
    assert spec["hostUsers"] is False
    security = spec["containers"][0]["securityContext"]
    assert security["procMount"] == "Unmasked"
    assert security["seccompProfile"] == {"type": "Unconfined"}
    assert security["runAsNonRoot"] and security["capabilities"] == {"drop": ["ALL"]}
    # The boundary is the RuntimeClass: the weak mode is allowed inside, explicitly.
    boxed = ServerTemplate(name="x", image="x", sandbox="runtime-class", runtime_class="gvisor")
    env = {e["name"]: e.get("value") for e in boxed.env()}
    assert env[ALLOW_WEAK_ENV] == "1" and boxed.pod_spec()["runtimeClassName"] == "gvisor"
    plain = ServerTemplate(name="x", image="x").pod("p")
    assert "hostUsers" not in plain["spec"]
    assert ALLOW_WEAK_ENV not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}
    with pytest.raises(ValueError, match="give runtime_class"):
        ServerTemplate(name="x", image="x", sandbox="runtime-class")
    with pytest.raises(ValueError, match="sandbox must be one of"):
        ServerTemplate(name="x", image="x", sandbox="bwrap")


def test_the_hardened_pod_refuses_the_weak_mode(docker_client: Any, echo_image: BuiltImage) -> None:
    """What the audit found (the coding env fell silently to rlimits in the Pod) now stops
    the server at its preflight, with every mode's reason."""
    out = run_preflight(echo_image.tag, ServerTemplate(name="x", image="x"))
    assert out.startswith("REFUSED"), out
    assert "unshare" in out and "CORRAL_SANDBOX_ALLOW_WEAK" in out


def test_the_namespaces_pod_runs_a_namespace_mode(
    docker_client: Any, echo_image: BuiltImage
) -> None:
    template = ServerTemplate(name="x", image="x", sandbox="namespaces")
    out = run_preflight(echo_image.tag, template)
    # util-linux's unshare is in the Debian base image; bwrap is not installed there.
    assert out == "{'sandbox': 'unshare', 'sandbox_strategy': 'userns'}", out


def test_the_runtime_class_pod_allows_the_weak_mode(
    docker_client: Any, echo_image: BuiltImage
) -> None:
    template = ServerTemplate(name="x", image="x", sandbox="runtime-class", runtime_class="gvisor")
    out = run_preflight(echo_image.tag, template)
    assert out == "{'sandbox': 'rlimits', 'sandbox_strategy': 'direct'}", out
