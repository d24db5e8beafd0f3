"""Real servers for the OpenEnv compatibility tests: child processes and ASGI apps in threads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from corral.blocking import run_blocking
from corral.client.local_server import LocalServer
from corral.server.serve import bind_socket

REPO = Path(__file__).resolve().parents[2]
PEER_APP = Path(__file__).with_name("openenv_peer_app.py")


@contextlib.contextmanager
def openenv_server(max_envs: int = 2, timeout: float = 60.0) -> Iterator[str]:
    """A real openenv-core server process (``CountEnv``); yields its base URL."""
    with tempfile.TemporaryDirectory(prefix="openenv-peer-") as tmp:
        url_file = Path(tmp) / "url"
        log = open(Path(tmp) / "log", "wb")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [sys.executable, str(PEER_APP), str(url_file), str(max_envs)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
        )
        log.close()
        try:
            deadline = time.monotonic() + timeout
            url = None
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"openenv server exited: {(Path(tmp) / 'log').read_text()[-2000:]}"
                    )
                if url is None and url_file.exists():
                    url = url_file.read_text().strip()
                if url is not None:
                    with contextlib.suppress(httpx.HTTPError):
                        if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                            break
                time.sleep(0.05)
            else:
                raise RuntimeError("openenv server did not become healthy")
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@contextlib.contextmanager
def corral_server(
    target: str, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``corral serve target`` in a child process (corral's LocalServer); yields its URL."""
    server = LocalServer(target, server_args=list(args), cwd=cwd or REPO, env=env)
    # The background loop works from sync tests and from inside a running loop alike.
    url = run_blocking(server.start(), 90.0)
    try:
        yield url
    finally:
        server.stop_now()


class AppThread:
    """Any ASGI app under uvicorn in a background thread, on a free 127.0.0.1 port."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("app thread did not start")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
