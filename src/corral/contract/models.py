"""The base models every environment's contract is made of.

``Action``, ``Observation`` and ``State`` are pydantic v2 models. Subclasses are checked
for wire safety when the class is defined (see :mod:`corral.contract.wiresafe`), so a
field that cannot cross the wire fails at import time, never at the first step of a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.contract.wiresafe import make_wire_safe

_BASE_CONFIG = ConfigDict(
    validate_assignment=True,
    # Unknown types must reach corral's wire-safety check, which names the field and the
    # fix, instead of failing inside pydantic with a generic schema error.
    arbitrary_types_allowed=True,
    ser_json_bytes="base64",
    val_json_bytes="base64",
)


OMIT_EMPTY = "x-corral-omit-empty"
"""Schema marker of a field left out of the serialized form when empty; models rebuilt
from the schema (:mod:`corral.contract.dynamic`) do the same."""


def omitted_when_empty(value: Any) -> bool:
    """``exclude_if`` predicate of the fields marked :data:`OMIT_EMPTY`."""
    return not value


class WireModel(BaseModel):
    """Base of the contract models: checked for wire safety when subclassed.

    Equality is pydantic's, except that models holding numpy arrays compare them by
    dtype, shape and values (pydantic's ``==`` raises numpy's "truth value of an array
    is ambiguous" for them; see :func:`corral.contract.arrays.values_equal`).
    """

    model_config = _BASE_CONFIG

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        make_wire_safe(cls)

    def __eq__(self, other: object) -> bool:
        try:
            return super().__eq__(other)
        except ValueError:  # an array field: element-wise ``==`` has no truth value
            if not isinstance(other, BaseModel):
                return NotImplemented
            # Only reached with arrays in the model, so numpy is installed.
            from corral.contract.arrays import models_equal

            return models_equal(self, other)


class Action(WireModel):
    """What the agent sends to the environment. Unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid")


class Observation(WireModel):
    """What the environment returns from ``reset`` and ``step``.

    Attributes:
        done: the episode has ended (by termination or truncation).
        truncated: the episode was cut short (time limit, outside condition) rather than
            reaching a terminal state. ``truncated=True`` implies ``done=True``.
        reward: the reward of the step that produced this observation.
        reward_components: optional named parts of ``reward`` (``{"format": 0.2,
            "correct": 1.0}``), recorded in episodes, summed in eval reports and
            exposed on ``/metrics``; left off the wire when empty. See
            :class:`~corral.contract.rubric.Rubric`.
        metadata: free-form extra information; unlike OpenEnv, it is kept on the wire.
    """

    model_config = ConfigDict(extra="forbid")

    done: bool = False
    truncated: bool = False
    reward: float | None = None
    # Left out of the serialized form when empty, so environments without components
    # pay nothing for the field on the wire.
    reward_components: dict[str, float] = Field(
        default_factory=dict,
        exclude_if=omitted_when_empty,
        json_schema_extra={OMIT_EMPTY: True},
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _truncated_implies_done(self) -> Observation:
        if self.truncated and not self.done:
            # Bypass validate_assignment to avoid re-entering this validator.
            self.__dict__["done"] = True
        return self


class State(WireModel):
    """The environment's internal state as a trainer may inspect it.

    Subclasses may add fields, and extra fields are kept (``extra="allow"``).
    """

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = Field(default=0, ge=0)


ObsT = TypeVar("ObsT", bound=Observation)


@dataclass(frozen=True, slots=True)
class StepResult(Generic[ObsT]):
    """The outcome of ``reset`` or ``step`` as the client returns it.

    Attributes:
        observation: the typed observation.
        reward: the step's reward (``None`` after reset or when the env gives none).
        terminated: the episode reached a terminal state (Gymnasium's meaning).
        truncated: the episode was cut short (Gymnasium's meaning).
        info: the observation's metadata.
    """

    observation: ObsT
    reward: float | None = None
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """True when the episode ended, by termination or truncation."""
        return self.terminated or self.truncated

    @classmethod
    def of(cls, observation: ObsT) -> StepResult[ObsT]:
        """Derive the result from an observation's ``done``/``truncated``/``reward``."""
        return cls(
            observation=observation,
            reward=observation.reward,
            terminated=observation.done and not observation.truncated,
            truncated=observation.truncated,
            info=observation.metadata,
        )
