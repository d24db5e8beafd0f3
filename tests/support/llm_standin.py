"""A scripted stand-in for an OpenAI-compatible chat endpoint (no model is involved).

It plays Wordle: from the observation in the last message it keeps the words consistent
with the feedback and guesses the first. The first answer of every conversation is a
deliberately invalid guess, so the client's error feedback is exercised. It checks that
requests carry the ``act`` tool with the action's schema, and records them.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from corral.envs.wordle import WordleAction, load_words
from corral.envs.wordle.game import consistent_words


def standin_app() -> tuple[FastAPI, list[dict[str, Any]]]:
    """The app and the list of request bodies it received."""
    app = FastAPI()
    seen: list[dict[str, Any]] = []
    schema = WordleAction.model_json_schema()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        tool = body["tools"][0]["function"]
        if tool["name"] != "act" or tool["parameters"] != schema:
            return JSONResponse({"error": {"message": "bad tool"}}, status_code=400)
        messages = body["messages"]
        if len(messages) == 2:  # system + first observation: a wrong answer first
            guess = "toolong"
        else:
            text = messages[-1]["content"]
            marker = "unchanged: "
            start = text.index(marker) + len(marker) if marker in text else text.index("{")
            observation = json.loads(text[start:])
            words = load_words()
            for record in observation.get("history", []):
                words = consistent_words(words, record["guess"], record["pattern"])
            guess = words[0] if words else "crane"
        call = {
            "id": f"call_{len(messages)}",
            "type": "function",
            "function": {"name": "act", "arguments": json.dumps({"guess": guess})},
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
