"""An LLM as the policy: any OpenAI-compatible chat-completions endpoint.

    policy = llm_policy("http://127.0.0.1:8000/v1", "qwen2.5-7b", action_type=WordleAction)

Each episode is one conversation. The system message describes the environment; each
observation goes in as JSON, as :func:`corral.contract.readable.observation_text` shows
it to TRL's and MCP's models too (its own fields, arrays as numbers; the first as the
user's message, later ones as the result of the previous tool call); the model answers
by calling the one tool, ``act``, whose parameters are the Action's JSON Schema, forced
with ``tool_choice``. A server that ignores tools may answer with the action as a JSON
object in its text instead. When an action fails (an invalid action, an environment
error) the model is told the error with the unchanged observation, and tries again.

Transient HTTP failures (connection errors, 429, 5xx) are retried with backoff; a
model that gives no usable action after the retries fails the episode with
``POLICY_ERROR``. The conversation kept is bounded (``max_history`` messages after the
first observation).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx
from pydantic import BaseModel

from corral.contract.readable import observation_text
from corral.contract.tasks import TaskRef
from corral.evaluation.policies import Policy, PolicyError

TOOL = "act"
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class LLMClient:
    """Posts chat-completion requests (shared by the episodes of one policy)."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 3,
        temperature: float | None = 0.0,
        max_tokens: int | None = 512,
        backoff: float = 0.5,
    ) -> None:
        self.url = (
            url
            if url.rstrip("/").endswith("/chat/completions")
            else (url.rstrip("/") + "/chat/completions")
        )
        self.model = model
        self.retries = retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.backoff = backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(timeout=timeout, headers=headers, trust_env=False)
        self.requests = 0

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The first choice's message.

        Raises:
            PolicyError: the endpoint failed after the retries, or answered nonsense.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": TOOL}},
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        delay = self.backoff
        for attempt in range(self.retries + 1):
            self.requests += 1
            try:
                reply = await self.http.post(self.url, json=body)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if reply.status_code == 200:
                    return _first_message(reply)
                problem = f"HTTP {reply.status_code}: {reply.text[:300]}"
                if reply.status_code not in _RETRY_STATUS:
                    break
            if attempt < self.retries:
                await asyncio.sleep(delay)
                delay *= 2
        raise PolicyError(f"the LLM endpoint {self.url} failed: {problem}")

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()


class LLMAgent:
    """One episode's conversation with the model."""

    repairs = 2
    """Times the model is asked again when its answer holds no usable action."""

    def __init__(
        self,
        client: LLMClient,
        action_schema: dict[str, Any],
        system: str,
        max_history: int = 40,
    ) -> None:
        self.client = client
        self.tools = [
            {
                "type": "function",
                "function": {
                    "name": TOOL,
                    "description": "Take one action in the environment.",
                    "parameters": action_schema,
                },
            }
        ]
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self.max_history = max_history
        self._call_id: str | None = None
        self._error: str | None = None

    def feedback(self, message: str) -> None:
        """The last action failed with ``message``; the model hears it next turn."""
        self._error = message

    async def __call__(self, observation: BaseModel) -> dict[str, Any]:
        """The model's next action for ``observation`` (as a dict).

        Raises:
            PolicyError: the model gave no action.
        """
        text = observation_text(observation)
        if self._error is not None:
            text = f"That action failed: {self._error}. The observation is unchanged: {text}"
            self._error = None
        if self._call_id is None:
            self.messages.append({"role": "user", "content": text})
        else:
            self.messages.append({"role": "tool", "tool_call_id": self._call_id, "content": text})
        self._trim()
        for attempt in range(self.repairs + 1):
            message = await self.client.complete(self.messages, self.tools)
            try:
                action, call_id = _action_of(message)
                break
            except PolicyError as exc:
                if attempt == self.repairs:
                    raise
                # Tell the model what was wrong with its answer and ask again.
                self.messages.append({"role": "assistant", "content": str(message.get("content"))})
                self.messages.append({"role": "user", "content": f"{exc}. Call {TOOL}."})
        self.messages.append(
            {
                "role": "assistant",
                "content": message.get("content"),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": TOOL, "arguments": json.dumps(action)},
                    }
                ],
            }
        )
        self._call_id = call_id
        return action

    def _trim(self) -> None:
        head, rest = self.messages[:2], self.messages[2:]
        if len(rest) <= self.max_history:
            return
        rest = rest[-self.max_history :]
        while rest and rest[0]["role"] == "tool":  # a tool result must follow its call
            rest = rest[1:]
        self.messages = head + rest


def llm_policy(
    url: str,
    model: str,
    *,
    action_type: type[BaseModel],
    description: str = "",
    api_key: str | None = None,
    temperature: float | None = 0.0,
    max_history: int = 40,
    timeout: float = 120.0,
    retries: int = 3,
) -> tuple[Policy, LLMClient]:
    """A policy asking the model at ``url`` (see the module docstring) and its client
    (close it with ``await client.aclose()``); ``api_key`` defaults to
    ``$OPENAI_API_KEY``."""
    client = LLMClient(
        url,
        model,
        api_key=api_key if api_key is not None else os.environ.get("OPENAI_API_KEY"),
        timeout=timeout,
        retries=retries,
        temperature=temperature,
    )
    schema = action_type.model_json_schema()
    system = (
        f"You act in an environment. {description}".strip()
        + f"\nEach turn you get the observation as JSON. Answer by calling the function "
        f"`{TOOL}` with the action; its parameters follow this JSON Schema:\n" + json.dumps(schema)
    )

    def make(seed: int | None, task: TaskRef | None) -> LLMAgent:
        return LLMAgent(client, schema, system, max_history=max_history)

    return Policy(f"llm:{model}", make), client


def _first_message(reply: httpx.Response) -> dict[str, Any]:
    try:
        message = reply.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PolicyError(
            f"the LLM endpoint answered something that is not a chat completion: {exc!r}"
        ) from None
    if not isinstance(message, dict):
        raise PolicyError("the LLM endpoint's message is not an object")
    return message


def _action_of(message: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The action in a tool call (or, failing that, in the text) and the call's id."""
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        if function.get("name") == TOOL:
            arguments = function.get("arguments")
            try:
                action = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                action = None
            if isinstance(action, dict):
                return action, str(call.get("id") or "call")
            raise PolicyError(f"the model called {TOOL} with {arguments!r}, not an object")
    content = message.get("content")
    if isinstance(content, str):
        try:
            action = json.loads(content.strip().removeprefix("```json").strip("`\n "))
        except ValueError:
            action = None
        if isinstance(action, dict):
            return action, "text"
    raise PolicyError(f"the model gave no action (no {TOOL} call): {str(content)[:200]!r}")
