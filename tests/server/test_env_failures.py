"""An environment's exceptions: logged with where they happened, tracebacks sent only in
debug mode, and invalid actions that say what is wrong, through a real server."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest
from tests.support.envs import CountAction, CounterEnv
from tests.support.raw import RawPeer
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.client.local_server import LocalServer
from corral.errors import EnvError, ErrorCode, InvalidAction
from corral.protocol.session import Op
from corral.server.env_failures import TRACEBACK_LINES, bounded_traceback, env_failure
from corral.server.sessions import Session


async def test_an_env_exception_is_logged_with_session_episode_and_step(caplog):
    caplog.set_level(logging.ERROR, logger="corral.server")
    with running(CounterEnv) as server:
        async with AsyncEnvClient(server.url, env=CounterEnv) as env:
            await env.reset()
            await env.reset(limit=100)
            await env.step(CountAction(amount=1))
            await env.step(CountAction(amount=1))
            with pytest.raises(EnvError) as info:
                await env.step(CountAction(fail=True))
            session = env.session_id
    assert "traceback" not in info.value.details  # never by default
    assert "Remote traceback" not in str(info.value)
    assert str(info.value) == "[ENV_ERROR] RuntimeError: the env failed on purpose"
    [record] = [r for r in caplog.records if "environment raised" in r.getMessage()]
    text = record.getMessage()
    assert f"session {session}, episode 2, step 3" in text
    assert "Traceback (most recent call last)" in text and "in step" in text
    assert "RuntimeError: the env failed on purpose" in text
    assert (record.session, record.episode, record.step) == (session, 2, 3)  # type: ignore[attr-defined]


async def test_debug_sends_the_traceback_and_the_client_shows_it():
    with running(CounterEnv, debug=True) as server:
        async with AsyncEnvClient(server.url, env=CounterEnv) as env:
            await env.reset()
            with pytest.raises(EnvError) as info:
                await env.step(CountAction(fail=True))
    remote = info.value.details["traceback"]
    assert remote[0] == "Traceback (most recent call last):"
    assert '    raise RuntimeError("the env failed on purpose")' in remote
    assert remote[-1] == "RuntimeError: the env failed on purpose"
    shown = str(info.value)
    assert shown.startswith("[ENV_ERROR] RuntimeError: the env failed on purpose")
    assert "Remote traceback (on the server):\nTraceback" in shown


async def test_debug_tracebacks_in_batches_too():
    with running(CounterEnv, debug=True) as server:
        peer = await RawPeer.open(server.url)
        sid = await peer.open_session()
        await peer.request({"type": "reset", "session": sid})
        reply = await peer.request(
            {"type": "step_batch", "items": [{"session": sid, "action": {"fail": True}}]}
        )
        await peer.close()
    error = reply["results"][0]["error"]
    assert error["code"] == ErrorCode.ENV_ERROR
    assert any("in step" in line for line in error["details"]["traceback"])


def test_a_traceback_is_bounded_to_its_tail():
    text = "\n".join(f"line {i}" for i in range(200))
    cut = bounded_traceback(text)
    assert len(cut) == TRACEBACK_LINES and cut[-1] == "line 199"
    assert cut[0] == f"… {200 - TRACEBACK_LINES + 1} lines cut …"


def test_corral_errors_pass_as_they_are():
    session = Session.__new__(Session)
    error = InvalidAction("no")
    assert env_failure(error, Op.STEP, session, debug=True) is error
    assert "traceback" not in error.details


async def test_an_invalid_action_names_its_field_errors_in_the_message():
    with running(CounterEnv) as server:
        peer = await RawPeer.open(server.url)
        sid = await peer.open_session()
        await peer.request({"type": "reset", "session": sid})
        reply = await peer.request(
            {"type": "step", "session": sid, "action": {"amount": "many", "sleep": -1}}
        )
        await peer.close()
    assert reply["code"] == ErrorCode.INVALID_ACTION
    assert reply["message"] == (
        "invalid CountAction: amount: Input should be a valid integer, unable to parse "
        "string as an integer; sleep: Input should be greater than or equal to 0"
    )
    assert len(reply["details"]["errors"]) == 2


def test_a_validation_message_is_bounded():
    from pydantic import BaseModel, ValidationError

    from corral.errors import validation_message

    class Many(BaseModel):
        a: int
        b: int
        c: int
        d: int
        e: int

    with pytest.raises(ValidationError) as info:
        Many.model_validate({})
    message = validation_message("invalid Many", info.value)
    assert message == (
        "invalid Many: a: Field required; b: Field required; c: Field required; and 2 more error(s)"
    )
    with pytest.raises(ValidationError) as info:
        Many.model_validate({"a": "x" * 10_000, "b": 1, "c": 1, "d": 1, "e": 1})
    assert len(validation_message("invalid Many", info.value)) < 200


async def test_a_worker_process_env_exception_keeps_its_traceback():
    server = LocalServer(
        "tests.support.process_envs:PidEnv",
        server_args=["--workers", "1", "--debug"],
        startup_timeout=60,
    )
    await server.start()
    try:
        peer = await RawPeer.open(server.url)
        sid = await peer.open_session()
        await peer.request({"type": "reset", "session": sid})
        reply = await peer.request({"type": "step", "session": sid, "action": {"fail": True}})
        await peer.close()
    finally:
        server.stop_now()
    assert reply["code"] == ErrorCode.ENV_ERROR
    remote = reply["details"]["traceback"]
    assert remote[-1] == "ValueError: failed on purpose"
    # Issue 31.14: from the environment's frame on, in the worker too.
    assert "frames of corral's server before the environment's" in remote[1]
    assert "process_envs.py" in remote[2], remote
    assert not any("corral/server/" in line for line in remote), remote


class BlockingCounterEnv(CounterEnv):
    blocking = True  # every call in the executor's threads


class AsyncFailingEnv(CounterEnv):
    async def step(self, action: CountAction) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)  # suspends: finishes in a task of its own
        return super().step(action)


@pytest.mark.parametrize("env", [CounterEnv, BlockingCounterEnv, AsyncFailingEnv])
async def test_a_logged_traceback_starts_at_the_environments_frame(caplog, env):
    """Issue 31.14: the first frame of an env's traceback in the log is the env's own;
    the frames of corral's server that called it are counted in one line, not shown."""
    caplog.set_level(logging.ERROR, logger="corral.server")
    with running(env, debug=True) as server:
        async with AsyncEnvClient(server.url, env=CounterEnv) as client:
            await client.reset()
            with pytest.raises(EnvError) as info:
                await client.step(CountAction(fail=True))
    [record] = [r for r in caplog.records if "environment raised" in r.getMessage()]
    lines = record.getMessage().splitlines()
    start = lines.index("Traceback (most recent call last):")
    assert re.fullmatch(
        r"  \(\d+ frames of corral's server before the environment's\)", lines[start + 1]
    )
    first = lines[start + 2]
    assert first.startswith('  File "') and "tests/" in first, lines[start:]
    assert not any("corral/server/" in line for line in lines[start:]), lines[start:]
    # The client's copy (debug) is the same trimmed text.
    assert info.value.details["traceback"][1] == lines[start + 1]
