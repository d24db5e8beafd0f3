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
from collections.abc import AsyncIterator, Awaitable, Callable
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


def holding_args(sessions: int) -> tuple[str, ...]:
    """``corral serve`` options for a server one benchmark fills with ``sessions``
    long-held sessions: room for them and 16 more, none reaped for idling, no share kept
    for other clients."""
    return ("--max-sessions", str(sessions + 16), "--idle-timeout", "0", *OWNED)


async def holding_server(
    target: str, sessions: int, *, env: dict[str, str] | None = None
) -> Served:
    """A ``corral serve`` process with :func:`holding_args`."""
    return await corral_server(target, *holding_args(sessions), env=env)


ECHO = "corral.envs.echo:EchoEnv"
SHARED_ROOM = 1024
"""Sessions the shared echo servers of a smoke run hold: more than its sections open at
once (its largest is the scale section's 200)."""
_shared: dict[str, asyncio.Future[Served]] | None = None
"""Inside :func:`sharing`: the shared servers, by name, as they start."""


@contextlib.asynccontextmanager
async def sharing() -> AsyncIterator[None]:
    """Within: every section asking for an echo server (:func:`corral_echo`,
    :func:`openenv_echo`) gets the one of the whole block, started once, with room for
    them all, and stopped when the block ends.

    For the smoke run (issue 32): its sections run at once and time nothing, and each
    server process costs ~1 CPU-s (corral) to ~2 (openenv-core) to import and start;
    what the sections measure of a server (its memory) is then a figure of a shared
    process, as nothing of a smoke run is a figure.
    """
    global _shared
    _shared = {}
    try:
        yield
    finally:
        launches, _shared = list(_shared.values()), None
        started = await asyncio.gather(*launches, return_exceptions=True)
        await asyncio.gather(*(s.stop() for s in started if isinstance(s, Served)))


async def _nothing() -> None:
    """A shared server's ``stop()`` for its sections: :func:`sharing` stops it."""


async def _shared_or(name: str, launch: Callable[[], Awaitable[Served]]) -> Served | None:
    """Inside :func:`sharing`, the server ``name`` (``launch`` starts it the first time
    it is asked for); outside, None."""
    if _shared is None:
        return None
    if name not in _shared:
        _shared[name] = asyncio.ensure_future(launch())
    # Shielded: a section cancelled while it waits (a timeout) leaves the start to the
    # others, and the block's end stops what started.
    server = await asyncio.shield(_shared[name])
    return Served(server.name, server.url, server.pid, _nothing)


async def corral_echo(*args: str) -> Served:
    """A ``corral serve`` process of the echo environment with options ``args``, or,
    inside :func:`sharing`, the block's one (with room for every section)."""
    shared = await _shared_or("corral", lambda: holding_server(ECHO, SHARED_ROOM))
    return shared if shared is not None else await corral_server(ECHO, *args)


async def openenv_echo(max_sessions: int = 1024) -> Served:
    """An openenv-core echo server for ``max_sessions``, or, inside :func:`sharing`, the
    block's one (with room for every section)."""
    shared = await _shared_or("openenv", lambda: openenv_server("echo", SHARED_ROOM + 16))
    return shared if shared is not None else await openenv_server("echo", max_sessions)


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
