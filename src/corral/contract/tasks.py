"""Tasks and splits: the dataset an environment's episodes are drawn from.

An environment with a dataset (Wordle's word list, the coding env's problems) publishes
it as named *splits* (``"train"``, ``"test"``), each an ordered list of tasks. A task is
addressed by ``(split, index)`` (:class:`TaskRef`) and described by a :class:`Task`
model the environment declares. Selecting one starts an episode the usual way:
``reset(split="test", index=3)``. The shapes follow OpenEnv 0.10's and the Open Reward
Standard's task API, so their clients work against a corral server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from corral.contract.models import WireModel
from corral.errors import InvalidArgument

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


MAX_TASKS_PER_REQUEST = 10_000
"""The most tasks one listing returns; larger splits are read with ranges."""

SPLIT_KINDS = ("train", "validation", "test")
"""The kinds of split the task API reports (OpenEnv's and ORS's ``type``)."""


class _Splits(Protocol):
    """The sizes part of the tasks face."""

    def splits(self) -> list[str]: ...
    def num_tasks(self, split: str) -> int: ...


class _TaskSource(_Splits, Protocol):
    """What the helpers need of an environment: its tasks face."""

    @property
    def task_type(self) -> type[Task]: ...

    def task(self, split: str, index: int) -> Task: ...


def task_ref(split: Any, index: Any) -> TaskRef | None:
    """The task address in reset options ``split``/``index``; None when neither is given.

    Raises:
        InvalidArgument: only one of them is given, or they are not a split name and a
            non-negative int.
    """
    if split is None and index is None:
        return None
    if split is None or index is None or isinstance(index, bool):
        raise InvalidArgument(
            "a task is chosen with both reset options split (str) and index (int >= 0), "
            f"got split={split!r}, index={index!r}",
            details={"split": repr(split), "index": repr(index)},
        )
    try:
        return TaskRef(split=split, index=index)
    except ValidationError as exc:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())
        raise InvalidArgument(
            f"invalid task address split={split!r}, index={index!r}: {problems}",
            details={"split": repr(split), "index": repr(index)},
        ) from None


def resolve_task(env: _TaskSource, split: str, index: int) -> Task:
    """Task ``index`` of ``split``, checked against the environment's tasks face.

    Environments call it from ``reset`` when given ``split``/``index``; the server's task
    routes call it too, so a bad address reads the same everywhere.

    Raises:
        InvalidArgument: the environment has no tasks, the split is unknown, or the
            index is out of range (``details`` names the splits or the range).
        TypeError: the environment returned something that is not its task for that
            address (a bug in the environment).
    """
    _check_index(split, index, count_tasks(env, split))
    task = env.task(split, index)
    if not isinstance(task, env.task_type) or (task.split, task.index) != (split, index):
        raise TypeError(
            f"{type(env).__name__}.task({split!r}, {index}) returned {task!r}, not a "
            f"{env.task_type.__name__} with split={split!r} and index={index}"
        )
    return task


def _check_index(split: str, index: int, count: int) -> None:
    if not 0 <= index < count:
        valid = f"use 0..{count - 1}" if count else "it is empty"
        raise InvalidArgument(
            f"task index {index} is out of range for split {split!r}, which holds "
            f"{count} task(s): {valid}",
            details={
                "split": split,
                "index": index,
                "num_tasks": count,
                "reason": "index_out_of_range",
            },
        )


def with_task(options: dict[str, Any], task: TaskRef | None) -> dict[str, Any]:
    """Reset ``options`` with ``task`` as its ``split``/``index`` options (how a task
    reaches ``reset``).

    Raises:
        InvalidArgument: the options name another task than ``task``.
    """
    if task is None:
        return options
    named = task_ref(options.get("split"), options.get("index"))
    if named is not None and named != task:
        raise InvalidArgument(
            f"reset names two tasks: task {task} and options split/index {named}",
            details={"task": str(task), "options": str(named)},
        )
    return {**options, "split": task.split, "index": task.index}


class TaskBounds:
    """The splits and their sizes, read once from an instance of the environment, to
    check a task address before ``reset`` runs.

    The tasks face is metadata (side-effect free, the same for every instance), so the
    server reads it from one instance made on first use and refuses an unknown split or
    an index out of range itself, with the same error as :func:`resolve_task`, for any
    environment, even one whose ``reset`` does not check.

    Args:
        make: makes the instance to read (called once; closed after reading if it has
            a ``close``).
    """

    def __init__(self, make: Callable[[], _Splits]) -> None:
        self._make = make
        self._splits: list[str] | None = None
        self._counts: dict[str, int] = {}

    def splits(self) -> list[str]:
        """The split names (reading them on first use)."""
        if self._splits is None:
            env = self._make()
            try:
                splits = list(env.splits())
                self._counts = {name: env.num_tasks(name) for name in splits}
            finally:
                close = getattr(env, "close", None)
                if callable(close):
                    close()
            self._splits = splits
        return self._splits

    def num_tasks(self, split: str) -> int:
        """The size of ``split`` (one of :meth:`splits`)."""
        self.splits()
        return self._counts[split]

    def check(self, options: dict[str, Any]) -> None:
        """Refuse reset ``options`` whose ``split``/``index`` is no task of the environment.

        Raises:
            InvalidArgument: only one of split/index given, the environment has no tasks,
                an unknown split, or an index out of range.
        """
        ref = task_ref(options.get("split"), options.get("index"))
        if ref is not None:
            _check_index(ref.split, ref.index, count_tasks(self, ref.split))


def task_range(
    env: _TaskSource, split: str, start: int | None = None, stop: int | None = None
) -> list[Task]:
    """The tasks ``start:stop`` of ``split``, with Python's slice meaning (negative
    bounds count from the end).

    Raises:
        InvalidArgument: as :func:`resolve_task`, or the range holds more than
            :data:`MAX_TASKS_PER_REQUEST` tasks.
    """
    count = count_tasks(env, split)
    indices = range(*slice(start, stop).indices(count))
    if len(indices) > MAX_TASKS_PER_REQUEST:
        raise InvalidArgument(
            f"{len(indices)} tasks asked for at once; read split {split!r} in ranges of at "
            f"most {MAX_TASKS_PER_REQUEST}",
            details={"split": split, "asked": len(indices), "limit": MAX_TASKS_PER_REQUEST},
        )
    return [resolve_task(env, split, i) for i in indices]


def split_kind(name: str) -> str:
    """The kind of a split by its name: ``train``, ``test``, else ``validation`` (as
    OpenEnv reports a split it cannot place)."""
    return name if name in SPLIT_KINDS else "validation"


def count_tasks(env: _Splits, split: str) -> int:
    """How many tasks ``split`` holds.

    Raises:
        InvalidArgument: the environment has no tasks, or no split of that name.
    """
    try:
        splits = list(env.splits())
    except NotImplementedError:
        raise InvalidArgument(
            f"{type(env).__name__} publishes no tasks: reset it without split/index",
            details={"reason": "no_tasks"},
        ) from None
    if split not in splits:
        raise InvalidArgument(
            f"unknown split {split!r}; {type(env).__name__} has splits {splits}",
            details={"split": split, "splits": splits, "reason": "unknown_split"},
        )
    return env.num_tasks(split)
