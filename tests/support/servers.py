"""Real corral servers on 127.0.0.1 for tests: uvicorn in a thread, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from corral.providers.guardian import start_time
from corral.server import ServerConfig, create_app
from corral.server.serve import bind_socket, build_server


class ThreadServer:
    """A uvicorn server for ``env`` running in a background thread."""

    def __init__(self, env: Any, **config: Any) -> None:
        self.app = create_app(env, ServerConfig(**config))
        self.service = self.app.state.service
        self.server = build_server(self.app, "warning")
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # A Runner closes the loop (and cancels leftover tasks) when the server stops; an
        # unclosed loop collected later by the GC raises an unraisable ValueError.
        with asyncio.Runner() as runner:
            self.loop = runner.get_loop()
            runner.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        return self

    def call(self, coro: Any, timeout: float = 10.0) -> Any:
        """Run a coroutine on the server's loop (to inspect or poke its state)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def manager(self) -> Any:
        return self.service.manager

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@contextlib.contextmanager
def running(env: Any, **config: Any) -> Iterator[ThreadServer]:
    """Serve ``env`` on a free 127.0.0.1 port for the duration of the block."""
    server = ThreadServer(env, **config).start()
    try:
        yield server
    finally:
        server.stop()


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout``; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def alive(pid: int) -> bool:
    """True while process ``pid`` exists (a zombie does not count)."""
    return start_time(pid) is not None


def wait_dead(pid: int, timeout: float = 60.0) -> bool:
    """Wait until process ``pid`` is gone, at most ``timeout`` seconds; True if it is."""
    return wait_until(lambda: not alive(pid), timeout, interval=0.05)


def port_of(url: str) -> int:
    """The port of an ``http://127.0.0.1:<port>`` URL."""
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])
