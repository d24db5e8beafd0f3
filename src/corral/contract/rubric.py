"""``Rubric``: a reward made of named, weighted, optionally gated terms.

    rubric = Rubric(
        Term("format", lambda answer, task: float(answer.is_well_formed()), weight=0.2),
        Term("correct", lambda answer, task: float(answer.value == task.value), gate="format"),
    )
    scores = rubric.score(answer, task)      # Scores(total=1.2, components={...})
    return rubric.apply(observation, answer, task)   # sets reward and reward_components

Each term is a function of whatever the environment passes (the same arguments for
every term) returning a number (a bool counts as 0 or 1). Its *contribution* is
``weight * value``; a gated term contributes only when the term it names reached
``threshold`` (its raw value), else 0.
The total is the sum of the contributions, and ``reward_components`` holds each one, so
the components always add up to the reward. Deliberately small: no judges, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from corral.contract.models import Observation

ObsT = TypeVar("ObsT", bound=Observation)


@dataclass(frozen=True)
class Term:
    """One named part of a reward.

    Attributes:
        name: the component's name (unique in its rubric).
        fn: computes the raw value from the rubric's arguments.
        weight: multiplies the raw value.
        gate: the name of an earlier term whose raw value must reach ``threshold`` for
            this one to count.
        threshold: see ``gate``.
    """

    name: str
    fn: Callable[..., float]
    weight: float = 1.0
    gate: str | None = None
    threshold: float = 1.0


@dataclass(frozen=True)
class Scores:
    """A rubric's result.

    Attributes:
        total: the reward: the sum of ``components``.
        components: each term's contribution (0 for a closed gate), in term order.
        raw: each term's raw value (None for a term a closed gate skipped).
    """

    total: float
    components: dict[str, float] = field(default_factory=dict)
    raw: dict[str, float | None] = field(default_factory=dict)


class Rubric:
    """A reward computed from named terms (see the module docstring).

    Raises:
        ValueError: two terms share a name, a gate names no earlier term, or a weight
            is not a finite number.
    """

    def __init__(self, *terms: Term) -> None:
        seen: set[str] = set()
        for term in terms:
            if not term.name or term.name in seen:
                raise ValueError(f"rubric term names must be unique and non-empty: {term.name!r}")
            if term.gate is not None and term.gate not in seen:
                raise ValueError(
                    f"term {term.name!r} is gated on {term.gate!r}, which is not an earlier term"
                )
            if not math.isfinite(term.weight) or not math.isfinite(term.threshold):
                raise ValueError(f"term {term.name!r}: weight and threshold must be finite")
            seen.add(term.name)
        self.terms = terms

    def score(self, *args: Any, **kwargs: Any) -> Scores:
        """Evaluate every term on ``args``/``kwargs``.

        Raises:
            ValueError: a term returned something that is not a finite number.
        """
        raw: dict[str, float | None] = {}
        components: dict[str, float] = {}
        for term in self.terms:
            gate = raw.get(term.gate) if term.gate is not None else None
            if term.gate is not None and (gate is None or gate < term.threshold):
                raw[term.name] = None
                components[term.name] = 0.0
                continue
            value = term.fn(*args, **kwargs)
            if not isinstance(value, (int, float)):  # a bool counts as 0 or 1
                raise ValueError(f"rubric term {term.name!r} returned {value!r}, not a number")
            if not math.isfinite(value):
                raise ValueError(f"rubric term {term.name!r} returned {value}")
            raw[term.name] = float(value)
            components[term.name] = term.weight * float(value)
        return Scores(total=sum(components.values()), components=components, raw=raw)

    def apply(self, observation: ObsT, *args: Any, **kwargs: Any) -> ObsT:
        """``observation`` with ``reward`` and ``reward_components`` from :meth:`score`."""
        scores = self.score(*args, **kwargs)
        observation.reward = scores.total
        observation.reward_components = scores.components
        return observation
