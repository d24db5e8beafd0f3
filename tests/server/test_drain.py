"""Graceful drain on SIGTERM: ``/ready`` answers 503, open sessions finish, then it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from tests.support.rawws import RawSocket
from tests.support.servers import port_of

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction
from corral.server.serve import DRAIN_ENV, drain_seconds


@pytest.fixture
def served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``corral serve`` of the echo env with the drain deadline of the test's parameter."""
    port_file = tmp_path / "url"
    env = {**os.environ, DRAIN_ENV: str(request.param)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "corral.envs.echo:EchoEnv",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield process, port_file.read_text().strip()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


def _ready_status(url: str) -> int:
    return httpx.get(f"{url}/ready", timeout=5, trust_env=False).status_code


def _wait_for_status(url: str, status: int) -> None:
    deadline = time.monotonic() + 30
    while _ready_status(url) != status:
        assert time.monotonic() < deadline, f"/ready never answered {status}"
        time.sleep(0.05)


@pytest.mark.parametrize("served", [60], indirect=True)
async def test_sigterm_drains_open_sessions_then_stops(
    served: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = served
    async with AsyncEnvClient(url) as env:
        await env.reset()
        assert _ready_status(url) == 200
        process.send_signal(signal.SIGTERM)
        _wait_for_status(url, 503)
        # New connections are refused at the handshake, saying why (clients go elsewhere)...
        status, _, body = RawSocket(port_of(url)).upgrade()
        assert status == 503 and orjson.loads(body)["code"] == "NOT_READY", body
        assert "draining" in orjson.loads(body)["details"]["reason"]
        # ...while the open session is still served.
        result = await env.step(EchoAction(message="still here"))
        assert result.observation.echoed_message == "still here"
        assert process.poll() is None
    # The last session closed: the server stops long before its 60 s deadline.
    assert process.wait(30) == -signal.SIGTERM


@pytest.mark.parametrize("served", [0.5], indirect=True)
async def test_the_drain_deadline_stops_a_server_whose_sessions_stay(
    served: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = served
    async with AsyncEnvClient(url) as env:
        await env.reset()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == -signal.SIGTERM


@pytest.mark.parametrize("served", [60], indirect=True)
async def test_a_second_sigterm_stops_at_once(
    served: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = served
    async with AsyncEnvClient(url) as env:
        await env.reset()
        process.send_signal(signal.SIGTERM)
        _wait_for_status(url, 503)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == -signal.SIGTERM


def test_drain_seconds_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DRAIN_ENV, raising=False)
    assert drain_seconds() is None
    assert drain_seconds(12) == 12
    monkeypatch.setenv(DRAIN_ENV, "30")
    assert drain_seconds() == 30
    monkeypatch.setenv(DRAIN_ENV, "0")
    assert drain_seconds() is None
    monkeypatch.setenv(DRAIN_ENV, "soon")
    with pytest.raises(ValueError, match="CORRAL_DRAIN_SECONDS must be a number"):
        drain_seconds()
    with pytest.raises(ValueError, match=">= 0"):
        drain_seconds(-1)
