"""Virtualenvs holding a real OpenEnv release, built once and cached outside the repo.

    python tests/conformance/venvs.py openenv==0.10.0      # build (or reuse) and print its path

``openenv-core`` 0.3 and ``openenv`` 0.10 conflict (both install the ``openenv`` package),
so each gets its own virtualenv under ``~/.cache/corral-tests/`` (``$CORRAL_TEST_CACHE``
overrides), keyed by the requirement and corral's own core dependencies: corral itself is
not installed there but put on ``PYTHONPATH``, so a checkout anywhere reuses the cache.
Each venv holds what a user serving an OpenEnv environment with corral has: the OpenEnv
release, corral's core dependencies, and korrel (a third-party OpenEnv environment
generator from PyPI) with its light dependencies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WITHOUT_GRADIO = REPO / "tests" / "support" / "without_gradio"
"""First on a peer process's path: a ``gradio`` that cannot be imported (see its docstring)."""
EXTRA = ("korrel==0.1.3",)
"""Installed beside the OpenEnv release: the third-party environment package."""


def cache_root() -> Path:
    """Where the peer virtualenvs live."""
    root = os.environ.get("CORRAL_TEST_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "corral-tests"


def corral_requirements() -> list[str]:
    """corral's core dependencies, as pyproject.toml lists them."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def requirements(peer: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Everything a peer virtualenv holds for the requirement ``peer`` (and ``extra``:
    the dependencies of the OpenEnv environments of the catalogue suite)."""
    return [peer, *EXTRA, *extra, *corral_requirements()]


def venv_path(peer: str, extra: tuple[str, ...] = ()) -> Path:
    """The cached virtualenv for ``peer`` (e.g. ``openenv==0.10.0``), with ``extra``."""
    reqs = requirements(peer, extra)
    key = hashlib.sha256("\n".join([sys.version, *reqs]).encode()).hexdigest()[:12]
    name = peer.replace("==", "-").replace("[", "_").replace("]", "")
    name += "-catalog" if extra else ""
    return cache_root() / f"{name}-py{sys.version_info[0]}{sys.version_info[1]}-{key}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Named after the whole directory name: with_suffix() would cut it at its version's
    # last dot, and every venv of one release would share (and wait on) one lock.
    with open(path.with_name(f"{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions never build the same venv
        yield


def ensure(peer: str, extra: tuple[str, ...] = ()) -> Path:
    """Build the virtualenv for ``peer`` (with ``extra``) unless it is cached; return its
    python.

    Raises:
        RuntimeError: pip failed (its output's tail is in the message).
    """
    path = venv_path(peer, extra)
    python = path / "bin" / "python"
    stamp = path / ".complete"
    with _locked(path):
        if stamp.exists():
            return python
        if path.exists():
            subprocess.run(["rm", "-rf", str(path)], check=True)
        venv.EnvBuilder(with_pip=True).create(path)
        run = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *requirements(peer, extra),
            ],
            capture_output=True,
            text=True,
            timeout=1500,
        )
        if run.returncode != 0:
            raise RuntimeError(f"pip install {peer} failed:\n{(run.stdout + run.stderr)[-3000:]}")
        stamp.write_text("\n".join(requirements(peer, extra)))
    return python


def peer_env(python: Path, *, gradio: bool = False) -> dict[str, str]:
    """The environment for a child process of a peer venv: corral's source on the path,
    OpenEnv's web interface off (and gradio, which only it uses, left out unless
    ``gradio``: some of OpenEnv's own environments import the web interface's helpers)."""
    env = dict(os.environ)
    paths = [] if gradio else [str(WITHOUT_GRADIO)]
    paths += [str(REPO / "src"), str(REPO)]
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths += [p for p in inherited if not (gradio and p == str(WITHOUT_GRADIO))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = os.pathsep.join([str(python.parent), env.get("PATH", "")])
    env.pop("ENABLE_WEB_INTERFACE", None)
    return env


if __name__ == "__main__":
    print(ensure(sys.argv[1], tuple(sys.argv[2:])))
