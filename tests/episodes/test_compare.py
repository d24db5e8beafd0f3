"""Finding where two episodes part."""

from __future__ import annotations

from corral.episodes import (
    EnvInfo,
    Episode,
    ErrorInfo,
    Header,
    StepRecord,
    compare,
    first_difference,
)
from corral.episodes.compare import value_at

HEADER = Header(env=EnvInfo(name="toy"))


def episode(*observations: dict | None, errors: dict[int, str] | None = None) -> Episode:
    errors = errors or {}
    records = []
    for index, obs in enumerate(observations):
        error = ErrorInfo(code=errors[index]) if index in errors else None
        records.append(
            StepRecord(
                episode="e",
                index=index,
                op="reset" if index == 0 else "step",
                action=None if index == 0 else {"i": index},
                observation=None if error else obs,
                error=error,
            )
        )
    return Episode(id="e", header=HEADER, records=records)


def test_first_difference_paths() -> None:
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) is None
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == "a[1].b"
    assert first_difference({"a": 1}, {"a": 1, "z": 0}) == "z"
    assert first_difference({"a": [1, 2]}, {"a": [1]}) == "a (length 2 vs 1)"
    assert first_difference(1, 1.0) is None  # JSON numbers
    assert first_difference(True, 1) == "(value)"  # but a bool is not a number
    assert first_difference(None, 0) == "(value)"
    assert first_difference("x", "y") == "(value)"


def test_value_at_follows_the_spelling() -> None:
    value = {"a": [1, {"b": [5, 6]}]}
    assert value_at(value, "a[1].b[1]") == 6
    assert value_at(value, "a (length 2 vs 1)") == [1, {"b": [5, 6]}]
    assert value_at(value, "a[7]") is None and value_at(value, "q.r") is None


def test_identical_episodes_agree() -> None:
    a = episode({"n": 0}, {"n": 1, "reward": 0.5}, errors={})
    assert compare(a, episode({"n": 0}, {"n": 1, "reward": 0.5})) is None


def test_the_first_differing_observation_is_reported() -> None:
    recorded = episode({"n": 0}, {"n": 1, "h": ["ab", "cd"]}, {"n": 2})
    replayed = episode({"n": 0}, {"n": 1, "h": ["ab", "cx"]}, {"n": 3})
    found = compare(recorded, replayed)
    assert found is not None
    assert (found.index, found.op, found.path) == (1, "step", "observation.h[1]")
    assert (found.expected, found.actual) == ("cd", "cx")
    assert str(found) == "episode e: step 1 differs at observation.h[1]: recorded 'cd', got 'cx'"


def test_errors_and_lengths_differ_too() -> None:
    ok = episode({"n": 0}, {"n": 1})
    failed = episode({"n": 0}, None, errors={1: "ENV_ERROR"})
    found = compare(ok, failed)
    assert found is not None and (found.path, found.expected, found.actual) == (
        "error",
        None,
        "ENV_ERROR",
    )
    assert compare(failed, episode({"n": 0}, None, errors={1: "ENV_ERROR"})) is None
    short = compare(episode({"n": 0}, {"n": 1}, {"n": 2}), ok)
    assert short is not None and (short.index, short.path, short.expected, short.actual) == (
        2,
        "length",
        3,
        2,
    )


def test_ignored_paths_are_left_out() -> None:
    a = episode({"n": 0, "metadata": {"ms": 3, "id": "a"}}, {"items": [{"t": 1, "v": 1}]})
    b = episode({"n": 0, "metadata": {"ms": 9, "id": "b"}}, {"items": [{"t": 2, "v": 1}]})
    assert compare(a, b) is not None
    assert compare(a, b, ignore=["metadata", "items.*.t"]) is None
    assert compare(a, b, ignore=["metadata.*", "items.*.t"]) is None
    found = compare(a, b, ignore=["metadata.ms"])
    assert found is not None and found.path == "observation.metadata.id"
    assert a.records[0].observation == {"n": 0, "metadata": {"ms": 3, "id": "a"}}  # untouched
