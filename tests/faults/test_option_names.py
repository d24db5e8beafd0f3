"""Issue 30.12: a reset option is the environment's, whatever its name.

The runner takes an environment call's keywords as one mapping, never as its own
keywords, so options named like the runner's parameters (``method``, ``timeout``, ``kwargs``)
reach an environment that takes them, and are ``INVALID_ARGUMENT`` for one that does not;
only ``reset``'s own parameters (``self``, ``seed``) cannot be options. Through a real
server on 127.0.0.1: corral/1 single resets and batch items on both codecs, and HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.support.envs import CounterEnv
from tests.support.raw import RawPeer
from tests.support.servers import ThreadServer, running

from corral.contract import Action, Environment, Observation, State
from corral.errors import ErrorCode

RUNNER_NAMES = ["method", "timeout", "kwargs", "args", "fn"]
"""Names the runner's and its helpers' own parameters have (or had)."""


class OptionsObservation(Observation):
    options: dict[str, Any] = {}


class AnyOptionsEnv(Environment[Action, OptionsObservation, State]):
    """Takes any reset option and shows what it got."""

    def reset(self, seed: int | None = None, **options: Any) -> OptionsObservation:
        return OptionsObservation(options=options)

    def step(self, action: Action) -> OptionsObservation:
        return OptionsObservation()

    @property
    def state(self) -> State:
        return State()


@pytest.fixture(scope="module")
def any_options() -> Iterator[ThreadServer]:
    with running(AnyOptionsEnv) as server:
        yield server


@pytest.fixture(scope="module")
def named_options() -> Iterator[ThreadServer]:
    with running(CounterEnv) as server:  # reset(seed, limit, label)
        yield server


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_options_named_like_the_runners_parameters_reach_the_env(
    any_options: ThreadServer, codec: str
) -> None:
    peer = await RawPeer.open(any_options.url, codec)
    try:
        session = await peer.open_session()
        options = {name: f"the env's {name}" for name in RUNNER_NAMES}
        reply = await peer.request({"type": "reset", "session": session, "options": options})
        assert reply["type"] == "result", reply
        assert reply["observation"]["options"] == options
        batch = await peer.request(
            {"type": "reset_batch", "items": [{"session": session, "options": {"method": 1}}]}
        )
        assert batch["results"][0]["observation"]["options"] == {"method": 1}, batch
    finally:
        await peer.close()
    reply = httpx.post(f"{any_options.url}/reset", json={"method": "m", "timeout": 3}, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["observation"]["options"] == {"method": "m", "timeout": 3}


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_reset_parameters_and_unknown_names_are_invalid_argument(
    any_options: ThreadServer, named_options: ThreadServer, codec: str
) -> None:
    cases = [(any_options, {"self": 1}), (any_options, {"seed": 2})]
    cases += [(named_options, {name: 1}) for name in RUNNER_NAMES]
    for server, options in cases:
        peer = await RawPeer.open(server.url, codec)
        try:
            session = await peer.open_session()
            reply = await peer.request({"type": "reset", "session": session, "options": options})
            assert reply["code"] == ErrorCode.INVALID_ARGUMENT, (options, reply)
            # Refused before the environment ran: the session is free and resets.
            reply = await peer.request({"type": "reset", "session": session})
            assert reply["type"] == "result", reply
        finally:
            await peer.close()
    reply = httpx.post(f"{named_options.url}/reset", json={"method": "m"}, timeout=30)
    assert reply.status_code == 422 and reply.json()["code"] == ErrorCode.INVALID_ARGUMENT
