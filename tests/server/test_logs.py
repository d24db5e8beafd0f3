"""Readable server logs: the banner, the session access log, text and JSON formats."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.support.faultproxy import FaultProxy
from tests.support.servers import port_of

from corral.client import AsyncEnvClient, ReconnectPolicy
from corral.envs.echo import EchoAction, EchoEnv
from corral.server.logs import FIELDS, JsonFormatter, TextFormatter, banner, configure

BIN = Path(sys.executable).parent
ECHO = "corral.envs.echo:EchoEnv"


class Served:
    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def wait_for(self, needle: str, timeout: float = 30.0) -> list[str]:
        """The log's lines once one contains ``needle`` (bounded wait on the file)."""
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines()):
            assert time.monotonic() < deadline, f"{needle!r} not logged:\n{self.log.read_text()}"
            time.sleep(0.05)
        return self.lines()


@contextmanager
def corral_serve(tmp_path: Path, *args: str) -> Iterator[Served]:
    """``corral serve corral.envs.echo:EchoEnv ARGS`` with its stderr in a file."""
    port_file, log = tmp_path / "url", tmp_path / "server.log"
    port_file.unlink(missing_ok=True)
    with open(log, "wb") as err:
        server = subprocess.Popen(
            [BIN / "corral", "serve", ECHO, "--port", "0", "--port-file", str(port_file), *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "COLUMNS": "200"},
        )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "corral serve did not start"
            time.sleep(0.05)
        served = Served(port_file.read_text(), log)
        served.wait_for("corral serving")
        yield served
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


async def play(url: str) -> str:
    async with AsyncEnvClient(url, env=EchoEnv) as env:
        await env.reset(seed=1)
        await env.step(EchoAction(message="hi"))
        assert env.session_id is not None
        return env.session_id


async def test_text_logs_have_the_banner_and_one_line_per_session_event(tmp_path: Path) -> None:
    with corral_serve(tmp_path) as served:
        session = await play(served.url)
        lines = served.wait_for(f"session {session} closed")
    text = "\n".join(lines)
    assert f"corral serving echo (corral.envs.echo:EchoEnv) at {served.url}" in text
    for part in (
        "contract  1.0.0, fingerprint sha256:",
        "protocols corral/1 on /ws (msgpack, json); OpenEnv on /ws and HTTP",
        "limits    1024 sessions (1024 per connection, 896 per client), idle 600 s, step "
        "timeout 300 s",
        "auth      off",
        "web UI    off",
    ):
        assert part in text, part
    opened = next(line for line in lines if f"session {session} opened" in line)
    assert " INFO    corral.access  " in opened
    closed = next(line for line in lines if f"session {session} closed" in line)
    assert closed.endswith(f"session {session} closed: closed by the client (1 episodes, 1 steps)")
    # uvicorn's own start-up lines are left to --log-level debug.
    assert "Uvicorn running" not in text and "Started server process" not in text


async def test_json_logs_carry_the_session_as_a_field(tmp_path: Path) -> None:
    with corral_serve(tmp_path, "--log-format", "json", "--token-file", str(token(tmp_path))):
        pass  # started and stopped: the banner says auth is on
    records = [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines()]
    (started,) = [r for r in records if r.get("event") == "started"]
    assert started["auth"] is True and started["ui"] is None and started["env"] == "echo"
    assert started["limits"]["max_sessions"] == 1024 and started["codecs"] == ["msgpack", "json"]
    assert started["level"] == "info" and started["ts"].endswith("Z")
    assert "token" not in json.dumps(started["limits"])

    (tmp_path / "server.log").unlink()
    with corral_serve(tmp_path, "--log-format", "json") as served:
        session = await play(served.url)
        served.wait_for('"event": "closed"')
    records = [json.loads(line) for line in served.lines()]
    events = [(r["event"], r["session"]) for r in records if r["logger"] == "corral.access"]
    assert events == [("opened", session), ("closed", session)]
    closed = records[-1]  # nothing after the close: no per-connection transport lines
    assert closed["reason"] == "closed by the client", records
    assert (closed["episodes"], closed["steps"]) == (1, 1)


async def test_a_dropped_connection_logs_detached_then_resumed(tmp_path: Path) -> None:
    with corral_serve(tmp_path) as served:
        async with FaultProxy(port_of(served.url)) as proxy:
            fast = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.1, give_up_after_s=10)
            async with AsyncEnvClient(proxy.url, env=EchoEnv, reconnect=fast) as env:
                await env.reset(seed=1)
                session = env.session_id
                proxy.cut_all()
                await env.step(EchoAction(message="after the drop"))
                lines = served.wait_for(f"session {session} resumed")
    detached = next(line for line in lines if f"session {session} detached" in line)
    assert detached.endswith("connection lost, resumable for 30 s")
    assert lines.index(detached) < next(
        i for i, line in enumerate(lines) if f"session {session} resumed" in line
    )


def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret-token-for-the-logs-test\n")
    path.chmod(0o600)
    return path


def test_an_unknown_log_format_is_refused() -> None:
    run = subprocess.run(
        [BIN / "corral", "serve", ECHO, "--log-format", "xml"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert run.returncode == 2
    assert "'xml' is not a log format; use text or json" in run.stderr


def record(message: str, **fields: Any) -> logging.LogRecord:
    made = logging.LogRecord("corral.access", logging.INFO, __file__, 1, message, None, None)
    setattr(made, FIELDS, fields)
    return made


def test_formatters() -> None:
    line = TextFormatter().format(record("session abc closed: idle", session="abc", reason="idle"))
    assert line.endswith(" INFO    corral.access  session abc closed: idle")
    extra = TextFormatter().format(record("worker died", worker=3))
    assert extra.endswith("worker died  [worker=3]")
    data = json.loads(JsonFormatter().format(record("x", session="abc", episodes=2)))
    assert data["session"] == "abc" and data["episodes"] == 2 and data["logger"] == "corral.access"
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        failed = record("env raised")
        failed.exc_info = sys.exc_info()
    assert (
        "ZeroDivisionError: division by zero"
        in json.loads(JsonFormatter().format(failed))["traceback"]
    )


def test_banner_lines() -> None:
    lines = banner(
        url="http://0.0.0.0:8000",
        env={
            "name": "demo",
            "cls": "demo.env:DemoEnv",
            "contract_version": "2.0.0",
            "fingerprint": "sha256:" + "ab" * 32,
        },
        limits={
            "max_sessions": 8,
            "max_sessions_per_connection": 4,
            "max_sessions_per_client": 7,
            "idle_timeout_s": None,
            "step_timeout_s": 1.5,
            "resume_window_s": 30.0,
            "max_frame_bytes": 1024,
            "max_batch": 64,
        },
        auth=True,
        ui="/web",
        openenv=False,
        workers=2,
    )
    assert lines[0] == "corral serving demo (demo.env:DemoEnv) at http://0.0.0.0:8000"
    assert lines[2] == "  protocols corral/1 on /ws (msgpack, json)"
    assert "8 sessions (4 per connection, 7 per client), idle never, step timeout 1.5" in lines[3]
    assert "frames 1024 bytes, batches 64" in lines[3]
    assert lines[4:] == ["  auth      on (bearer token)", "  web UI    on at /web", "  workers   2"]


def test_configure_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        configure("xml")
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure("text", "loud", stream=io.StringIO())
