"""TypedModels: actions out. A batch of plain bounded integers (a Discrete action) is
encoded without the model, exactly as validating and dumping it would."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import pytest
from pydantic import Field, computed_field, field_validator

from corral.client.typed import TypedModels, int_fields
from corral.contract import Action, Observation, State
from corral.errors import InvalidAction
from corral.protocol.codecs import get_codec


class Move(Action):
    action: int = Field(ge=0, le=3)


class Pair(Action):
    x: Annotated[int, Field(gt=-1, lt=5)]
    y: int


class Checked(Action):
    action: int = Field(ge=0)

    @field_validator("action")
    @classmethod
    def _even(cls, value: int) -> int:
        return value * 2


class Aliased(Action):
    action: int = Field(alias="a")


class Stepped(Action):
    action: int = Field(multiple_of=2)


class Computed(Action):
    action: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def twice(self) -> int:
        return self.action * 2


class Named(Action):
    action: str


def test_only_plain_bounded_integers_qualify():
    assert int_fields(Move) == (("action", 0, 3),)
    assert int_fields(Pair) == (("x", 0, 4), ("y", None, None))
    for model in (Checked, Aliased, Stepped, Computed, Named):
        assert int_fields(model) is None, model


@pytest.mark.parametrize("codec", ["msgpack", "json"])
@pytest.mark.parametrize(
    ("model", "actions"),
    [
        (Move, [{"action": k % 4} for k in range(8)]),
        (Pair, [{"y": 7, "x": 4}, {"x": 0, "y": -3}]),
        (Move, [{"action": True}, {"action": np.int64(2)}, {"action": 2.0}]),  # coerced
        (Checked, [{"action": 1}]),  # a validator: the model's path
        (Computed, [{"action": 1}]),
    ],
)
def test_encoding_equals_the_models_dump(model: type[Action], actions: list[Any], codec: str):
    wire = get_codec(codec)
    typed = TypedModels(None, model, Observation, State)
    models = [model.model_validate(a) for a in actions]
    assert typed.encode_actions(actions, wire) == [wire.dump(m) for m in models]


@pytest.mark.parametrize("bad", [{"action": 4}, {"action": -1}, {"action": 1, "extra": 0}, {}])
def test_a_bad_plain_integer_is_still_refused_by_the_model(bad: dict[str, Any]):
    typed = TypedModels(None, Move, Observation, State)
    with pytest.raises(InvalidAction, match="action 1"):
        typed.encode_actions([{"action": 0}, bad], get_codec("msgpack"))


class Subclassed(Computed):
    extra: str = "x"


@pytest.mark.parametrize("codec", ["msgpack", "json"])
@pytest.mark.parametrize(
    ("model", "actions"),
    [
        (Computed, [Computed(action=k) for k in range(4)]),  # exactly the type: one call
        (Named, [Named(action="a"), Named(action="b")]),
        (Computed, [Computed(action=1), Subclassed(action=2)]),  # a subclass: each its own
    ],
)
def test_models_are_encoded_as_each_ones_dump(
    model: type[Action], actions: list[Action], codec: str
):
    """A batch of model instances encodes as dumping each one does (computed fields
    included; a subclass with its own fields)."""
    wire = get_codec(codec)
    typed = TypedModels(None, model, Observation, State)
    assert typed.encode_actions(actions, wire) == [wire.dump(a) for a in actions]
