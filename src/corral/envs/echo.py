"""The smallest useful environment: it echoes the message back.

Used by the benchmarks and tests, and as the reference for wire compatibility (it has
the same shape as OpenEnv's echo env). The reward is ``0.1 * len(message)``; the episode
ends after ``max_steps`` steps (a truncation) or when the message is ``"bye"``. Its
sessions can be snapshotted and restored (:class:`EchoSnapshot`).
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import Field

from corral.contract import Action, Environment, Observation, Snapshot, State


class EchoAction(Action):
    """A message to echo."""

    message: str = Field(min_length=1, max_length=1_000_000)


class EchoObservation(Observation):
    """The echoed message and its length."""

    echoed_message: str = ""
    message_length: int = 0


class EchoState(State):
    """How many characters were echoed in this episode."""

    total_length: int = 0


class EchoSnapshot(Snapshot):
    """An echo session: its state, and what its last observation is made of (the seed
    its reset said, the message its last step echoed)."""

    state: EchoState
    seed: int | None = None
    message: str | None = None


class EchoEnv(Environment[EchoAction, EchoObservation, EchoState]):
    """Echo each message; ``"bye"`` terminates, ``max_steps`` truncates."""

    name = "echo"
    description = "Echoes each message back; reward 0.1 per character."
    contract_version = "1.0.0"

    def __init__(self, max_steps: int = 1_000_000) -> None:
        self.max_steps = max_steps
        self._state = EchoState()
        # Plain counters, written into the state when asked for: a validated
        # assignment costs a quarter of this env's step (OpenEnv's echo env, which the
        # benchmarks compare against, keeps it outside its state the same way).
        self._total_length = 0
        self._steps = 0
        # What the last observation was made of, for a snapshot: two references, not
        # the observation (sessions are kept small; it is rebuilt on restore).
        self._seed: int | None = None
        self._message: str | None = None

    def reset(self, seed: int | None = None, **options: Any) -> EchoObservation:
        episode_id = options.get("episode_id")
        self._state = EchoState(episode_id=str(episode_id or uuid.uuid4()))
        self._total_length = self._steps = 0
        self._seed, self._message = seed, None
        return self._ready(seed)

    def step(self, action: EchoAction) -> EchoObservation:
        self._steps += 1
        self._total_length += len(action.message)
        self._message = action.message
        return self._echo(action.message)

    @staticmethod
    def _ready(seed: int | None) -> EchoObservation:
        """The observation of a reset with ``seed``."""
        return EchoObservation(echoed_message="ready", metadata={"seed": seed})

    def _echo(self, message: str) -> EchoObservation:
        """The observation of a step that echoed ``message`` (the step counted)."""
        ended = self._steps >= self.max_steps
        return EchoObservation(
            echoed_message=message,
            message_length=len(message),
            reward=0.1 * len(message),
            done=message == "bye" or ended,
            truncated=message != "bye" and ended,
        )

    def state(self) -> EchoState:
        self._state.total_length = self._total_length
        self._state.step_count = self._steps
        return self._state

    def snapshot(self) -> EchoSnapshot:
        return EchoSnapshot(state=self.state().model_copy(), seed=self._seed, message=self._message)

    def restore(self, snapshot: EchoSnapshot) -> EchoObservation:
        self._state = snapshot.state.model_copy()
        self._total_length = self._state.total_length
        self._steps = self._state.step_count
        self._seed, self._message = snapshot.seed, snapshot.message
        if snapshot.message is not None:
            return self._echo(snapshot.message)
        if self._state.episode_id is None:  # never reset
            return EchoObservation()
        return self._ready(snapshot.seed)
