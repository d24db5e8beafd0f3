"""Start a corral server in a local subprocess and stop it reliably.

The child binds port 0 and writes its URL to a file (no port races); :class:`LocalServer`
waits for that file and then for ``/ready``. Alternatively it binds the listening
socket itself and the child inherits it (``listen_socket``), so the URL is known before
the child starts and the child may live in a network namespace of its own. If the child
dies first, the error carries the tail of its output. The child runs in its own process
group and is asked to die with its parent (``PR_SET_PDEATHSIG`` on Linux); live servers
are also stopped at interpreter exit, and a start that fails or is cancelled stops its
process before the error propagates.

This is the engine of :class:`corral.providers.local.LocalProcessProvider`, which adds
virtualenvs, resource limits and sandboxes through the hooks here (``wrap``, ``preexec``,
``on_spawn``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from corral.auth import TOKEN_ENV, bearer_header, resolve_token
from corral.client.health import READY, answers, probe_client
from corral.client.warm_start import (
    ChildSetup,
    TemplateError,
    WarmProcess,
    WarmTemplate,
    die_with_parent,
    enabled,
    warm_template,
)
from corral.errors import ServerStartError

_live: weakref.WeakSet[LocalServer] = weakref.WeakSet()
_live_lock = threading.Lock()

ServerProcess = subprocess.Popen[bytes] | WarmProcess
"""A local server's process: a fresh interpreter, or a fork of a warm template."""


def socket_url(sock: socket.socket) -> str:
    """The base URL of a bound TCP socket (``http://127.0.0.1:PORT``, IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class LocalServer:
    """A corral server for ``target`` in a child process.

    Args:
        target: what ``corral serve`` accepts: ``"module:Class"``, ``"gym:ID"`` or an
            environment directory.
        host: interface to bind (loopback by default).
        server_args: extra ``corral serve`` options, e.g. ``["--max-sessions", "8"]``.
        python: the interpreter to run (another virtualenv's, for isolation).
        env: extra environment variables for the child.
        cwd: the child's working directory.
        startup_timeout: seconds to wait for ``/ready``.
        token: bearer token the server must require (passed to it as ``$CORRAL_TOKEN``);
            by default the server and this object use ``$CORRAL_TOKEN`` if set.
        listen_socket: a bound, listening socket the child inherits and serves on
            (``corral serve --fd``) instead of binding its own; this object closes its
            copy once the child has it.
        wrap: turns the server's argv into the argv to run (e.g. inside a sandbox
            launcher); it receives the full command, interpreter first.
        setup: resource limits and niceness the server applies to itself before it runs
            (in a fresh interpreter before exec; in a warm one after the fork).
        preexec: run in the child before exec, after the parent-death signal is set;
            a server with one always starts as a fresh interpreter.
        on_spawn: called with the child process as soon as it exists (a watchdog
            registers it here).
        stop_grace: seconds between SIGTERM and SIGKILL when stopping; 0 kills at once
            (for children that cannot shut down gracefully, such as sandbox launchers).
        death_signal: what the child gets when its parent dies (``PR_SET_PDEATHSIG``).
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
        listen_socket: socket.socket | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
        setup: ChildSetup | None = None,
        preexec: Callable[[], None] | None = None,
        on_spawn: Callable[[ServerProcess], None] | None = None,
        stop_grace: float = 5.0,
        death_signal: int = signal.SIGTERM,
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
        self.listen_socket = listen_socket
        self.wrap = wrap
        self.setup = setup
        self.preexec = preexec
        self.on_spawn = on_spawn
        self.stop_grace = stop_grace
        self.death_signal = death_signal
        self.url: str | None = None
        self.process: ServerProcess | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._last_output = ""

    def command(self, port_file: Path) -> list[str]:
        """The argv that starts the server."""
        if self.listen_socket is not None:
            where = ["--fd", str(self.listen_socket.fileno())]
        else:
            where = ["--host", self.host, "--port", "0", "--port-file", str(port_file)]
        argv = [self.python, "-m", "corral", "serve", self.target, *where, *self.server_args]
        return self.wrap(argv) if self.wrap is not None else argv

    def output(self, lines: int = 40) -> str:
        """The last ``lines`` lines the server printed (kept after it stopped)."""
        text = self._last_output
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                text = (Path(self._tmp.name) / "server.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _child_setup(self) -> None:
        die_with_parent(self.death_signal)
        if self.setup is not None:
            self.setup.apply()
        if self.preexec is not None:
            self.preexec()

    def _child_env(self) -> dict[str, str]:
        return {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}

    async def _warm_template(self, env: dict[str, str]) -> WarmTemplate | None:
        """The started template to fork this server from, or None for a fresh interpreter.

        A server runs warm unless something must happen between fork and exec (``wrap``,
        ``preexec``) or ``CORRAL_WARM_START=0``. A template that cannot start (an
        interpreter without this corral, say) means a cold start, whose errors say why.
        """
        if self.wrap is not None or self.preexec is not None or not enabled(env):
            return None
        template = warm_template(self.python, env)
        try:
            await asyncio.to_thread(template.start, self.startup_timeout)
        except TemplateError:
            return None
        return template

    def _spawn(self, env: dict[str, str], template: WarmTemplate | None = None) -> Path:
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-server-")
        port_file = Path(self._tmp.name) / "url"
        log = open(Path(self._tmp.name) / "server.log", "wb")  # noqa: SIM115 - handed to the child
        inherited = (self.listen_socket.fileno(),) if self.listen_socket is not None else ()
        argv = self.command(port_file)
        self.process = None
        try:
            if template is not None:
                with contextlib.suppress(TemplateError):
                    self.process = template.spawn(
                        argv[3:],  # after "python -m corral"
                        env=env,
                        cwd=self.cwd,
                        stdout=log.fileno(),
                        pass_fds=inherited,
                        death_signal=self.death_signal,
                        setup=self.setup,
                        timeout=self.startup_timeout,
                    )
            if self.process is None:
                self.process = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                    pass_fds=inherited,
                    preexec_fn=self._child_setup,
                )
        finally:
            log.close()
        with _live_lock:
            _live.add(self)
        if self.listen_socket is not None:
            self.url = socket_url(self.listen_socket)
            # The child holds the socket now. Closing this copy matters: while the parent
            # keeps it, connections to a dead server would queue instead of being refused.
            self.listen_socket.close()
            self.listen_socket = None
        if self.on_spawn is not None:
            self.on_spawn(self.process)
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

        The process is stopped if it does not become ready, and also when the wait is
        cancelled or fails in any other way.

        Raises:
            ServerStartError: the process exited or was not ready within the timeout.
        """
        if self.running and self.url is not None:
            return self.url
        try:
            env = self._child_env()
            port_file = self._spawn(env, await self._warm_template(env))
            return await self._wait_ready(port_file)
        except ServerStartError:
            raise
        except BaseException:
            self.stop_now()
            raise

    async def _wait_ready(self, port_file: Path) -> str:
        deadline = time.monotonic() + self.startup_timeout
        headers = bearer_header(self.token) if self.token is not None else {}
        async with probe_client(headers) as http:
            while time.monotonic() < deadline:
                assert self.process is not None
                code = self.process.poll()
                if code is not None:
                    raise self._failure(f"exited with code {code}")
                if self.url is None and port_file.exists():
                    self.url = port_file.read_text().strip()
                if self.url is not None and await answers(self.url, READY, http=http):
                    return self.url
                await asyncio.sleep(0.05)
        raise self._failure(f"was not ready within {self.startup_timeout:g} s")

    def stop_now(self, grace: float | None = None) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after ``grace`` seconds.

        ``grace`` defaults to ``stop_grace``; with 0 the group is killed at once.
        """
        if self.listen_socket is not None:
            self.listen_socket.close()
            self.listen_socket = None
        process = self.process
        if process is None:
            return
        wait = self.stop_grace if grace is None else grace
        if process.poll() is None and wait > 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(wait)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        with _live_lock:
            _live.discard(self)
        self.url = None
        if self._tmp is not None:
            self._last_output = self.output(1000)
            self._tmp.cleanup()
            self._tmp = None

    async def stop(self, grace: float | None = None) -> None:
        """Stop the server without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.stop_now, grace)

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self.process is not None and self.process.poll() is None

    async def alive(self) -> bool:
        """:attr:`running`, as the pool's fleet asks any server (see ``ServerHandle``)."""
        return self.running


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop_now(grace=min(server.stop_grace, 2.0))
