"""The base contract models: Action, Observation, State, StepResult."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from tests.strategies import CONTRACT_SETTINGS, instances, models_and_instances

from corral.contract import Action, Observation, State, StepResult, WireModel


class Move(Action):
    direction: str


class Seen(Observation):
    view: str = ""


class Where(State):
    position: int = 0


def test_action_forbids_unknown_fields() -> None:
    with pytest.raises(ValidationError) as info:
        Move(direction="n", speed=3)  # type: ignore[call-arg]
    (error,) = info.value.errors()
    assert error["type"] == "extra_forbidden"
    assert error["loc"] == ("speed",)
    with pytest.raises(ValidationError):
        Move.model_validate_json('{"direction": "n", "typo": 1}')


def test_action_validates_assignment() -> None:
    move = Move(direction="n")
    with pytest.raises(ValidationError):
        move.direction = 5  # type: ignore[assignment]


def test_observation_defaults() -> None:
    obs = Observation()
    assert (obs.done, obs.truncated, obs.reward, obs.metadata) == (False, False, None, {})
    assert Observation().metadata is not obs.metadata
    with pytest.raises(ValidationError):
        Seen(view="x", unknown=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("done", "truncated", "expected_done"),
    [(False, False, False), (True, False, True), (False, True, True), (True, True, True)],
)
def test_truncated_implies_done(done: bool, truncated: bool, expected_done: bool) -> None:
    assert Seen(done=done, truncated=truncated).done is expected_done
    data = {"done": done, "truncated": truncated}
    assert Seen.model_validate(data).done is expected_done
    assert Seen.model_validate_json(Seen(**data).model_dump_json()).done is expected_done


def test_truncating_by_assignment_ends_the_episode() -> None:
    obs = Seen()
    obs.truncated = True
    assert obs.done is True
    assert obs.model_dump()["done"] is True


def test_metadata_is_kept_on_the_wire() -> None:
    obs = Seen(view="v", reward=1.5, metadata={"seed": 3, "nested": {"k": [1, None]}})
    back = Seen.model_validate_json(obs.model_dump_json())
    assert back == obs
    assert back.metadata == {"seed": 3, "nested": {"k": [1, None]}}


def test_state_keeps_extra_fields() -> None:
    state = Where(episode_id="e1", step_count=2, position=3, note="free", score=1.5)  # type: ignore[call-arg]
    dumped = state.model_dump()
    assert dumped == {
        "episode_id": "e1",
        "step_count": 2,
        "position": 3,
        "note": "free",
        "score": 1.5,
    }
    assert Where.model_validate_json(state.model_dump_json()).model_dump() == dumped
    assert State(anything=[1]).model_extra == {"anything": [1]}  # type: ignore[call-arg]


def test_state_defaults_and_step_count_bound() -> None:
    state = State()
    assert (state.episode_id, state.step_count) == (None, 0)
    with pytest.raises(ValidationError):
        State(step_count=-1)
    state.step_count = 5
    with pytest.raises(ValidationError):
        state.step_count = -1


def test_bytes_cross_json_as_base64() -> None:
    class Blob(WireModel):
        data: bytes

    blob = Blob(data=bytes(range(256)))
    assert isinstance(blob.model_dump(mode="json")["data"], str)
    assert Blob.model_validate_json(blob.model_dump_json()) == blob


def test_step_result_of_a_terminated_episode() -> None:
    obs = Seen(done=True, reward=1.0, metadata={"why": "goal"})
    result = StepResult.of(obs)
    assert result.observation is obs
    assert (result.terminated, result.truncated, result.done) == (True, False, True)
    assert result.reward == 1.0
    assert result.info == {"why": "goal"}


def test_step_result_of_a_truncated_episode() -> None:
    result = StepResult.of(Seen(truncated=True, reward=-0.5))
    assert (result.terminated, result.truncated, result.done) == (False, True, True)
    assert result.reward == -0.5


def test_step_result_of_a_running_episode_and_after_reset() -> None:
    result = StepResult.of(Seen(reward=0.25))
    assert (result.terminated, result.truncated, result.done) == (False, False, False)
    first = StepResult.of(Seen())
    assert first.reward is None
    assert first.info == {}


def test_step_result_is_frozen_and_defaults() -> None:
    result = StepResult(observation=Seen())
    assert (result.reward, result.terminated, result.truncated, result.info) == (
        None,
        False,
        False,
        {},
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reward = 1.0  # type: ignore[misc]
    assert StepResult(observation=Seen(), terminated=False, truncated=True).done


@given(done=st.booleans(), truncated=st.booleans(), reward=st.none() | st.floats(allow_nan=False))
def test_step_result_agrees_with_the_observation(
    done: bool, truncated: bool, reward: float | None
) -> None:
    obs = Observation(done=done, truncated=truncated, reward=reward)
    result = StepResult.of(obs)
    assert result.done == obs.done == (done or truncated)
    assert result.truncated == truncated
    assert result.terminated == (done and not truncated)
    assert not (result.terminated and result.truncated)
    assert result.reward == reward


@CONTRACT_SETTINGS
@given(pair=st.sampled_from([Action, Observation, State]).flatmap(models_and_instances))
def test_any_contract_model_round_trips_through_json(
    pair: tuple[type[BaseModel], BaseModel],
) -> None:
    cls, obj = pair
    assert cls.model_validate_json(obj.model_dump_json()) == obj
    assert cls.model_validate(obj.model_dump()) == obj


@CONTRACT_SETTINGS
@given(state=instances(Where), obs=instances(Seen), move=instances(Move))
def test_instances_of_hand_written_models(state: Where, obs: Seen, move: Move) -> None:
    assert state.step_count >= 0
    assert not obs.truncated or obs.done
    assert Move.model_validate_json(move.model_dump_json()) == move
