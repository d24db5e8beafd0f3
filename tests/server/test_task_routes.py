"""The task API on a real server: OpenEnv 0.10's routes and shapes, and reset with a task
over corral/1, OpenEnv's WebSocket envelope and OpenEnv's HTTP /reset."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from tests.support.servers import ThreadServer, running

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoEnv
from corral.envs.wordle import WordleEnv
from corral.errors import InvalidArgument

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def wordle() -> Iterator[ThreadServer]:
    with running(WordleEnv) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(wordle: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=wordle.url, timeout=10) as client:
        yield client


def test_discovery_routes_answer_with_openenv_shapes(http: httpx.Client) -> None:
    env = WordleEnv()
    assert http.get("/list_environments").json() == ["wordle"]
    assert http.get("/wordle/splits").json() == [
        {"name": "train", "type": "train"},
        {"name": "test", "type": "test"},
    ]
    count = env.num_tasks("test")
    assert http.post("/wordle/num_tasks", json={"split": "test"}).json() == {"num_tasks": count}
    one = http.post("/wordle/task", json={"split": "test", "index": 7}).json()
    assert one == {
        "task": {"split": "test", "index": 7, "id": "test-7", "word": env.task("test", 7).word}
    }
    listed = http.post("/wordle/tasks", json={"split": "test"}).json()
    assert listed["env_name"] == "wordle" and len(listed["tasks"]) == count
    assert listed["tasks"][7] == one["task"]
    ranged = http.post("/wordle/task_range", json={"split": "test", "start": 5, "stop": 8}).json()
    assert [t["index"] for t in ranged["tasks"]] == [5, 6, 7]
    tail = http.post("/wordle/task_range", json={"split": "train", "start": -2}).json()
    assert [t["index"] for t in tail["tasks"]] == [
        env.num_tasks("train") - 2,
        env.num_tasks("train") - 1,
    ]
    # OpenEnv names environments by class: that name works too, in any case.
    assert http.post("/WORDLEENV/num_tasks", json={"split": "test"}).json() == {"num_tasks": count}


def test_bad_requests_get_corral_errors(http: httpx.Client) -> None:
    unknown = http.get("/chess/splits")
    assert unknown.status_code == 404 and unknown.json()["code"] == "INVALID_ARGUMENT"
    assert unknown.json()["details"]["environments"] == ["wordle"]
    split = http.post("/wordle/num_tasks", json={"split": "dev"})
    assert split.status_code == 404 and "unknown split 'dev'" in split.json()["detail"]
    index = http.post("/wordle/task", json={"split": "test", "index": 100_000})
    assert index.status_code == 400 and index.json()["details"]["reason"] == "index_out_of_range"
    negative = http.post("/wordle/task", json={"split": "test", "index": -1})
    assert negative.status_code == 400
    for body in ({}, {"split": "test", "index": "x"}, {"split": "test", "extra": 1}):
        assert http.post("/wordle/task", json=body).status_code == 422
    assert http.post("/wordle/task", content=b"{nope", headers=JSON).status_code == 422
    assert http.get("/health").json() == {"status": "healthy"}  # the server lives on
    errors = [
        line
        for line in http.get("/metrics").text.splitlines()
        if line.startswith('corral_errors_total{code="INVALID_ARGUMENT"}')
    ]
    assert errors and float(errors[0].split()[-1]) >= 4


def test_an_environment_without_tasks_answers_404() -> None:
    with running(EchoEnv) as srv, httpx.Client(base_url=srv.url) as http:
        assert http.get("/list_environments").json() == ["echo"]
        reply = http.get("/echo/splits")
        assert reply.status_code == 404 and reply.json()["details"] == {"reason": "no_tasks"}
        assert http.post("/echo/task", json={"split": "x", "index": 0}).status_code == 404


def test_the_task_routes_are_in_the_openapi_document(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    for path in (
        "/list_environments",
        "/{env_name}/splits",
        "/{env_name}/tasks",
        "/{env_name}/num_tasks",
        "/{env_name}/task",
        "/{env_name}/task_range",
    ):
        assert path in paths  # fmt: skip


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_reset_with_a_task_over_corral(wordle: ThreadServer, codec: str) -> None:
    word = WordleEnv().task("test", 3).word
    async with AsyncEnvClient(wordle.url, env=WordleEnv, codec=codec) as env:
        await env.reset(split="test", index=3)
        state = await env.state()
        assert state.secret == word and state.task == "test-3"
        with pytest.raises(InvalidArgument, match="out of range"):
            await env.reset(split="test", index=99_999)
        with pytest.raises(InvalidArgument, match="unknown split"):
            await env.reset(split="validation", index=0)
        await env.reset(split="train", index=0)  # the session lives on
        assert (await env.state()).task == "train-0"


async def test_reset_with_a_task_over_openenvs_websocket(wordle: ThreadServer) -> None:
    # Imported here: openenv imports gradio (seconds of CPU), and every worker collects this.
    from openenv.core.generic_client import GenericEnvClient

    word = WordleEnv().task("test", 3).word
    async with GenericEnvClient(base_url=wordle.url) as env:
        await env.reset(split="test", index=3)
        result = await env.step({"guess": word})
        assert result.done and result.observation["secret"] == word
        with pytest.raises(RuntimeError, match="out of range"):
            await env.reset(split="test", index=99_999)


def test_reset_with_a_task_over_openenvs_http(http: httpx.Client) -> None:
    reply = http.post("/reset", json={"split": "test", "index": 3})
    assert reply.status_code == 200 and reply.json()["observation"]["guesses_left"] == 6
    bad = http.post("/reset", json={"split": "test", "index": 99_999})
    assert bad.status_code == 422 and bad.json()["code"] == "INVALID_ARGUMENT"
