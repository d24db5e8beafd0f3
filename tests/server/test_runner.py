"""``run_calls`` on async environments: each waiting call's outcome is put on it by its
own task (values, exceptions, escapes, cancellation and the batch's one deadline)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

from corral.contract import Action, Environment, Observation, State
from corral.errors import EnvError, StepTimeout
from corral.server.runner import EnvCall, EnvRunner, EnvThreads, run_calls


class WaitAction(Action):
    wait: float = 0.0
    then: str = "answer"
    """What the call does after its wait: ``answer``, ``raise``, ``exit``, ``swallow``
    (its cancellation), ``yield`` (to the loop three times first)."""


class WaitObservation(Observation):
    waited: float = 0.0


class WaitEnv(Environment[WaitAction, WaitObservation, State]):
    """An async env whose step waits, then answers, raises or exits as told."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def reset(self, seed: int | None = None) -> WaitObservation:  # type: ignore[override]
        return WaitObservation()

    async def step(self, action: WaitAction) -> WaitObservation:  # type: ignore[override]
        if action.wait:
            try:
                await asyncio.sleep(action.wait)
            except asyncio.CancelledError:
                self.cancelled.set()
                if action.then == "swallow":  # answers anyway, after its deadline
                    return WaitObservation(waited=-1.0)
                raise
        if action.then == "yield":  # bare yields: the task must exist to go on
            for _ in range(3):
                await asyncio.sleep(0)
        if action.then == "raise":
            raise ValueError("told to")
        if action.then == "exit":
            raise SystemExit(3)
        return WaitObservation(waited=action.wait)

    def state(self) -> State:
        return State()


def calls_of(threads: EnvThreads, *actions: WaitAction) -> list[EnvCall]:
    return [
        EnvCall(EnvRunner(WaitEnv(), threads, own_executor=False), "step", (action,))
        for action in actions
    ]


async def test_waiting_and_immediate_calls_each_get_their_own_outcome():
    threads = EnvThreads(1)
    calls = calls_of(
        threads,
        WaitAction(),
        WaitAction(wait=0.01),
        WaitAction(wait=0.01, then="raise"),
        WaitAction(then="raise"),
        WaitAction(wait=0.01, then="exit"),
        WaitAction(then="exit"),
        WaitAction(then="yield"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "exception was never retrieved" either
        await run_calls(calls, threads, timeout=None)
        gc.collect()
    assert [c.value.waited if c.value is not None else None for c in calls] == [
        0.0,
        0.01,
        None,
        None,
        None,
        None,
        0.0,
    ]
    assert all(c.error is None for c in calls[:2])
    assert all(isinstance(c.error, ValueError) for c in calls[2:4])
    # SystemExit never leaves the loop: the call's error, as EnvError
    assert all(isinstance(c.error, EnvError) for c in calls[4:6])
    assert calls[6].error is None
    assert calls[1].seconds >= 0.01 and calls[0].seconds < calls[1].seconds
    threads.shutdown()


async def test_a_deadline_due_at_once_still_fails_the_waiting_calls():
    threads = EnvThreads(1)
    calls = calls_of(threads, WaitAction(wait=30.0), WaitAction())
    await run_calls(calls, threads, timeout=0.0)
    assert isinstance(calls[0].error, StepTimeout) and calls[1].value.waited == 0.0
    await asyncio.wait_for(calls[0].runner.env.cancelled.wait(), 10)
    threads.shutdown()


async def test_the_batch_deadline_fails_only_the_calls_still_waiting():
    threads = EnvThreads(1)
    calls = calls_of(
        threads,
        WaitAction(wait=0.01),
        WaitAction(wait=30.0),
        WaitAction(wait=30.0, then="swallow"),
    )
    await run_calls(calls, threads, timeout=0.3)
    assert calls[0].error is None and calls[0].value.waited == 0.01
    for call in calls[1:]:
        assert isinstance(call.error, StepTimeout) and call.seconds == 0.3
    envs: list[Any] = [call.runner.env for call in calls[1:]]
    await asyncio.wait_for(asyncio.gather(*(env.cancelled.wait() for env in envs)), 10)
    await asyncio.sleep(0)
    # The call that answered after its cancellation did so too late: still a timeout.
    assert isinstance(calls[2].error, StepTimeout) and calls[2].value is None
    threads.shutdown()


async def test_a_call_cancelled_by_its_own_env_leaves_the_batch_answerable():
    class SelfCancelling(WaitEnv):
        async def step(self, action: WaitAction) -> WaitObservation:  # type: ignore[override]
            await asyncio.sleep(action.wait)
            raise asyncio.CancelledError

    threads = EnvThreads(1)
    calls = [
        EnvCall(EnvRunner(SelfCancelling(), threads, own_executor=False), "step", (a,))
        for a in (WaitAction(wait=0.01), WaitAction())
    ]
    await asyncio.wait_for(run_calls(calls, threads, timeout=5.0), 10)
    assert all(c.value is None and c.error is None for c in calls)  # no outcome to give
    threads.shutdown()
