"""Reconnect and resume through a fault proxy: no step lost, none applied twice.

A real server process runs ``RecordingEnv``, which appends every applied step's sequence
number to its state; the clients reach it through :class:`FaultProxy`. At the end each
session's server-side record must be exactly ``0, 1, ..., n-1``: a lost step leaves a
gap, a step applied twice a repeat, a misrouted reply a wrong ``seq`` in its observation.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import pytest
from tests.faults.envs import RecAction, RecordingEnv
from tests.support.faultproxy import DOWN, UP, Act, FaultProxy, RandomCuts
from tests.support.servers import port_of

from corral.client import AsyncEnvClient, ReconnectPolicy
from corral.errors import RequestTimeout

FAST = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.25, give_up_after_s=20)


def client(url: str, **kwargs: object) -> AsyncEnvClient[RecAction, object, object]:
    kwargs.setdefault("reconnect", FAST)
    kwargs.setdefault("timeout", 30.0)
    return AsyncEnvClient(url, env=RecordingEnv, **kwargs)  # type: ignore[arg-type]


def audit(applied: list[int], expected: int) -> dict[str, int]:
    """Lost, duplicated and out-of-order steps in one session's server-side record."""
    seen = set(applied)
    return {
        "lost": sum(1 for seq in range(expected) if seq not in seen),
        "duplicated": len(applied) - len(seen),
        "out_of_order": sum(1 for a, b in itertools.pairwise(applied) if b < a),
    }


async def test_ten_thousand_steps_through_random_cuts(recording_server, scale, figures):
    proxy = await FaultProxy(port_of(recording_server.url), seed=11).start()
    policy = RandomCuts(scale.cut_every, random.Random(12))
    clients = [client(proxy.url) for _ in range(scale.sessions)]
    per_session = scale.steps // scale.sessions
    misrouted = 0
    try:
        async with asyncio.timeout(300 if scale.long else 90):
            await asyncio.gather(*(c.reset() for c in clients))
            proxy.policy = policy

            async def drive(c: AsyncEnvClient) -> None:
                nonlocal misrouted
                for seq in range(per_session):
                    result = await c.step(RecAction(seq=seq))
                    if result.observation.seq != seq or result.observation.applied != seq + 1:
                        misrouted += 1

            started = time.monotonic()
            await asyncio.gather(*(drive(c) for c in clients))
            elapsed = time.monotonic() - started
            policy.enabled = False
            states = await asyncio.gather(*(c.state() for c in clients))
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        await proxy.close()
    totals = {"lost": 0, "duplicated": 0, "out_of_order": 0}
    for state in states:
        for key, value in audit(state.applied, per_session).items():
            totals[key] += value
    figures["steps"] = per_session * len(clients)
    figures["sessions"] = len(clients)
    figures["faults_injected"] = sum(policy.kinds.values())
    figures["fault_kinds"] = dict(policy.kinds)
    figures["reconnects"] = sum(c.connection.reconnects for c in clients)
    figures["requests_resent"] = sum(c.connection.resent for c in clients)
    figures["misrouted_replies"] = misrouted
    figures["seconds"] = round(elapsed, 1)
    figures.data.update(totals)
    assert totals == {"lost": 0, "duplicated": 0, "out_of_order": 0}
    assert misrouted == 0
    assert sum(policy.kinds.values()) >= scale.steps // scale.cut_every // 2
    assert figures.data["reconnects"] >= figures.data["faults_injected"] // 2


@pytest.mark.parametrize(
    ("direction", "act"),
    [
        (UP, Act.CUT_BEFORE),
        (UP, Act.TRUNCATE),
        (UP, Act.CUT_AFTER),
        (DOWN, Act.CUT_BEFORE),
        (DOWN, Act.TRUNCATE),
    ],
    ids=["request-lost", "request-truncated", "reply-lost-after-send", "reply-lost", "reply-cut"],
)
async def test_each_kind_of_cut_applies_the_step_once(recording_server, direction, act):
    async with FaultProxy(port_of(recording_server.url), seed=1) as proxy:
        c = client(proxy.url)
        await c.reset()
        assert (await c.step(RecAction(seq=0))).observation.applied == 1
        (link,) = proxy.links
        link.arm(direction, act)
        result = await c.step(RecAction(seq=1))
        assert (result.observation.seq, result.observation.applied) == (1, 2)
        assert (await c.state()).applied == [0, 1]
        assert c.connection.reconnects == 1
        await c.close()


async def test_cut_while_the_step_runs(recording_server):
    """The re-sent request of a step still running is not run again; its reply comes."""
    async with FaultProxy(port_of(recording_server.url)) as proxy:
        c = client(proxy.url)
        await c.reset()
        step = asyncio.ensure_future(c.step(RecAction(seq=0, sleep=0.6)))
        await asyncio.sleep(0.2)
        assert proxy.cut_all() == 1
        result = await step
        assert (result.observation.seq, result.observation.applied) == (0, 1)
        assert (await c.state()).applied == [0]
        assert c.connection.resent == 1
        await c.close()


async def test_requests_made_while_disconnected_wait_for_the_reconnect(recording_server):
    async with FaultProxy(port_of(recording_server.url)) as proxy:
        c = client(proxy.url)
        await c.reset()
        live = proxy.target_port
        proxy.target_port = 9  # nothing listens there: reconnect attempts fail for a while
        proxy.cut_all()
        step = asyncio.ensure_future(c.step(RecAction(seq=0)))
        await asyncio.sleep(0.5)
        assert not step.done() and c.connection.reconnecting
        proxy.target_port = live
        result = await asyncio.wait_for(step, 10)
        assert result.observation.applied == 1
        assert proxy.stats["refused"] >= 1
        await c.close()


async def test_a_delayed_reply_never_answers_the_next_request(recording_server):
    async with FaultProxy(port_of(recording_server.url)) as proxy:
        c = client(proxy.url)
        await c.reset()
        proxy.delay_s = 0.15
        c.timeout = 0.1
        with pytest.raises(RequestTimeout):
            await c.step(RecAction(seq=0))
        c.timeout = 10.0
        result = await c.step(RecAction(seq=1))
        # The late reply (seq 0) arrived meanwhile and was dropped, not taken for this one.
        assert result.observation.seq == 1
        proxy.delay_s = 0.0
        assert (await c.state()).applied == [0, 1]
        await c.close()
