"""Environments with snapshots, for the snapshot tests (importable by worker processes).

:class:`TallyEnv` keeps a count, a random walk drawn from its own generator (so a restore
must carry the generator's state to continue exactly), bytes and an array; its actions
can make it misbehave on purpose: a slow or failing ``snapshot``/``restore``, or one that
returns the wrong model, or a snapshot too large for the server.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

from pydantic import Field

from corral.contract import Action, Environment, Observation, Snapshot, State
from corral.contract.arrays import Array


class TallyAction(Action):
    """``add`` to the count; the rest configure what the next snapshot/restore does."""

    add: int = 1
    snapshot_sleep: float = 0.0
    restore_sleep: float = 0.0
    restore_fails: bool = False
    wrong_model: bool = False
    pad: int = Field(default=0, ge=0)


class TallyObservation(Observation):
    count: int = 0
    walk: float = 0.0
    pid: int = 0
    thread: str = ""


class TallyState(State):
    count: int = 0


class TallySnapshot(Snapshot):
    count: int
    steps: int
    rng: list[Any]
    blob: bytes
    history: Array(dtype="int64", shape=(None,))  # type: ignore[valid-type]
    last: TallyObservation | None
    snapshot_sleep: float = 0.0
    restore_sleep: float = 0.0
    restore_fails: bool = False
    wrong_model: bool = False
    pad: str = ""


class TallyEnv(Environment[TallyAction, TallyObservation, TallyState]):
    """A count and a seeded random walk, snapshot-able (see the module docstring)."""

    name = "tally"
    report_where = False
    """Put the process and thread each call ran in into its observation."""

    def __init__(self) -> None:
        self.count = 0
        self.steps = 0
        self.rng = random.Random(0)
        self.history: list[int] = []
        self.last: TallyObservation | None = None
        self.action = TallyAction()

    def _where(self) -> dict[str, Any]:
        if not self.report_where:
            return {}
        return {"pid": os.getpid(), "thread": threading.current_thread().name}

    def _observe(self, reward: float | None = None, done: bool = False) -> TallyObservation:
        self.last = TallyObservation(
            count=self.count, walk=self.rng.random(), reward=reward, done=done, **self._where()
        )
        return self.last

    def reset(self, seed: int | None = None, **options: Any) -> TallyObservation:
        self.count, self.steps, self.history = 0, 0, []
        self.rng = random.Random(seed)
        return self._observe()

    def step(self, action: TallyAction) -> TallyObservation:
        self.action = action
        self.count += action.add
        self.steps += 1
        self.history.append(action.add)
        return self._observe(reward=float(action.add), done=self.count >= 100)

    def state(self) -> TallyState:
        return TallyState(count=self.count, step_count=self.steps)

    def snapshot(self) -> TallySnapshot:
        time.sleep(self.action.snapshot_sleep)
        return self._capture()

    def restore(self, snapshot: TallySnapshot) -> TallyObservation:
        time.sleep(snapshot.restore_sleep)
        return self._apply(snapshot)

    def _capture(self) -> TallySnapshot:
        action = self.action
        if action.wrong_model:
            return self.state()  # type: ignore[return-value]
        return TallySnapshot(
            count=self.count,
            steps=self.steps,
            rng=list(self.rng.getstate()),
            blob=bytes(range(256)),
            history=self.history,
            last=self.last,
            restore_sleep=action.restore_sleep,
            restore_fails=action.restore_fails,
            pad="x" * action.pad,
        )

    def _apply(self, snapshot: TallySnapshot) -> TallyObservation:
        if snapshot.restore_fails:
            raise RuntimeError("restore failed on purpose")
        if snapshot.blob != bytes(range(256)):
            raise ValueError("the bytes did not survive the wire")
        self.count, self.steps = snapshot.count, snapshot.steps
        version, internal, gauss = snapshot.rng
        self.rng.setstate((version, tuple(internal), gauss))
        self.history = [int(n) for n in snapshot.history]
        self.last = snapshot.last
        if self.last is None:
            return TallyObservation(**self._where())
        return self.last.model_copy(update=self._where())


class WhereTallyEnv(TallyEnv):
    """Says where each call ran."""

    report_where = True


class AffineTallyEnv(WhereTallyEnv):
    """Every call of a session on its own dedicated thread."""

    thread_affinity = True


class AsyncTallyEnv(TallyEnv):
    """``snapshot`` and ``restore`` are coroutines, awaited on the loop."""

    async def snapshot(self) -> TallySnapshot:  # type: ignore[override]
        await asyncio.sleep(self.action.snapshot_sleep)
        return self._capture()

    async def restore(self, snapshot: TallySnapshot) -> TallyObservation:  # type: ignore[override]
        await asyncio.sleep(snapshot.restore_sleep)
        return self._apply(snapshot)


class NoSnapshotEnv(Environment[TallyAction, TallyObservation, TallyState]):
    """The same contract without a snapshot."""

    name = "tally"

    def reset(self, seed: int | None = None, **options: Any) -> TallyObservation:
        return TallyObservation()

    def step(self, action: TallyAction) -> TallyObservation:
        return TallyObservation(count=action.add)

    def state(self) -> TallyState:
        return TallyState()


class ForgetfulTallyEnv(TallyEnv):
    """A broken snapshot: the random generator is not restored, so later steps differ."""

    def _apply(self, snapshot: TallySnapshot) -> TallyObservation:
        observation = super()._apply(snapshot)
        self.rng = random.Random(12345)
        return observation
