"""``/render``: the environment's own view hooks over HTTP."""

from __future__ import annotations

import httpx
import pytest
from tests.support.servers import running
from tests.support.web_envs import BrokenViewEnv, CalcEnv

from corral.envs.wordle import WordleEnv
from corral.envs.wordle.env import WordleAction

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def wordle():
    with running(WordleEnv, web=True, max_frame_bytes=4096) as srv:
        yield srv


def _observation() -> dict:
    env = WordleEnv()
    env.reset(seed=3)
    return env.step(WordleAction(guess="crane")).model_dump(mode="json")


async def test_wordle_board_and_suggestions(wordle):
    async with httpx.AsyncClient(base_url=wordle.url) as http:
        assert (await http.get("/render")).json() == {"render_html": True, "web_actions": True}
        reply = await http.post("/render", json={"observation": _observation()})
        assert reply.status_code == 200
        body = reply.json()
        assert body["html"].count('<div class="row">') == 6  # one guess, five empty rows
        assert ">C</span>" in body["html"]
        assert 1 <= len(body["actions"]) <= 3
        for item in body["actions"]:
            assert item["label"] == f"try {item['action']['guess']}"
    assert wordle.manager.active == 0  # the hooks ran on a throwaway instance


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 422, "INVALID_ARGUMENT"),
        (b'{"obs": {}}', 422, "INVALID_ARGUMENT"),
        (b'{"observation": {"guesses_left": "many"}}', 422, "INVALID_ARGUMENT"),
        (b'{"observation": {"message": "' + b"x" * 5000 + b'"}}', 413, "FRAME_TOO_LARGE"),
    ],
    ids=["not-json", "no-observation", "wrong-type", "too-large"],
)
async def test_bad_requests_get_structured_errors(wordle, body, status, code):
    async with httpx.AsyncClient(base_url=wordle.url) as http:
        reply = await http.post("/render", content=body, headers=JSON)
        assert reply.status_code == status
        assert reply.json()["code"] == code
        if body.startswith(b'{"observation": {"guesses'):
            assert reply.json()["details"]["errors"][0]["loc"] == ["guesses_left"]
        # the server lives on
        assert (await http.post("/render", json={"observation": _observation()})).status_code == 200


async def test_env_without_hooks_renders_nothing():
    with running(CalcEnv, web=True) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            assert (await http.get("/render")).json() == {
                "render_html": False,
                "web_actions": False,
            }
            reply = await http.post("/render", json={"observation": {"total": 1.0}})
            assert reply.json() == {"html": None, "actions": []}


async def test_failing_hooks_are_env_errors():
    with running(BrokenViewEnv, web=True) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            raised = await http.post("/render", json={"observation": {"total": 1.0}})
            assert raised.status_code == 500
            assert raised.json()["code"] == "ENV_ERROR"
            assert "no view today" in raised.json()["message"]
            wrong = await http.post("/render", json={"observation": {"total": -1.0}})
            assert wrong.status_code == 500
            assert "returned int, not str" in wrong.json()["message"]
