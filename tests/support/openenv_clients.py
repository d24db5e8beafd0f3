"""Typed OpenEnv clients, written the way OpenEnv's templates write them (for
``tests/integration/test_openenv_clients.py``, which imports them in its tests: importing
openenv imports gradio, seconds of CPU that every worker would spend collecting)."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoClient(EnvClient[EchoAction, EchoObservation, State]):
    """OpenEnv's typed client pattern; ``model_dump`` sends the base class's metadata={}."""

    def _step_payload(self, action: EchoAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EchoObservation]:
        observation = EchoObservation(
            **payload["observation"],
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata", {}),
        )
        return StepResult(observation, payload.get("reward"), payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


class WordleAction(Action):
    guess: str


class WordleObservation(Observation):
    guess: str = ""
    accepted: bool = False
    pattern: str = ""
    feedback: list[str] = []
    history: list[dict[str, Any]] = []
    guesses_left: int = 0
    turns_left: int | None = None
    message: str = ""
    secret: str | None = None


class WordleClient(EnvClient[WordleAction, WordleObservation, State]):
    def _step_payload(self, action: WordleAction) -> dict[str, Any]:
        return {"guess": action.guess}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[WordleObservation]:
        observation = WordleObservation(
            **payload["observation"], reward=payload.get("reward"), done=payload["done"]
        )
        return StepResult(observation, payload.get("reward"), payload["done"])

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)
