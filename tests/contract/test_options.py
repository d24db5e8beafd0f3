"""Reset options: the one introspection of ``reset`` signatures, and parsing with a model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from corral.contract.options import (
    accepted_reset_options,
    check_reset_options,
    parse_reset_options,
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
