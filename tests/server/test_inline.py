"""Inline fast sync environments: measured-fast calls run on the event loop's thread,
slow ones and ``blocking = True`` classes in the executor, under the step timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pydantic import Field
from tests.support.raw import RawPeer
from tests.support.servers import running

from corral.contract import Action, Environment, Observation, State
from corral.errors import EnvError, ErrorCode
from corral.server import runner as runner_module
from corral.server.runner import (
    MAX_INLINE_S,
    EnvCall,
    EnvRunner,
    EnvThreads,
    _Preemption,
    run_calls,
    run_inline,
)


class ProbeAction(Action):
    sleep: float = Field(default=0.0, ge=0, le=10)


class ProbeObservation(Observation):
    thread: int = 0


class ProbeEnv(Environment[ProbeAction, ProbeObservation, State]):
    """Reports the thread each call ran on."""

    def reset(self, seed: int | None = None) -> ProbeObservation:
        return ProbeObservation(thread=threading.get_ident())

    def step(self, action: ProbeAction) -> ProbeObservation:
        if action.sleep:
            time.sleep(action.sleep)
        return ProbeObservation(thread=threading.get_ident())

    def state(self) -> State:
        return State()


class BlockingProbeEnv(ProbeEnv):
    blocking = True


BOUND = 0.05
"""A bound far above a probe step's time, so that a busy machine never blurs the line."""


async def step_replies(url: str, steps: list[dict[str, Any]]) -> list[Any]:
    peer = await RawPeer.open(url)
    try:
        session = await peer.open_session()
        await peer.request({"type": "reset", "session": session})
        replies = [
            await peer.request({"type": "step", "session": session, "action": action})
            for action in steps
        ]
        return replies
    finally:
        await peer.close()


def loop_thread(server: Any) -> int:
    return int(server.thread.ident)


async def test_a_fast_sync_env_runs_on_the_loop_after_its_first_call():
    with running(ProbeEnv, inline_step_s=BOUND) as server:
        replies = await step_replies(server.url, [{}] * 5)
        threads = [r["observation"]["thread"] for r in replies]
        # reset measured the env; steps measure their own method first, then run inline.
        assert threads[0] != loop_thread(server)
        assert threads[1:] == [loop_thread(server)] * 4


async def test_a_slow_call_moves_the_env_off_the_loop_and_the_timeout_holds():
    with running(ProbeEnv, step_timeout_s=2.0, inline_step_s=BOUND) as server:
        replies = await step_replies(server.url, [{}, {}, {"sleep": 1.0}, {}, {"sleep": 5}])
        threads = [r.get("observation", {}).get("thread") for r in replies]
        assert threads[1] == loop_thread(server)  # fast: inline
        assert threads[2] == loop_thread(server)  # still inline (it was fast until now)
        assert threads[3] != loop_thread(server)  # 1 s lifted the average: executor
        assert replies[4]["code"] == ErrorCode.STEP_TIMEOUT  # off the loop: timed out


async def test_blocking_envs_and_a_zero_bound_never_run_inline():
    for env, bound in ((BlockingProbeEnv, BOUND), (ProbeEnv, 0)):
        with running(env, inline_step_s=bound) as server:
            replies = await step_replies(server.url, [{}] * 5)
            assert loop_thread(server) not in {r["observation"]["thread"] for r in replies}


def test_the_moving_average():
    runner = EnvRunner(ProbeEnv(), EnvThreads(1), own_executor=False, inline_s=100e-6)
    assert not runner.inline("step")  # unmeasured: executor first
    runner.observe("step", 10e-6)
    assert runner.inline("step")
    runner.observe("step", 5e-3)  # one slow call moves it off the loop
    assert not runner.inline("step")
    for _ in range(30):
        runner.observe("step", 10e-6)
    assert runner.inline("step")  # and fast calls bring it back
    affine = EnvRunner(ProbeEnv(), EnvThreads(1), own_executor=True)
    affine.observe("step", 1e-6)
    assert not affine.inline("step")  # thread affinity: its own thread, always


async def test_batch_items_of_fast_envs_run_inline_and_are_counted():
    with running(ProbeEnv, inline_step_s=BOUND) as server:
        peer = await RawPeer.open(server.url)
        try:
            sids = [await peer.open_session() for _ in range(3)]
            await peer.request({"type": "reset_batch", "items": [{"session": s} for s in sids]})

            def batch(sessions: list[str], action: dict[str, Any]) -> dict[str, Any]:
                items = [{"session": s, "action": action} for s in sessions]
                return {"type": "step_batch", "items": items}

            await peer.request(batch(sids, {}))  # measures each session's step
            reply = await peer.request(batch(sids, {}))
            threads = {r["observation"]["thread"] for r in reply["results"]}
            assert threads == {loop_thread(server)}
            await peer.request(batch(sids[:1], {"sleep": 1.0}))  # lifts session 0's average
            reply = await peer.request(batch(sids, {}))
            threads = [r["observation"]["thread"] for r in reply["results"]]
            assert threads[0] != loop_thread(server)
            assert threads[1:] == [loop_thread(server)] * 2
            stats = server.manager.stats
            assert stats.steps == 10 and stats.resets == 3
            assert stats.latency["step"].observations == 10
        finally:
            await peer.close()


class RaisingEnv(ProbeEnv):
    def step(self, action: ProbeAction) -> ProbeObservation:
        if action.sleep:
            raise SystemExit(3)
        raise ValueError("boom")


def test_run_inline_runs_measured_calls_and_keeps_their_failures():
    threads = EnvThreads(1)
    fast = EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=BOUND)
    raising = EnvRunner(RaisingEnv(), threads, own_executor=False, inline_s=BOUND)
    unmeasured = EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=BOUND)
    for runner in (fast, raising):
        runner.observe("step", 1e-6)
    calls = [
        EnvCall(fast, "step", (ProbeAction(),)),
        EnvCall(raising, "step", (ProbeAction(),)),
        EnvCall(raising, "step", (ProbeAction(sleep=1),)),
        EnvCall(unmeasured, "step", (ProbeAction(),)),
    ]
    rest = run_inline(calls)
    assert rest == [calls[3]] and calls[3].value is None and calls[3].error is None
    assert calls[0].value.thread == threading.get_ident() and calls[0].error is None
    assert isinstance(calls[1].error, ValueError)
    assert isinstance(calls[2].error, EnvError)  # SystemExit must not stop the server
    assert all(call.seconds > 0 for call in calls[:3])
    threads.shutdown()


def test_a_slow_call_counts_its_wall_time_unless_the_os_preempted_it():
    preemption = _Preemption()
    time.sleep(0.05)  # a voluntary switch: blocked, so the wall time counts
    assert preemption.cost(0.05) == 0.05
    started = time.thread_time()
    while time.thread_time() - started < 0.02:  # pure CPU: counted either way
        pass
    assert preemption.cost(0.02) >= 0.02 * 0.9


def burn(seconds: float) -> float:
    """Spend ``seconds`` of this thread's CPU time; return what it measured."""
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass
    return time.thread_time() - started


def test_a_preempted_call_is_not_charged_the_fast_calls_before_it(monkeypatch):
    # The OS preempts this call (an involuntary switch, no voluntary one): its cost is
    # the CPU time since the batch began less the fast calls measured before it.
    switches = iter([(0, 0), (0, 1)])
    monkeypatch.setattr(_Preemption, "_switches", staticmethod(lambda: next(switches)))
    preemption = _Preemption()
    preemption.before += burn(0.03)  # fast calls: their wall time is their CPU time
    own = burn(0.01)
    cost = preemption.cost(0.5)  # half a second of wall time, most of it preempted
    assert own <= cost < own + 0.01
    assert preemption.before == 0  # the next call counts from here


class _Preempted:
    """Every slow call reads as one the OS preempted, costing ``CPU_S`` of CPU time."""

    CPU_S = 1e-6
    asked: list[float] = []

    def __init__(self) -> None:
        self.before = 0.0

    def cost(self, seconds: float) -> float:
        self.asked.append(seconds)
        return self.CPU_S


@pytest.fixture
def preempted(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The wall times of the slow calls whose cost was asked (each counted as CPU_S)."""
    asked: list[float] = []
    monkeypatch.setattr(_Preempted, "asked", asked)
    monkeypatch.setattr(runner_module, "_Preemption", _Preempted)
    return asked


async def test_a_preempted_call_in_a_worker_thread_counts_its_cpu_time(preempted):
    # Off the loop a method is measured in the worker thread: a call the OS preempted
    # there must not read as slow either, or one spike keeps the method off the loop.
    threads = EnvThreads(2)
    alone = EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=BOUND)
    await alone.call("step", ProbeAction(sleep=2 * BOUND), timeout=None)  # unmeasured: a hop
    assert alone.ewma["step"] == _Preempted.CPU_S and alone.inline("step")
    batched = [EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=BOUND) for _ in "ab"]
    calls = [EnvCall(r, "step", (ProbeAction(sleep=2 * BOUND),)) for r in batched]
    await run_calls(calls, threads, timeout=5.0)  # one executor job for the batch
    assert all(r.ewma["step"] == _Preempted.CPU_S for r in batched)
    assert all(call.seconds >= 2 * BOUND for call in calls)  # the wall time, for the stats
    assert len(preempted) == 3 and min(preempted) >= 2 * BOUND
    threads.shutdown()


async def test_fast_calls_and_never_inline_runners_are_not_asked_about_preemption(preempted):
    threads = EnvThreads(1)
    fast = EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=BOUND)
    await fast.call("step", ProbeAction(), timeout=None)
    blocking = EnvRunner(BlockingProbeEnv(), threads, own_executor=False, inline_s=BOUND)
    await blocking.call("step", ProbeAction(sleep=2 * BOUND), timeout=None)
    assert preempted == []
    assert fast.ewma["step"] < BOUND and blocking.ewma["step"] >= 2 * BOUND
    threads.shutdown()


def test_a_call_cheaper_than_a_hop_runs_inline_over_its_bound():
    threads = EnvThreads(1)
    runner = EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=100e-6)
    runner.observe("step", 300e-6)
    assert not runner.inline("step")  # over the bound, and no hop measured yet
    for _ in range(30):
        threads.observe_hop(500e-6)  # a loaded machine's hop
    assert runner.inline("step")
    runner.observe("step", 2 * MAX_INLINE_S)
    assert not runner.inline("step")  # never past the cap, however dear the hop
    for blocking in (True, False):  # never inline: blocking, or its own thread
        never = EnvRunner(
            BlockingProbeEnv() if blocking else ProbeEnv(),
            threads,
            own_executor=not blocking,
            inline_s=100e-6,
        )
        never.observe("step", 1e-6)
        assert not never.inline("step")
    threads.shutdown()


async def test_hops_through_the_shared_pool_are_measured_beyond_the_calls_own_time():
    threads = EnvThreads(2)
    alone = EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=BOUND)
    await alone.call("step", ProbeAction(sleep=0.05), timeout=None)  # unmeasured: a hop
    # The sleep is the call's own time, not the hop's: counted, the first observation
    # (a fifth of it, from 0) would be 10 ms at least.
    assert 0 < threads.hop_s < 0.01
    threads.hop_s = 0.0
    batched = [EnvRunner(ProbeEnv(), threads, own_executor=False, inline_s=BOUND) for _ in "ab"]
    calls = [EnvCall(r, "step", (ProbeAction(sleep=0.05),)) for r in batched]
    await run_calls(calls, threads, timeout=5.0)  # one executor job: 100 ms of calls
    assert 0 < threads.hop_s < 0.02
    threads.shutdown()
