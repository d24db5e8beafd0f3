"""Inline fast sync environments: measured-fast calls run on the event loop's thread,
slow ones and ``blocking = True`` classes in the executor, under the step timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

from pydantic import Field
from tests.support.raw import RawPeer
from tests.support.servers import running

from corral.contract import Action, Environment, Observation, State
from corral.errors import ErrorCode
from corral.server.runner import EnvRunner, EnvThreads


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
