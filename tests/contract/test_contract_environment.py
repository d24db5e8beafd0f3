"""The Environment base class: declared contract, names, versions, sync/async methods."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contract import Action, Environment, Observation, State
from corral.contract.environment import ActT, ObsT, StateT


class Move(Action):
    direction: str = "n"


class Seen(Observation):
    view: str = ""


class Where(State):
    position: int = 0


class OtherSeen(Observation):
    other: int = 0


class Plain(Environment[Move, Seen, Where]):
    def reset(self, seed: int | None = None, **options: Any) -> Seen:
        return Seen(view="start")

    def step(self, action: Move) -> Seen:
        return Seen(view=action.direction)

    def state(self) -> Where:
        return Where()


class Async(Environment[Move, Seen, State]):
    async def reset(self, seed: int | None = None, **options: Any) -> Seen:  # type: ignore[override]
        return Seen()

    async def step(self, action: Move) -> Seen:  # type: ignore[override]
        return Seen()

    def state(self) -> State:
        return State()

    async def close(self) -> None:  # type: ignore[override]
        return None


def test_generic_parameters_declare_the_models() -> None:
    assert Plain.action_type is Move
    assert Plain.observation_type is Seen
    assert Plain.state_type is Where
    assert Async.state_type is State


def test_subclasses_inherit_the_models() -> None:
    class Child(Plain):
        pass

    assert (Child.action_type, Child.observation_type, Child.state_type) == (Move, Seen, Where)


def test_class_attributes_win_over_generic_parameters() -> None:
    class Explicit(Environment[Move, Seen, Where]):
        observation_type = OtherSeen

    assert Explicit.observation_type is OtherSeen
    assert Explicit.action_type is Move


def test_models_resolve_through_generic_intermediates() -> None:
    class Partial(Environment[ActT, Seen, StateT]):
        pass

    assert Partial.observation_type is Seen
    assert not hasattr(Partial, "action_type")
    assert Partial.state_type is State  # the default, not a type variable

    class Concrete(Partial[Move, Where]):
        pass

    assert (Concrete.action_type, Concrete.observation_type, Concrete.state_type) == (
        Move,
        Seen,
        Where,
    )

    class Reordered(Environment[ActT, ObsT, Where]):
        pass

    class Final(Reordered[Move, OtherSeen]):
        pass

    assert (Final.action_type, Final.observation_type, Final.state_type) == (
        Move,
        OtherSeen,
        Where,
    )


def test_models_from_class_attributes_alone() -> None:
    class ByAttributes(Environment):  # type: ignore[type-arg]
        action_type = Move
        observation_type = Seen

    assert ByAttributes.state_type is State
    assert ByAttributes.contract().action is Move


def test_default_and_explicit_names() -> None:
    assert Plain.name == "Plain"

    class Named(Plain):
        name = "my-env"

    class Blank(Plain):
        name = ""

    class Child(Named):
        pass

    assert Named.name == "my-env"
    assert Blank.name == "Blank"
    assert Child.name == "Child"


@pytest.mark.parametrize("version", ["1", "1.0", "v1.0.0", "latest", "1.0.0\n", ""])
def test_bad_contract_version_fails_at_class_definition(version: str) -> None:
    with pytest.raises(ValueError, match="not semantic") as info:

        class Bad(Plain):
            contract_version = version

    assert repr(version) in str(info.value)


def test_contract() -> None:
    class Versioned(Plain):
        name = "walker"
        contract_version = "2.1.0-beta"

    contract = Versioned.contract()
    assert (contract.name, contract.version) == ("walker", "2.1.0-beta")
    assert (contract.action, contract.observation, contract.state) == (Move, Seen, Where)
    assert contract.fingerprint == Plain.contract().fingerprint
    assert Plain.contract().version == "1.0.0"


def test_contract_without_models_names_what_is_missing() -> None:
    class Empty(Environment):  # type: ignore[type-arg]
        pass

    with pytest.raises(TypeError, match="Empty declares no action_type") as info:
        Empty.contract()
    assert "Environment[MyAction, MyObservation, MyState]" in str(info.value)

    class NoObservation(Environment):  # type: ignore[type-arg]
        action_type = Move

    with pytest.raises(TypeError, match="NoObservation declares no observation_type"):
        NoObservation.contract()


def test_base_methods() -> None:
    class Bare(Environment[Move, Seen, State]):
        pass

    env = Bare()
    for call in (env.reset, lambda: env.step(Move()), env.state):
        with pytest.raises(NotImplementedError):
            call()
    assert env.close() is None
    assert Plain().step(Move(direction="e")).view == "e"


def test_defaults_of_the_other_class_attributes() -> None:
    assert (Plain.auto_reset, Plain.thread_affinity, Plain.action_migrations) == (False, False, {})
    assert Plain.description == ""
