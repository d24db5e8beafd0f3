"""Proof, client side: corral's client drives a real openenv-core server.

The server is ``openenv.core.env_server.http_server.create_app`` serving an OpenEnv
environment (``tests.support.openenv_envs.CountEnv``) under uvicorn, in a child process.
It ignores corral's subprotocol, so the client falls back to the OpenEnv envelope.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.peers import openenv_server

from corral.client import AsyncEnvClient
from corral.client.openenv_connection import OpenEnvConnection
from corral.contract import Action, Observation, State
from corral.errors import (
    CapacityReached,
    ClientClosed,
    ConnectionLost,
    EnvError,
    InvalidAction,
    RequestTimeout,
    SessionLost,
    UnsupportedProtocol,
)
from corral.protocol import messages as m


class CountAction(Action):
    """The client's view of the action: no bounds, so the server's validation is exercised."""

    amount: int
    sleep: float = 0.0


class CountObservation(Observation):
    total: int = 0
    note: str = ""


class CountState(State):
    total: int = 0


TYPES: dict[str, Any] = {
    "action_type": CountAction,
    "observation_type": CountObservation,
    "state_type": CountState,
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with openenv_server(max_envs=2) as base:
        yield base


async def test_typed_episode_over_the_openenv_envelope(url):
    async with AsyncEnvClient(url, **TYPES) as env:
        assert env.server_info["protocol"] == "openenv"
        assert isinstance(env.connection, OpenEnvConnection)
        first = await env.reset(seed=3, episode_id="ep-3", start=1)
        assert isinstance(first.observation, CountObservation)
        assert (first.observation.total, first.observation.note) == (1, "seed=3")
        result = await env.step(CountAction(amount=4))
        assert result.reward == 4.0 and result.observation.total == 5 and not result.done
        with pytest.raises(InvalidAction) as info:  # the server's bounds
            await env.step({"amount": 500})
        assert info.value.details["openenv_code"] == "VALIDATION_ERROR"
        assert info.value.details["errors"][0]["loc"] == ["amount"]
        with pytest.raises(EnvError, match="seven is not allowed"):
            await env.step({"amount": 7})
        result = await env.step({"amount": 5})
        assert result.terminated and result.observation.total == 10
        state = await env.state()
        assert isinstance(state, CountState)
        assert (state.episode_id, state.step_count, state.total) == ("ep-3", 2, 10)


async def test_a_custom_validator_error_ends_an_openenv_session(url):
    # openenv-core cannot serialize the ValueError inside the validation error, so it
    # answers SESSION_ERROR and closes: the client reports the session as lost.
    # (A corral server answers VALIDATION_ERROR and keeps the session; see
    # tests/server/test_openenv_ws.py.)
    async with AsyncEnvClient(url, **TYPES) as env:
        await env.reset()
        with pytest.raises(SessionLost, match="serialize"):
            await env.step({"amount": 13})
        with pytest.raises(ConnectionLost, match="ended the session"):
            await env.state()


def test_sync_twin(url):
    with AsyncEnvClient(url, **TYPES).sync() as env:
        assert env.reset(start=2).observation.total == 2
        assert env.step(CountAction(amount=3)).observation.total == 5
        assert env.state().total == 5
        with pytest.raises(EnvError):
            env.step({"amount": 7})
        assert env.step({"amount": 1}).observation.total == 6


async def test_models_from_the_servers_schema(url):
    async with AsyncEnvClient(url) as env:
        result = await env.reset(start=4)
        assert result.observation.total == 4  # type: ignore[attr-defined]
        result = await env.step({"amount": 2})
        assert result.observation.total == 6 and result.reward == 2.0  # type: ignore[attr-defined]
        with pytest.raises(InvalidAction):  # validated locally, from the server's schema
            await env.step({"amount": -1})


async def test_a_full_openenv_server_is_capacity_reached(url):
    holders = [AsyncEnvClient(url, **TYPES) for _ in range(2)]
    try:
        for holder in holders:
            await holder.connect()
        refused = AsyncEnvClient(url, **TYPES)
        with pytest.raises(CapacityReached) as info:
            await refused.connect()
        assert info.value.details["max_sessions"] == 2
        await refused.close()
    finally:
        for holder in holders:
            await holder.close()
    async with AsyncEnvClient(url, **TYPES) as env:  # slots are free again
        assert (await env.reset()).observation.total == 0


async def test_a_timeout_closes_the_connection_rather_than_desynchronizing(url):
    async with AsyncEnvClient(url, timeout=0.3, **TYPES) as env:
        await env.reset()
        with pytest.raises(RequestTimeout, match="connection was closed"):
            await env.step({"amount": 1, "sleep": 1.0})
        with pytest.raises(ConnectionLost, match="earlier 'step' timed out"):
            await env.state()


async def test_fallback_can_be_refused(url):
    env = AsyncEnvClient(url, openenv_fallback=False, **TYPES)
    with pytest.raises(UnsupportedProtocol, match="did not accept subprotocol"):
        await env.connect()
    await env.close()


async def test_requests_without_an_openenv_form(url):
    connection = OpenEnvConnection(url, settle_s=2.0)
    welcome = await connection.connect()
    assert welcome["protocol"] == "openenv" and "schemas" not in welcome
    opened = await connection.request(m.Open(connection.next_id()), timeout=5)
    assert opened.session == connection.session
    with pytest.raises(UnsupportedProtocol, match="attach"):
        await connection.request(m.Attach(connection.next_id(), "s", "t"), timeout=5)
    closed = await connection.request(m.Close(connection.next_id(), "s"), timeout=5)
    assert closed.type == "closed"
    await connection.close()
    with pytest.raises(ClientClosed):
        await connection.request(m.GetState(connection.next_id(), "s"), timeout=5)


async def test_snapshots_are_refused_client_side_over_the_openenv_envelope(url):
    from corral.errors import SnapshotUnsupported
    from corral.protocol.position import Phase, Position
    from corral.protocol.snapshot import SessionSnapshot

    saved = SessionSnapshot("count", "1.0.0", "sha256:0", Position(Phase.NEW, 0, 0, 0), {}, 0.0)
    async with AsyncEnvClient(url, **TYPES) as env:
        await env.reset()
        with pytest.raises(SnapshotUnsupported, match="not available over the OpenEnv envelope"):
            await env.snapshot()
        with pytest.raises(SnapshotUnsupported, match="not available over the OpenEnv envelope"):
            await env.restore(saved)
        with pytest.raises(SnapshotUnsupported, match="cannot fork this session"):
            await env.fork(2)
        assert (await env.step(CountAction(amount=2))).observation.total == 2  # still usable
