"""A scripted stand-in for an OpenAI-compatible chat endpoint (no model is involved).

It answers ``POST /v1/chat/completions`` as a chat model with tool calling does: it checks
that the request carries the ``act`` tool with the action's JSON Schema, records the
request, and calls ``act`` with the action a scripted player picks from the conversation
so far (the observations come as JSON in the user and tool messages):

* :func:`wordle_player` keeps the words consistent with the feedback and guesses the
  first; the first answer of every conversation is a deliberately invalid guess, so the
  client's error feedback is exercised.
* :func:`bandit_player` (``examples/bandit``) pulls levers from 5 upwards until one pays,
  then keeps pulling that one: it reads each observation's ``payout``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

Player = Callable[[list[dict[str, Any]]], dict[str, Any]]
"""The conversation so far → the action to call ``act`` with."""


def _observation(text: str) -> dict[str, Any]:
    """The observation JSON in a message (after a failed action's preamble, if any)."""
    marker = "unchanged: "
    start = text.index(marker) + len(marker) if marker in text else text.index("{")
    observation: dict[str, Any] = json.JSONDecoder().raw_decode(text[start:])[0]
    return observation


def wordle_player(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Wordle: an invalid guess first, then the first word the feedback allows."""
    from corral.envs.wordle import load_words
    from corral.envs.wordle.game import consistent_words

    if len(messages) == 2:  # system + first observation: a wrong answer first
        return {"guess": "toolong"}
    words = load_words()
    for record in _observation(messages[-1]["content"]).get("history", []):
        words = consistent_words(words, record["guess"], record["pattern"])
    return {"guess": words[0] if words else "crane"}


def bandit_player(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The bandit: levers 5, 6, 7... in turn until one pays, then that one again."""
    pulled = [
        json.loads(call["function"]["arguments"])["lever"]
        for message in messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or []
    ]
    paid = [
        lever
        for lever, message in zip(pulled, [m for m in messages if m["role"] == "tool"], strict=True)
        if _observation(message["content"])["payout"] > 0
    ]
    if paid:
        return {"lever": paid[-1]}
    return {"lever": (5 + len(pulled)) % 10}


def standin_app(
    action_type: type[BaseModel] | None = None, player: Player | None = None
) -> tuple[FastAPI, list[dict[str, Any]]]:
    """The app and the list of request bodies it received (Wordle's by default)."""
    if action_type is None:
        from corral.envs.wordle import WordleAction

        action_type = WordleAction
    play = player or wordle_player
    app = FastAPI()
    seen: list[dict[str, Any]] = []
    schema = action_type.model_json_schema()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        tool = body["tools"][0]["function"]
        if tool["name"] != "act" or tool["parameters"] != schema:
            return JSONResponse({"error": {"message": "bad tool"}}, status_code=400)
        messages = body["messages"]
        call = {
            "id": f"call_{len(messages)}",
            "type": "function",
            "function": {"name": "act", "arguments": json.dumps(play(messages))},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            }
        )

    return app, seen
