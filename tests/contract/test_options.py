"""Reset options: the one introspection of ``reset`` signatures, and parsing with a model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from tests.support.envs import CountAction, CountObservation, CountState

from corral.contract import Environment
from corral.contract.diff import ChangeKind, Direction, Severity, diff_schemas
from corral.contract.lock import lock_of
from corral.contract.options import (
    accepted_reset_options,
    check_reset_options,
    parse_reset_options,
    reset_options_model,
    validate_reset_options,
)
from corral.errors import InvalidArgument


class Envs:
    def plain(self, seed: int | None = None) -> None: ...

    def keywords(self, seed: int | None = None, *, limit: int = 1, label: str = "") -> None: ...

    def positional(self, seed: int | None = None, limit: int = 1, *extra: Any) -> None: ...

    def anything(self, seed: int | None = None, **options: Any) -> None: ...


def test_accepted_reset_options():
    envs = Envs()
    assert accepted_reset_options(envs.plain) == frozenset()
    assert accepted_reset_options(Envs.keywords) == {"limit", "label"}  # unbound: no self
    assert accepted_reset_options(envs.positional) == {"limit"}
    assert accepted_reset_options(envs.anything) is None


class Options(BaseModel):
    limit: int = 1


def test_parse_reset_options_names_every_problem():
    assert parse_reset_options(Options, {"limit": 3}, env="e", accepted="limit").limit == 3
    with pytest.raises(InvalidArgument) as info:
        parse_reset_options(Options, {"limit": "x" * 1000}, env="e", accepted="limit (int)")
    message = info.value.message
    assert message.startswith("invalid e options: limit: Input should be a valid integer")
    assert message.endswith("Accepted options: limit (int)") and len(message) < 500
    assert info.value.details["accepted"] == ["limit"]
    assert info.value.details["errors"][0]["loc"] == ["limit"]


def test_check_reset_options():
    check_reset_options({"limit": 1}, frozenset({"limit"}), "Env")
    check_reset_options({"anything": 1}, None, "Env")  # it takes **options
    with pytest.raises(InvalidArgument) as info:
        check_reset_options({"nope": 1, "limit": 1}, frozenset({"limit"}), "Env")
    assert info.value.details == {"unknown": ["nope"], "accepted": ["limit"]}
    assert info.value.message == "unknown reset option(s) ['nope']; Env.reset accepts ['limit']"
    with pytest.raises(InvalidArgument, match="accepts no options"):
        check_reset_options({"x": 1}, frozenset(), "Env")


def test_the_reset_options_model_is_inferred_from_the_signature():
    envs = Envs()
    model = reset_options_model(envs.keywords, None, "demo")
    assert model is not None
    assert model.model_json_schema()["properties"].keys() == {"limit", "label"}
    assert model.model_validate({}).model_dump() == {"limit": 1, "label": ""}
    with pytest.raises(InvalidArgument, match="limit"):
        validate_reset_options(model, {"limit": "many"}, "demo")
    with pytest.raises(InvalidArgument, match="color"):
        validate_reset_options(model, {"color": 1}, "demo")
    validate_reset_options(model, {"limit": 3}, "demo")
    assert reset_options_model(envs.plain, None, "demo") is None  # nothing to publish
    assert reset_options_model(envs.anything, None, "demo") is None  # takes anything


def test_a_declared_reset_options_model_wins():
    class Declared(BaseModel):
        level: int = 0

    assert reset_options_model(Envs().anything, Declared, "demo") is Declared


def test_reset_options_are_part_of_the_contract():
    class WithOptions(Environment[CountAction, CountObservation, CountState]):
        def reset(self, seed: int | None = None, *, limit: int = 10) -> Any: ...
        def step(self, action: Any) -> Any: ...
        def state(self) -> Any: ...

    class Without(Environment[CountAction, CountObservation, CountState]):
        def reset(self, seed: int | None = None, **options: Any) -> Any: ...
        def step(self, action: Any) -> Any: ...
        def state(self) -> Any: ...

    with_options, without = WithOptions.contract(), Without.contract()
    assert "reset_options" not in without.schemas
    assert with_options.schemas["reset_options"]["properties"]["limit"]["default"] == 10
    assert with_options.fingerprint != without.fingerprint
    lock = lock_of(with_options)
    assert lock.schemas["reset_options"] == with_options.schemas["reset_options"]
    changes = diff_schemas(lock.schemas, without.schemas)
    assert [(c.path, c.kind, c.severity) for c in changes] == [
        ("reset_options", ChangeKind.MODEL_REMOVED, Severity.BREAKING)
    ]
    assert changes[0].direction == Direction.CLIENT_TO_SERVER
