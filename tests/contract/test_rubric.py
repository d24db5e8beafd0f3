"""Rubric: weighted, gated reward terms whose components add up to the reward."""

from __future__ import annotations

import math

import pytest

from corral.contract import Observation
from corral.contract.rubric import Rubric, Scores, Term


def rubric() -> Rubric:
    return Rubric(
        Term("format", lambda answer: answer.startswith("<a>"), weight=0.2),
        Term("correct", lambda answer: answer == "<a>42", gate="format"),
        Term("short", lambda answer: 1.0 / len(answer), weight=-1.0),
    )


def test_components_add_up_to_the_reward() -> None:
    scores = rubric().score("<a>42")
    assert scores.components == {"format": 0.2, "correct": 1.0, "short": pytest.approx(-0.2)}
    assert scores.total == pytest.approx(1.0) == pytest.approx(sum(scores.components.values()))
    assert scores.raw == {"format": 1.0, "correct": 1.0, "short": pytest.approx(0.2)}


def test_a_closed_gate_skips_the_term() -> None:
    calls: list[str] = []

    def correct(answer: str) -> float:
        calls.append(answer)
        return 1.0

    gated = Rubric(Term("format", lambda a: 0.5), Term("correct", correct, gate="format"))
    scores = gated.score("42")
    assert scores.components == {"format": 0.5, "correct": 0.0} and calls == []
    assert scores.raw["correct"] is None
    open_gate = Rubric(
        Term("format", lambda a: 0.5), Term("c", correct, gate="format", threshold=0.5)
    )
    assert open_gate.score("x").components["c"] == 1.0


def test_apply_sets_reward_and_components() -> None:
    obs = rubric().apply(Observation(), "nope")
    assert obs.reward_components == {"format": 0.0, "correct": 0.0, "short": -0.25}
    assert obs.reward == -0.25


@pytest.mark.parametrize(
    ("terms", "message"),
    [
        ((Term("a", abs), Term("a", abs)), "unique"),
        ((Term("", abs),), "unique"),
        ((Term("a", abs, gate="b"), Term("b", abs)), "not an earlier term"),
        ((Term("a", abs, weight=math.inf),), "finite"),
    ],
)
def test_bad_rubrics_are_refused(terms: tuple[Term, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Rubric(*terms)


@pytest.mark.parametrize("value", ["1", None, math.nan, math.inf])
def test_a_term_must_return_a_finite_number(value: object) -> None:
    with pytest.raises(ValueError, match="'bad'"):
        Rubric(Term("bad", lambda: value)).score()


def test_an_empty_rubric_scores_zero() -> None:
    assert Rubric().score() == Scores(total=0.0)
