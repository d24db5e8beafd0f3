"""The Docker provider and image builds, against a real Docker engine."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.envs.echo import EchoEnv
from corral.errors import ServerStartError
from corral.providers.base import SyncProvider
from corral.providers.docker import (
    MANAGED,
    OWNER_PID,
    BuiltImage,
    DockerProvider,
    build_image,
    reap_orphans,
)
from corral.providers.dockerfile import BuildError

pytestmark = [pytest.mark.docker]

try:
    import corral.server  # noqa: F401

    HAVE_SERVER = True
except ImportError:
    HAVE_SERVER = False

needs_server = pytest.mark.xfail(
    not HAVE_SERVER, reason="corral.server is not importable yet", strict=False
)


def corral_containers(client: Any) -> list[Any]:
    """Every corral-managed container owned by this test process."""
    found = client.containers.list(all=True, filters={"label": f"{MANAGED}=true"})
    return [c for c in found if c.labels.get(OWNER_PID) == str(os.getpid())]


@pytest.fixture
def provider(docker_client: Any) -> Iterator[SyncProvider]:
    with DockerProvider(docker_client, startup_timeout=60).sync() as p:
        yield p
    assert corral_containers(docker_client) == []


def crashing_command(lines: int) -> list[str]:
    script = f"import sys\nfor i in range({lines}): print('line', i)\nsys.exit(3)"
    return ["python3", "-c", script]


# ----------------------------------------------------------------------- builds


@pytest.mark.network
def test_image_labels_user_and_healthcheck(docker_client: Any, echo_image: BuiltImage) -> None:
    image = docker_client.images.get(echo_image.tag)
    labels = image.labels
    assert labels["org.corral.name"] == "echo"
    assert labels["org.corral.contract"] == EchoEnv.contract_version
    assert labels["org.corral.fingerprint"] == EchoEnv.contract().fingerprint
    assert labels["org.corral.entry_point"] == "corral.envs.echo:EchoEnv"
    assert labels["org.corral.memory"] == str(256 * 2**20)
    config = image.attrs["Config"]
    assert config["User"] == "corral"
    assert "8000/tcp" in config["ExposedPorts"]
    assert config["Healthcheck"]["Test"][0] == "CMD"
    assert config["Cmd"][:5] == ["python", "-m", "corral", "serve", "corral.envs.echo:EchoEnv"]


@pytest.mark.network
def test_offline_image_imports_everything_without_network(
    docker_client: Any, echo_image: BuiltImage
) -> None:
    dockerfile = echo_image.context.dockerfile.read_text()
    assert "pip install --no-index --find-links /tmp/wheels" in dockerfile
    out = docker_client.containers.run(
        echo_image.tag,
        [
            "python",
            "-c",
            "import corral, corral.server, fastapi, uvicorn, msgpack; print(corral.__file__)",
        ],
        network_mode="none",
        remove=True,
    )
    assert b"/opt/venv/lib/python3.11/site-packages/corral/__init__.py" in out
    # The wheels stayed in the build stage: the final image has no /tmp/wheels.
    listing = docker_client.containers.run(
        echo_image.tag, ["sh", "-c", "ls /tmp/wheels 2>&1 || true"], remove=True
    )
    assert b"No such file" in listing


def test_build_errors_carry_the_output(docker_client: Any, base_image: str, tmp_path: Path) -> None:
    (tmp_path / "corral.yaml").write_text("name: broken\nentry_point: corral.envs.echo:EchoEnv\n")
    bad_pip = [sys.executable, "-c", "import sys; print('resolver exploded'); sys.exit(1)"]
    with pytest.raises(BuildError, match="resolver exploded"):
        build_image(tmp_path, base_image=base_image, client=docker_client, pip=bad_pip)


def test_a_missing_base_image_fails_before_any_work(docker_client: Any, tmp_path: Path) -> None:
    (tmp_path / "corral.yaml").write_text("name: echo\nentry_point: corral.envs.echo:EchoEnv\n")
    lines: list[str] = []
    # A registry address where nothing listens: the pull fails at once, on loopback.
    missing = "127.0.0.1:9/corral-no-such-base:1"
    with pytest.raises(BuildError, match=r"is not present and cannot be pulled.*--base-image"):
        build_image(tmp_path, base_image=missing, client=docker_client, progress=lines.append)
    assert lines == [f"base image {missing} is not present; pulling it"]
    assert not (tmp_path / ".corral").exists()


# ----------------------------------------------------------------------- running


@needs_server
@pytest.mark.network
@pytest.mark.parametrize("network", ["bridge", "host"])
def test_start_serves_ready_and_health(
    provider: SyncProvider, docker_client: Any, echo_image: BuiltImage, network: str
) -> None:
    started = time.monotonic()
    endpoint = provider.start(echo_image.tag, network=network)  # type: ignore[arg-type]
    print(f"\n{network}: start-to-ready {time.monotonic() - started:.2f} s")
    assert endpoint.url == f"http://127.0.0.1:{endpoint.port}"
    ready = httpx.get(f"{endpoint.url}/ready", timeout=5)
    assert ready.status_code == 200 and ready.json()["max_sessions"] == 8
    assert httpx.get(f"{endpoint.url}/health", timeout=5).json() == {"status": "healthy"}

    container = docker_client.containers.get(endpoint.container_id)
    assert container.labels[MANAGED] == "true"
    assert container.labels[OWNER_PID] == str(os.getpid())
    host_config = container.attrs["HostConfig"]
    assert host_config["NanoCpus"] == 500_000_000
    assert host_config["Memory"] == 256 * 2**20
    assert host_config["PidsLimit"] == 128
    assert host_config["ReadonlyRootfs"] is True
    assert host_config["CapDrop"] == ["ALL"]
    if network == "bridge":
        (binding,) = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"]
        assert binding == {"HostIp": "127.0.0.1", "HostPort": str(endpoint.port)}
    else:
        assert host_config["NetworkMode"] == "host"

    provider.stop(endpoint)
    assert provider.running == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{endpoint.url}/health", timeout=2)


@needs_server
@pytest.mark.network
def test_many_bridge_containers_get_distinct_ports(
    provider: SyncProvider, echo_image: BuiltImage
) -> None:
    endpoints = [provider.start(echo_image.tag) for _ in range(3)]
    assert len({e.port for e in endpoints}) == 3
    for e in endpoints:
        assert httpx.get(f"{e.url}/ready", timeout=5).status_code == 200
    provider.close()
    assert provider.running == []
    with pytest.raises(ServerStartError, match="closed"):
        provider.start(echo_image.tag)


def test_crashed_container_raises_with_its_last_log_lines(
    provider: SyncProvider, docker_client: Any, base_image: str
) -> None:
    with pytest.raises(ServerStartError) as info:
        provider.start(base_image, command=crashing_command(80))
    error = info.value
    # The exit was seen (not a timeout), with the code and the last 50 of its 80 lines.
    assert "exited with code 3" in error.message
    assert error.details["exit_code"] == 3
    output = error.details["output"].splitlines()
    assert output == [f"line {i}" for i in range(30, 80)]
    assert "line 79" in error.message and "line 29" not in error.message
    # The failed container was removed.
    assert provider.running == [] and corral_containers(docker_client) == []


def test_host_network_crash(provider: SyncProvider, base_image: str) -> None:
    command = [
        "python3",
        "-c",
        "print('bad config'); raise SystemExit(2)",
        "--host",
        "x",
        "--port",
        "1",
    ]
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 2.*bad config"):
        provider.start(base_image, command=command, network="host")


def test_host_network_needs_a_serve_command(provider: SyncProvider, base_image: str) -> None:
    with pytest.raises(ServerStartError, match="has no --host option"):
        provider.start(base_image, command=["python3", "-c", "pass"], network="host")


def test_never_ready_times_out_with_logs(provider: SyncProvider, base_image: str) -> None:
    command = ["python3", "-c", "import time; print('thinking', flush=True); time.sleep(60)"]
    with pytest.raises(ServerStartError, match=r"(?s)did not answer /ready in time.*thinking"):
        provider.start(base_image, command=command, timeout=1.5)
    assert provider.running == []


def test_missing_image(provider: SyncProvider) -> None:
    with pytest.raises(ServerStartError, match="corral build --tag no-such-image:1"):
        provider.start("no-such-image:1")


def test_bad_network(docker_client: Any) -> None:
    with pytest.raises(ValueError, match="'bridge' or 'host'"):
        DockerProvider(docker_client, network="overlay")  # type: ignore[arg-type]


# A stand-in server that answers 200 on every path: the provider's lifecycle does not
# depend on corral's server.
TINY_SERVER = [
    "python3",
    "-c",
    "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
    "class H(BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200)\n"
    "        self.end_headers()\n"
    "HTTPServer(('0.0.0.0', 8000), H).serve_forever()\n",
]

CHILD = """
import os, signal, sys
from corral.providers.docker import DockerProvider

provider = DockerProvider(reap=False, guard=sys.argv[1] != "kill-unguarded").sync()
endpoint = provider.start({image!r}, command={command!r})
print(endpoint.container_id, flush=True)
if sys.argv[1].startswith("kill"):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _gone(docker_client: Any, container_id: str) -> bool:
    import docker.errors

    try:
        docker_client.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


@pytest.mark.parametrize("how", ["exit", "kill", "kill-unguarded"])
def test_no_orphans_after_exit_or_kill(
    docker_client: Any, base_image: str, tmp_path: Path, how: str
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(image=base_image, command=TINY_SERVER))
    done = subprocess.run(
        [sys.executable, str(script), how], capture_output=True, text=True, timeout=120
    )
    container_id = done.stdout.strip()
    assert container_id, done.stderr
    if how == "exit":
        # Removed at interpreter exit.
        assert _gone(docker_client, container_id)
        return
    if how == "kill":
        # SIGKILL ran no cleanup in the process: its guardian removes the container.
        deadline = time.monotonic() + 30
        while not _gone(docker_client, container_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(docker_client, container_id)
        return
    # Without a guardian the container is left, and the next provider reaps it.
    assert docker_client.containers.get(container_id).status == "running"
    assert container_id in reap_orphans(docker_client)
    assert _gone(docker_client, container_id)


def test_a_forgotten_provider_removes_its_containers(docker_client: Any, base_image: str) -> None:
    import docker.errors

    provider = DockerProvider(docker_client).sync()
    endpoint = provider.start(base_image, command=TINY_SERVER)
    assert httpx.get(endpoint.url, timeout=5).status_code == 200
    del provider
    gc.collect()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(endpoint.container_id)


def test_build_and_pull_events_become_one_line_each() -> None:
    from corral.providers.docker import _build_lines

    events = [
        {"status": "Pulling from library/python", "id": "3.11-slim"},
        {"status": "Downloading", "progress": "[=>   ] 1.2MB/50MB", "id": "a1b2c3"},
        {"stream": "Step 1/2 : FROM corral-base:bookworm\n"},
        {"aux": {"ID": "sha256:feed"}},
    ]
    lines: list[str] = []
    assert _build_lines(iter(events), lines.append)[0] == "sha256:feed"
    assert lines == [
        "3.11-slim: Pulling from library/python",
        "a1b2c3: Downloading [=>   ] 1.2MB/50MB",
        "Step 1/2 : FROM corral-base:bookworm",
    ]
