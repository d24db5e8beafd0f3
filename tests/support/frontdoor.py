"""Real front doors for fleet tests: ``corral serve`` processes behind nginx or HAProxy.

    with ServerProcesses("corral.envs.echo:EchoEnv", 2, tmp_path) as servers:
        with FrontDoor("nginx", servers.backends(), tmp_path) as door:
            pool = EnvPool(64, [door.url] * 2, ...)
            door.cut()            # every client connection through the door drops
            servers.restart(0)    # SIGTERM (the server drains), then the same port again

The proxies are Debian's (``.ci/setup-frontdoors.sh`` installs them); their
configurations come from :mod:`corral.providers.frontdoor`, the renderers
``corral deploy nginx|haproxy`` prints, so the tests run what users deploy. Everything
binds 127.0.0.1; every wait is bounded and polls a condition (a port answering, a process
exiting), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import httpx
import pytest

from corral.providers.frontdoor import Backend, render_haproxy, render_nginx

Kind = Literal["nginx", "haproxy"]

BINARIES = {"nginx": "/usr/sbin/nginx", "haproxy": "/usr/sbin/haproxy"}


def require(kind: Kind) -> str:
    """The proxy's binary, or skip (fail when ``CORRAL_REQUIRE_FRONTDOORS`` is set: CI
    installs them, so a missing one there is a broken setup, not a reason to skip)."""
    path = shutil.which(kind) or (BINARIES[kind] if os.path.exists(BINARIES[kind]) else None)
    if path is None:
        message = f"{kind} is not installed (run .ci/setup-frontdoors.sh)"
        if os.environ.get("CORRAL_REQUIRE_FRONTDOORS"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    """A port free on 127.0.0.1 now (the proxies need their ports in their config)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: object, what: str, timeout: float = 60.0, every: float = 0.05) -> None:
    """Poll ``check()`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


class ServerProcess:
    """One ``corral serve`` on a fixed port of 127.0.0.1, restartable on that port."""

    def __init__(
        self, target: str, server_id: str, port: int, workdir: Path, args: Sequence[str] = ()
    ) -> None:
        self.target = target
        self.id = server_id
        self.port = port
        self.args = list(args)
        self.log = workdir / f"{server_id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def backend(self) -> Backend:
        return Backend(self.id, f"127.0.0.1:{self.port}")

    def start(self) -> ServerProcess:
        self.launch()
        wait_until(self.ready, f"server {self.id} on port {self.port} to be ready")
        return self

    def launch(self) -> None:
        """Start the process (not waiting for it to be ready: :meth:`ready`)."""
        command = [
            sys.executable, "-m", "corral", "serve", self.target,
            "--port", str(self.port), "--server-id", self.id, *self.args,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1

    def ready(self) -> bool:
        process = self.process
        if process is None or process.poll() is not None:
            raise AssertionError(f"server {self.id} exited; log:\n{self.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/ready", timeout=2.0).status_code == 200
        return False

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def send(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def wait_exit(self, timeout: float = 120.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> None:
        """Stop with ``sig`` (SIGTERM drains) and wait; SIGKILL if it overstays."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-whatever, as a crashed Pod does."""
        self.stop(signal.SIGKILL, timeout=10)


class ServerProcesses:
    """``count`` servers of ``target`` with ids ``s0``, ``s1``, ... (``prefix`` + index)
    on fixed ports."""

    def __init__(
        self,
        target: str,
        count: int,
        workdir: Path,
        args: Sequence[str] = (),
        prefix: str = "s",
    ) -> None:
        self.servers = [
            ServerProcess(target, f"{prefix}{i}", free_port(), workdir, args) for i in range(count)
        ]

    def __enter__(self) -> ServerProcesses:
        try:
            for server in self.servers:  # all at once: each takes seconds to import
                server.launch()
            for server in self.servers:
                wait_until(server.ready, f"server {server.id} on port {server.port} to be ready")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    @contextlib.contextmanager
    def together(*fleets: ServerProcesses) -> Iterator[None]:
        """Start several fleets at once (every process launched before any is waited
        for); close them all at the end."""
        together = ServerProcesses.__new__(ServerProcesses)
        together.servers = [server for fleet in fleets for server in fleet.servers]
        with together:
            yield

    def __getitem__(self, index: int) -> ServerProcess:
        return self.servers[index]

    def __len__(self) -> int:
        return len(self.servers)

    def backends(self) -> list[Backend]:
        return [s.backend for s in self.servers]

    def restart(self, index: int, sig: int = signal.SIGTERM) -> None:
        """Stop server ``index`` with ``sig`` and start it again on the same port."""
        server = self.servers[index]
        server.stop(sig)
        wait_until(lambda: not _answers(server.port), f"port {server.port} to close")
        server.start()

    def close(self) -> None:
        for server in self.servers:
            server.stop(signal.SIGKILL, timeout=10)


class FrontDoor:
    """nginx or HAProxy on a free port of 127.0.0.1 in front of ``backends``.

    ``shutdown_timeout_s`` bounds how long a reload keeps old connections (nginx's
    ``worker_shutdown_timeout``, HAProxy's ``hard-stop-after``): a reload then cuts every
    WebSocket after that long, as an ingress controller's reload does.
    """

    def __init__(
        self,
        kind: Kind,
        backends: Sequence[Backend],
        workdir: Path,
        shutdown_timeout_s: float = 0.5,
    ) -> None:
        self.kind = kind
        self.binary = require(kind)
        self.backends = list(backends)
        self.port = free_port()
        self.dir = workdir / f"{kind}-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / f"{kind}.conf"
        self.stats = self.dir / "admin.sock"
        self.shutdown_timeout_s = shutdown_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "proxy.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _render(self) -> str:
        listen = f"127.0.0.1:{self.port}"
        if self.kind == "nginx":
            return render_nginx(
                self.backends,
                listen=listen,
                prefix=self.dir,
                shutdown_timeout_s=self.shutdown_timeout_s,
            )
        return render_haproxy(
            self.backends,
            listen=listen,
            stats_socket=self.stats,
            hard_stop_after_s=self.shutdown_timeout_s,
            check_interval_ms=300,
        )

    def _command(self) -> list[str]:
        if self.kind == "nginx":
            return [self.binary, "-p", str(self.dir), "-c", str(self.conf)]
        # Master-worker mode: SIGUSR2 reloads (a new worker; the old one stops after
        # hard-stop-after), as haproxy.service does.
        return [self.binary, "-W", "-f", str(self.conf)]

    def __enter__(self) -> FrontDoor:
        self.conf.write_text(self._render())
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_until(self._up, f"{self.kind} on port {self.port}")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _up(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.kind} exited; log:\n{self.log.read_text()}")
        return _answers(self.port)

    def reload(self) -> None:
        """Reload the configuration: old connections end within ``shutdown_timeout_s``."""
        assert self.process is not None
        self.conf.write_text(self._render())
        self.process.send_signal(signal.SIGHUP if self.kind == "nginx" else signal.SIGUSR2)

    def admin(self, command: str) -> str:
        """One command on HAProxy's runtime API (its admin socket)."""
        assert self.kind == "haproxy"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def cut(self) -> None:
        """Drop every client connection through the door now.

        HAProxy: ``shutdown sessions`` of every server (its runtime API); nginx: a reload,
        whose old worker closes what it still holds after ``shutdown_timeout_s``.
        """
        if self.kind == "haproxy":
            for backend in self.backends:
                self.admin(f"shutdown sessions server corral_fleet/{backend.id}")
        else:
            self.reload()

    def close(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGQUIT if self.kind == "nginx" else signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@contextlib.contextmanager
def fleet_behind(
    kind: Kind, target: str, count: int, workdir: Path, args: Sequence[str] = ()
) -> Iterator[tuple[ServerProcesses, FrontDoor]]:
    """``count`` servers of ``target`` behind a ``kind`` front door."""
    with (
        ServerProcesses(target, count, workdir, args) as servers,
        FrontDoor(kind, servers.backends(), workdir) as door,
    ):
        yield servers, door
