"""The coding env's problems as train/test tasks: published without their hidden tests."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.envs.coding import TASKS, CodeAction, CodingEnv, CodingTask, Problem, SandboxLimits
from corral.errors import InvalidArgument

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2, test_wall_seconds=2, start_timeout=30)


@pytest.fixture
def env() -> Iterator[CodingEnv]:
    made = CodingEnv(limits=LIMITS)
    yield made
    made.close()


def test_the_problems_form_train_and_test(env: CodingEnv) -> None:
    assert env.splits() == ["train", "test"]
    names = {s: [env.task(s, i).name for i in range(env.num_tasks(s))] for s in env.splits()}
    assert names["test"] == ["roman_to_int", "run_length_encode", "flatten"]
    assert sorted(names["train"] + names["test"]) == sorted(t.name for t in TASKS)


def test_published_tasks_hold_no_hidden_tests(env: CodingEnv) -> None:
    task = env.task("test", 0)
    assert isinstance(task, CodingTask) and task.id == "roman_to_int"
    problem = next(t for t in TASKS if t.name == "roman_to_int")
    assert task.tests == len(problem.cases) and task.signature == problem.signature
    text = task.model_dump_json()
    assert "cases" not in text and "expected" not in text
    assert set(task.model_dump()) == {
        "split",
        "index",
        "id",
        "name",
        "signature",
        "description",
        "examples",
        "tests",
    }


def test_reset_with_a_task(env: CodingEnv) -> None:
    obs = env.reset(split="test", index=2)
    assert obs.task == "flatten" and env.state().task == "flatten"
    with pytest.raises(InvalidArgument, match="both choose the task"):
        env.reset(split="test", index=0, task="fizzbuzz")
    with pytest.raises(InvalidArgument, match="out of range"):
        env.reset(split="test", index=3)
    with pytest.raises(InvalidArgument, match="unknown split"):
        env.reset(split="dev", index=0)


def test_custom_problems_keep_their_split() -> None:
    problem = next(t for t in TASKS if t.name == "fizzbuzz")
    with pytest.raises(ValueError, match="split must be one of"):
        Problem(**{**problem.__dict__, "split": "dev"})


async def test_served_task_routes_and_reset() -> None:
    with running(lambda: CodingEnv(limits=LIMITS)) as srv:
        with httpx.Client(base_url=srv.url) as http:
            assert http.post("/coding/num_tasks", json={"split": "train"}).json() == {
                "num_tasks": 7
            }
            listed = http.post("/coding/tasks", json={"split": "test"}).json()["tasks"]
            assert [t["id"] for t in listed] == ["roman_to_int", "run_length_encode", "flatten"]
            assert all("cases" not in t for t in listed)
        async with AsyncEnvClient(srv.url) as client:
            first = await client.reset(split="test", index=0)
            assert first.observation.task == "roman_to_int"
            result = await client.step(CodeAction(code="def roman_to_int(s):\n    return 0\n"))
            assert result.observation.tests_total == listed[0]["tests"]
