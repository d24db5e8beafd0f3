"""Tasks and splits: the dataset an environment's episodes are drawn from.

An environment with a dataset (Wordle's word list, the coding env's problems) publishes
it as named *splits* (``"train"``, ``"test"``), each an ordered list of tasks. A task is
addressed by ``(split, index)`` (:class:`TaskRef`) and described by a :class:`Task`
model the environment declares. Selecting one starts an episode the usual way:
``reset(split="test", index=3)``. The shapes follow OpenEnv 0.10's and the Open Reward
Standard's task API, so their clients work against a corral server.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.contract.models import WireModel

SplitName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
"""A split's name: letters, digits, ``_ . -`` (it appears in URLs and file names)."""


class TaskRef(BaseModel):
    """Where a task lives: its split and its position in that split."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: SplitName
    index: int = Field(ge=0)

    def __str__(self) -> str:
        return f"{self.split}[{self.index}]"


class Task(WireModel):
    """One task of a split as the task API publishes it; environments subclass it.

    Attributes:
        split: the split the task belongs to.
        index: its position in the split (0-based).
        id: a stable name for the task (default ``"<split>-<index>"``).

    A subclass adds what a trainer or a report may show (a prompt, a difficulty);
    it should not carry what grades the task (hidden tests, the answer), since the
    task API is public.
    """

    model_config = ConfigDict(extra="forbid")

    split: SplitName
    index: int = Field(ge=0)
    id: str = ""

    @model_validator(mode="after")
    def _default_id(self) -> Task:
        if not self.id:
            self.__dict__["id"] = f"{self.split}-{self.index}"
        return self

    @property
    def ref(self) -> TaskRef:
        """The task's ``(split, index)`` address."""
        return TaskRef(split=self.split, index=self.index)
