"""Policies: random actions from schemas, loading, and the LLM client's edge cases."""

from __future__ import annotations

import json
import random
from enum import Enum
from typing import Literal

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field
from tests.support.peers import AppThread

from corral.contract import Action, Observation
from corral.envs.wordle import WordleAction, WordleEnv, WordleObservation
from corral.evaluation import LLMAgent, LLMClient, PolicyError, SchemaSampler, load_policy


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


class Inner(Action):
    weight: float = Field(ge=0.5, le=0.75)


class Rich(Action):
    code: str = Field(pattern=r"^[A-F]{2}-\d{3}(x|yz)?$")
    count: int = Field(ge=3, le=5)
    colour: Colour
    mode: Literal["fast", "slow"]
    flags: list[bool] = Field(min_length=2, max_length=2)
    inner: Inner
    maybe: int | None = None
    name: str = Field(min_length=4, max_length=6)


def test_random_actions_are_valid_and_seeded() -> None:
    sampler = SchemaSampler(Rich)
    draws = [sampler.draw(random.Random(7)) for _ in range(2)]
    assert draws[0] == draws[1]  # same seed, same action
    many = [sampler.draw(random.Random(k)) for k in range(40)]
    assert all(isinstance(a, Rich) for a in many)
    assert len({a.code for a in many}) > 10 and {a.mode for a in many} == {"fast", "slow"}


def test_a_schema_that_cannot_be_met_falls_back_to_examples_then_says_so() -> None:
    class Odd(Action):
        model_config = ConfigDict(regex_engine="python-re")
        text: str = Field(pattern=r"^(?!x)\w+$", examples=["ok"])  # a lookahead

    class Impossible(Action):
        model_config = ConfigDict(regex_engine="python-re")
        text: str = Field(pattern=r"^(?=a)b$")

    agent = SchemaSampler(Odd).agent(1)
    assert agent(Observation()).text
    with pytest.raises(PolicyError, match="cannot draw a valid random Impossible"):
        SchemaSampler(Impossible).draw(random.Random(0))


def test_loading_policies() -> None:
    scripted = load_policy("scripted", env=WordleEnv)
    obs = WordleEnv().reset(seed=3)
    assert isinstance(scripted.agent(3)(obs), WordleAction)
    assert scripted.agent(3)(obs) == scripted.agent(3)(obs)
    klass = load_policy("corral.envs.wordle:SimplePolicy")
    assert isinstance(klass.agent(3)(obs), WordleAction)
    with pytest.raises(PolicyError, match="unknown policy"):
        load_policy("greedy")
    with pytest.raises(PolicyError, match="needs the environment class"):
        load_policy("scripted")
    with pytest.raises(PolicyError, match="not a function or class"):
        load_policy("corral.envs.wordle.game:WORD_LENGTH")
    with pytest.raises(PolicyError, match="needs the action model"):
        load_policy("random")


def scripted_endpoint(answers: list[tuple[int, dict]]) -> tuple[FastAPI, list[dict]]:
    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        seen.append(await request.json())
        status, body = answers.pop(0)
        return JSONResponse(body, status_code=status)

    return app, seen


def message(**fields: object) -> dict:
    return {"choices": [{"message": {"role": "assistant", **fields}}]}


def call(arguments: str) -> dict:
    return message(tool_calls=[{"id": "c1", "function": {"name": "act", "arguments": arguments}}])


async def test_the_llm_client_retries_transient_failures_and_repairs_answers() -> None:
    app, seen = scripted_endpoint(
        [
            (503, {"error": "busy"}),
            (429, {"error": "slow down"}),
            (200, message(content="I think crane")),  # no action: asked again
            (200, call("{not json")),  # broken JSON: asked again
            (200, message(content='```json\n{"guess": "slate"}\n```')),  # text JSON is accepted
            (200, call(json.dumps({"guess": "crane"}))),
        ]
    )
    with AppThread(app) as url:
        client = LLMClient(f"{url}/v1", "m", retries=3, api_key="k", backoff=0.01)
        agent = LLMAgent(client, WordleAction.model_json_schema(), "play")
        try:
            assert await agent(WordleObservation(guesses_left=6)) == {"guess": "slate"}
            agent.feedback("INVALID_ACTION: not in the list")
            assert await agent(WordleObservation(guesses_left=6)) == {"guess": "crane"}
        finally:
            await client.aclose()
    assert client.requests == 6
    last = seen[-1]["messages"]
    assert last[-1]["role"] == "tool" and "That action failed" in last[-1]["content"]
    assert "metadata" not in last[-1]["content"]


async def test_the_llm_client_gives_up_with_a_clear_error() -> None:
    app, _ = scripted_endpoint([(400, {"error": "bad model"})] + [(200, message(content="?"))] * 3)
    with AppThread(app) as url:
        client = LLMClient(f"{url}/v1/chat/completions", "m", retries=3, backoff=0.01)
        try:
            with pytest.raises(PolicyError, match="HTTP 400"):  # not retried
                await LLMAgent(client, {}, "play")(WordleObservation())
            with pytest.raises(PolicyError, match="gave no action"):
                await LLMAgent(client, {}, "play")(WordleObservation())
        finally:
            await client.aclose()
