"""Starting the contenders' servers as separate processes, and reading their memory."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from corral.client.local_server import LocalServer

ROOT = Path(__file__).resolve().parent.parent


def _die_with_parent() -> None:
    """In the child: be killed if the benchmark process dies without stopping us."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def rss_kb(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def rss_kb_self() -> int:
    """This process's resident memory in KiB."""
    return rss_kb(os.getpid())


class Served:
    """A server process: its URL, its pid, and how to stop it."""

    def __init__(self, name: str, url: str, pid: int, stop: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.url = url
        self.pid = pid
        self._stop = stop

    async def stop(self) -> None:
        """Stop the process (idempotent)."""
        await self._stop()

    def rss_kb(self) -> int:
        """The server's resident memory in KiB."""
        return rss_kb(self.pid)


OWNED = ("--max-sessions-per-client", "0")
"""For a server one benchmark process fills: no share kept for other clients (it has none)."""


async def corral_server(target: str, *args: str, env: dict[str, str] | None = None) -> Served:
    """A ``corral serve`` process for ``target`` (started by corral's own launcher;
    ``env``: extra environment variables, e.g. ``PYTHONPATH`` to serve another tree)."""
    server = LocalServer(target, server_args=list(args), cwd=ROOT, startup_timeout=120, env=env)
    url = await server.start()
    assert server.process is not None
    return Served(f"corral {target}", url, server.process.pid, server.stop)


class _Child:
    """A benchmark helper server: ``python -m <module> ... --port-file F`` (``python``:
    this interpreter unless given)."""

    def __init__(
        self,
        module: str,
        *args: str,
        python: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-bench-")
        self.port_file = Path(self._tmp.name) / "url"
        self.log = Path(self._tmp.name) / "log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [python or sys.executable, "-m", module, *args, "--port-file", str(self.port_file)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                env=None if env is None else {**os.environ, **env},
            )

    async def wait(self, health: bool, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited early:\n{self.log.read_text()[-2000:]}")
                if self.port_file.exists():
                    url = self.port_file.read_text().strip()
                    if not health:
                        return url
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{url}/health")).status_code == 200:
                            return url
                await asyncio.sleep(0.02)
        raise RuntimeError(f"server not ready within {timeout:g} s")

    async def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.process.wait, 10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._tmp.cleanup()


async def holding_server(
    target: str, sessions: int, *, env: dict[str, str] | None = None
) -> Served:
    """A ``corral serve`` process one benchmark fills with ``sessions`` long-held sessions:
    room for them and 16 more, none reaped for idling, no share kept for other clients."""
    return await corral_server(
        target,
        "--max-sessions",
        str(sessions + 16),
        "--idle-timeout",
        "0",
        *OWNED,
        env=env,
    )


async def openenv_server(
    kind: str, max_sessions: int = 1024, env: dict[str, str] | None = None
) -> Served:
    """An openenv-core server (its ``create_app`` under uvicorn) for ``kind`` (``env``:
    extra environment variables)."""
    child = _Child("benchmarks.openenv_server", kind, "--max-sessions", str(max_sessions), env=env)
    try:
        url = await child.wait(health=True)
    except BaseException:
        await child.stop()
        raise
    return Served(f"openenv {kind}", url, child.process.pid, child.stop)


async def floor_server(kind: str = "websockets") -> Served:
    """The raw echo server of ``kind`` (``websockets``, ``picows`` or ``tcp``)."""
    child = _Child("benchmarks.floor_server", "--kind", kind)
    try:
        url = await child.wait(health=False)
    except BaseException:
        await child.stop()
        raise
    return Served(f"{kind} floor", url, child.process.pid, child.stop)


def launch_module(python: str, module: str, *args: str) -> _Child:
    """Start ``python -m module`` (a helper server run by another interpreter, e.g. a
    peer's own virtualenv) without waiting."""
    return _Child(module, *args, python=python)


def launch_openenv(kind: str) -> _Child:
    """Start an openenv-core server process without waiting (for start-up timing)."""
    return _Child("benchmarks.openenv_server", kind)
