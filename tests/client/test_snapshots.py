"""The client's snapshot, restore and fork, async and sync, through the in-process
transport (the protocol and the server are the real ones; only the socket is not)."""

from __future__ import annotations

import pytest
from tests.support.snapshot_envs import TallyAction, TallyEnv

from corral.client import AsyncEnvClient, SyncEnvClient
from corral.errors import BadSnapshot, ClientClosed
from corral.protocol.snapshot import SessionSnapshot
from corral.testing import InProcessServer


async def test_fork_inherits_the_transport_and_the_models() -> None:
    async with InProcessServer(TallyEnv) as server, server.client() as env:
        await env.reset(seed=1)
        await env.step(TallyAction(add=4))
        forks = await env.fork(2)
        try:
            for fork in forks:
                assert isinstance(fork, AsyncEnvClient) and fork.url == env.url
                assert fork.observation_type is env.observation_type
                assert (await fork.state()).count == 4
            assert len({env.session_id, *(f.session_id for f in forks)}) == 3
            assert server.service.manager.active == 3
        finally:
            for fork in forks:
                await fork.close()
        assert server.service.manager.active == 1


async def test_restore_before_any_session_opens_only_the_restored_one() -> None:
    async with InProcessServer(TallyEnv) as server:
        async with server.client() as source:
            await source.reset(seed=2)
            await source.step(TallyAction(add=3))
            saved = await source.snapshot()
        target = server.client()
        try:
            result = await target.restore(saved)  # connects; opens nothing else
            assert result.observation.count == 3 and server.service.manager.active == 1
            assert target.session_id == next(iter(server.service.manager.sessions))
        finally:
            await target.close()
        with pytest.raises(ClientClosed):
            await target.restore(saved)


async def test_a_failed_restore_keeps_the_clients_session() -> None:
    async with InProcessServer(TallyEnv) as server, server.client() as env:
        await env.reset(seed=3)
        before = env.session_id
        saved = await env.snapshot()
        bad = SessionSnapshot.from_wire({**saved.to_wire(), "env": "other"})
        with pytest.raises(BadSnapshot):
            await env.restore(bad)
        assert env.session_id == before
        assert (await env.step(TallyAction(add=1))).observation.count == 1


def test_the_sync_twin() -> None:
    with InProcessServer(TallyEnv) as server, server.sync_client() as env:
        env.reset(seed=5)
        env.step(TallyAction(add=2))
        saved = env.snapshot()
        env.step(TallyAction(add=10))
        assert env.restore(saved).observation.count == 2
        forks = env.fork(2)
        try:
            assert all(isinstance(f, SyncEnvClient) for f in forks)
            assert [f.step(TallyAction(add=n)).observation.count for n, f in enumerate(forks)] == [
                2,
                3,
            ]
        finally:
            for fork in forks:
                fork.close()
