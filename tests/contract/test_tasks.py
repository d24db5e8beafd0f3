"""The tasks face of Environment and the helpers every path checks tasks with."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corral.contract import Action, Environment, Observation, State
from corral.contract.tasks import (
    MAX_TASKS_PER_REQUEST,
    Task,
    TaskRef,
    count_tasks,
    resolve_task,
    split_kind,
    task_range,
    task_ref,
)
from corral.errors import InvalidArgument


class Act(Action):
    n: int = 0


class Obs(Observation):
    n: int = 0


class Problem(Task):
    prompt: str


class Dataset(Environment[Act, Obs, State]):
    task_type = Problem
    sizes = {"train": 5, "test": 2, "empty": 0}

    def splits(self) -> list[str]:
        return list(self.sizes)

    def num_tasks(self, split: str) -> int:
        return self.sizes[split]

    def task(self, split: str, index: int) -> Problem:
        return Problem(split=split, index=index, prompt=f"{split} #{index}")


class Plain(Environment[Act, Obs, State]):
    pass


def test_task_ids_default_to_split_and_index() -> None:
    task = Problem(split="test", index=3, prompt="p")
    assert task.id == "test-3" and task.ref == TaskRef(split="test", index=3)
    assert Problem(split="test", index=3, prompt="p", id="q7").id == "q7"
    with pytest.raises(ValidationError):
        Task(split="test", index=0, extra_field=1)  # type: ignore[call-arg]


def test_has_tasks() -> None:
    assert Dataset.has_tasks() and not Plain.has_tasks()
    with pytest.raises(NotImplementedError, match="publishes no tasks"):
        Plain().splits()


def test_task_type_must_be_a_task_model() -> None:
    with pytest.raises(TypeError, match="task_type must be a subclass"):

        class Wrong(Environment[Act, Obs, State]):
            task_type = Act  # type: ignore[assignment]


def test_resolve_task_checks_the_address() -> None:
    env = Dataset()
    assert resolve_task(env, "test", 1) == Problem(split="test", index=1, prompt="test #1")
    with pytest.raises(InvalidArgument, match=r"unknown split 'dev'.*\['train', 'test', 'empty'\]"):
        resolve_task(env, "dev", 0)
    with pytest.raises(InvalidArgument, match=r"index 2 is out of range .* use 0\.\.1") as info:
        resolve_task(env, "test", 2)
    assert info.value.details["reason"] == "index_out_of_range"
    with pytest.raises(InvalidArgument, match="it is empty"):
        resolve_task(env, "empty", 0)
    with pytest.raises(InvalidArgument, match="publishes no tasks") as info:
        resolve_task(Plain(), "test", 0)
    assert info.value.details == {"reason": "no_tasks"}


def test_a_task_at_the_wrong_address_is_the_environments_bug() -> None:
    class Liar(Dataset):
        def task(self, split: str, index: int) -> Problem:
            return Problem(split=split, index=0, prompt="always the first")

    with pytest.raises(TypeError, match="returned"):
        resolve_task(Liar(), "train", 3)


def test_ranges_follow_python_slices() -> None:
    env = Dataset()
    assert [t.index for t in task_range(env, "train")] == [0, 1, 2, 3, 4]
    assert [t.index for t in task_range(env, "train", 1, 3)] == [1, 2]
    assert [t.index for t in task_range(env, "train", -2)] == [3, 4]
    assert task_range(env, "train", 4, 1) == []
    assert count_tasks(env, "test") == 2


def test_ranges_are_bounded() -> None:
    class Huge(Dataset):
        sizes = {"all": MAX_TASKS_PER_REQUEST + 1}

    with pytest.raises(InvalidArgument, match="in ranges of at most"):
        task_range(Huge(), "all")
    assert len(task_range(Huge(), "all", 1)) == MAX_TASKS_PER_REQUEST


def test_task_ref_from_reset_options() -> None:
    assert task_ref(None, None) is None
    assert task_ref("test", 3) == TaskRef(split="test", index=3)
    for split, index in (("test", None), (None, 1), ("test", True), ("test", -1), ("a b", 0)):
        with pytest.raises(InvalidArgument):
            task_ref(split, index)


def test_split_kinds() -> None:
    assert [split_kind(s) for s in ("train", "test", "validation", "dev")] == [
        "train",
        "test",
        "validation",
        "validation",
    ]
