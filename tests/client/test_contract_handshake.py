"""A typed client whose models differ from the server's: the handshake diffs the two
contracts and refuses breaking differences (in process; what a raw peer sends, through a
real server)."""

from __future__ import annotations

import pytest
from pydantic import Field
from tests.support.raw import RawPeer
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.contract import Action, Environment, Observation, State
from corral.errors import ContractMismatch, ErrorCode
from corral.testing import InProcessServer


class Move(Action):
    n: int = Field(default=1, ge=0, le=5)


class WideMove(Action):
    n: int = Field(default=1, ge=0, le=10)


class Seen(Observation):
    value: int = 0


class SeenMore(Observation):
    value: int = 0
    distance: int  # a new required field: old clients cannot read it


class OldEnv(Environment[Move, Seen, State]):
    contract_version = "1.0.0"

    def reset(self, seed: int | None = None) -> Seen:
        return Seen()

    def step(self, action: Move) -> Seen:
        return Seen(value=action.n)

    def state(self) -> State:
        return State()


class BrokenEnv(Environment[Move, SeenMore, State]):
    """Same version as OldEnv, one breaking change: a required observation field."""

    contract_version = "1.0.0"

    def reset(self, seed: int | None = None) -> SeenMore:
        return SeenMore(distance=3)

    def step(self, action: Move) -> SeenMore:
        return SeenMore(value=action.n, distance=2)

    def state(self) -> State:
        return State()


class WiderEnv(Environment[WideMove, Seen, State]):
    """Same version as OldEnv, one compatible change: actions accept a wider range."""

    contract_version = "1.0.0"

    def reset(self, seed: int | None = None) -> Seen:
        return Seen()

    def step(self, action: WideMove) -> Seen:
        return Seen(value=action.n)

    def state(self) -> State:
        return State()


async def test_a_breaking_difference_is_refused_at_connect_naming_it():
    async with InProcessServer(BrokenEnv) as server:
        client = AsyncEnvClient(server.url, env=OldEnv, dialer=server.dialer)
        with pytest.raises(ContractMismatch) as info:
            await client.connect()
        await client.close()
    message = str(info.value)
    assert "1 breaking change(s): observation.distance" in message
    assert [c["path"] for c in info.value.details["breaking"]] == ["observation.distance"]


async def test_a_compatible_difference_passes():
    server = InProcessServer(WiderEnv)
    async with server, AsyncEnvClient(server.url, env=OldEnv, dialer=server.dialer) as client:
        await client.reset()
        result = await client.step(Move(n=5))
    assert result.observation.value == 5


async def test_a_client_without_schemas_is_judged_by_its_major_version():
    with running(BrokenEnv) as server:
        peer = await RawPeer.open(server.url, hello=False)
        reply = await peer.request(
            {
                "type": "hello",
                "protocol": "corral/1",
                "contract": {"version": "1.2.0", "fingerprint": "sha256:0000000000000000"},
            }
        )
        await peer.close()
    assert reply["type"] == "welcome" and reply["compat"] == "compatible"


async def test_unreadable_client_schemas_are_a_bad_message():
    with running(OldEnv) as server:
        peer = await RawPeer.open(server.url, hello=False)
        reply = await peer.request(
            {
                "type": "hello",
                "protocol": "corral/1",
                "contract": {"version": "1.0.0", "fingerprint": "x", "schemas": {"action": 3}},
            }
        )
        await peer.close()
    assert reply["code"] == ErrorCode.BAD_MESSAGE
