"""Start a corral server in a local subprocess and stop it reliably.

The child binds port 0 and writes its URL to a file (no port races); the launcher waits
for that file and then for ``/ready``. If the child dies first, the error carries the
tail of its output. The child runs in its own process group and is asked to die with its
parent (``PR_SET_PDEATHSIG`` on Linux); live servers are also stopped at interpreter exit.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import httpx

from corral.auth import TOKEN_ENV, bearer_header, resolve_token
from corral.errors import ConnectionLost

_live: weakref.WeakSet[LocalServer] = weakref.WeakSet()
_live_lock = threading.Lock()


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerStartError(ConnectionLost):
    """The server process exited or never became ready; ``details['output']`` has its log."""


class LocalServer:
    """A corral server for ``target`` (``"module:Class"``) in a child process.

    Args:
        target: what ``corral serve`` accepts.
        host: interface to bind (loopback by default).
        server_args: extra ``corral serve`` options, e.g. ``["--max-sessions", "8"]``.
        python: the interpreter to run (another virtualenv's, for isolation).
        env: extra environment variables for the child.
        cwd: the child's working directory.
        startup_timeout: seconds to wait for ``/ready``.
        token: bearer token the server must require (passed to it as ``$CORRAL_TOKEN``);
            by default the server and this launcher use ``$CORRAL_TOKEN`` if set.
    """

    def __init__(
        self,
        target: str,
        *,
        host: str = "127.0.0.1",
        server_args: list[str] | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        startup_timeout: float = 60.0,
        token: str | None = None,
    ) -> None:
        self.target = target
        self.host = host
        self.server_args = list(server_args or [])
        self.python = python or sys.executable
        self.env = dict(env or {})
        if token is not None:
            self.env[TOKEN_ENV] = token
        self.token = resolve_token(self.env.get(TOKEN_ENV))
        self.cwd = cwd
        self.startup_timeout = startup_timeout
        self.url: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._last_output = ""

    def command(self, port_file: Path) -> list[str]:
        """The argv that starts the server."""
        return [
            self.python,
            "-m",
            "corral",
            "serve",
            self.target,
            "--host",
            self.host,
            "--port",
            "0",
            "--port-file",
            str(port_file),
            *self.server_args,
        ]

    def output(self, lines: int = 40) -> str:
        """The last ``lines`` lines the server printed (kept after it stopped)."""
        text = self._last_output
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                text = (Path(self._tmp.name) / "server.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _spawn(self) -> Path:
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-server-")
        port_file = Path(self._tmp.name) / "url"
        log = open(Path(self._tmp.name) / "server.log", "wb")  # noqa: SIM115 - handed to the child
        child_env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            self.command(port_file),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            cwd=self.cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        log.close()
        with _live_lock:
            _live.add(self)
        return port_file

    def _failure(self, why: str) -> ServerStartError:
        output = self.output()
        self.stop_now()
        return ServerStartError(
            f"server for {self.target!r} {why}" + (f":\n{output}" if output else ""),
            details={"output": output, "target": self.target},
        )

    async def start(self) -> str:
        """Start the server and wait until it is ready; return its URL.

        Raises:
            ServerStartError: the process exited or was not ready within the timeout.
        """
        if self.url is not None:
            return self.url
        port_file = self._spawn()
        deadline = time.monotonic() + self.startup_timeout
        headers = bearer_header(self.token) if self.token is not None else {}
        async with httpx.AsyncClient(timeout=2.0, trust_env=False, headers=headers) as http:
            while time.monotonic() < deadline:
                assert self.process is not None
                code = self.process.poll()
                if code is not None:
                    raise self._failure(f"exited with code {code}")
                if self.url is None and port_file.exists():
                    self.url = port_file.read_text().strip()
                if self.url is not None:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{self.url}/ready")).status_code == 200:
                            return self.url
                await asyncio.sleep(0.05)
        raise self._failure(f"was not ready within {self.startup_timeout:g} s")

    def stop_now(self, grace: float = 5.0) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(grace)
        with _live_lock:
            _live.discard(self)
        self.url = None
        if self._tmp is not None:
            self._last_output = self.output(1000)
            self._tmp.cleanup()
            self._tmp = None

    async def stop(self, grace: float = 5.0) -> None:
        """Stop the server without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.stop_now, grace)

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self.process is not None and self.process.poll() is None


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop_now(grace=2.0)
