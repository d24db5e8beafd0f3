"""A corral environment as OpenEnv clients see it: OpenEnv's requests run as ``corral/1``.

Every OpenEnv frame and HTTP call is translated to a corral request
(:class:`~corral.protocol.openenv.ServerTranslator`) and run through the service on a
:class:`~corral.server.openenv.links.LockstepLink`, so corral's rules apply to both
protocols alike:

* ``POST /reset`` (body ``{"seed"?, "episode_id"?, <reset options>}``, may be empty)
  returns the first observation, flattened: ``{"observation", "reward", "done",
  "metadata", "truncated"}``.
* ``POST /step`` (body ``{"action": {...}, "timeout_s"?, "request_id"?}``) returns
  the first step of a fresh episode: corral resets the fresh instance (default
  options) before stepping it, where OpenEnv steps a never-reset instance.
  ``timeout_s`` and ``request_id`` are accepted for OpenEnv compatibility; the server's
  step timeout applies.
* ``GET /state`` returns a fresh instance's state.
* ``POST /mcp`` answers JSON-RPC 2.0 (always HTTP 200): ``tools/list``, ``tools/call``
  (on a fresh instance unless ``params.session_id`` names a session), and OpenEnv's
  ``openenv/session/create`` / ``openenv/session/close``.

Stateless by default, as in OpenEnv: each call opens a fresh session (a fresh instance,
counted against capacity), runs, and closes it; with the ``X-Corral-Session`` header it
runs on that stateful session, under the same lifecycle rules as a WebSocket session
(``409`` ``RESET_REQUIRED`` for a step before reset). Errors are corral's
(:mod:`corral.server.http_errors`).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from corral.contract.tools import Tool, tools_of
from corral.errors import CorralError, UnknownSession, error_from_wire
from corral.protocol.jsonrpc import (
    CallTool,
    CloseRpcSession,
    CreateSession,
    ListTools,
    RpcCode,
    RpcError,
    parse_rpc_bytes,
    plan_rpc,
    rpc_error,
    rpc_result,
    tools_list_result,
)
from corral.protocol.openenv import Call, ToolStep, envelope, error_frame, flatten_observation
from corral.server.http_errors import ERROR_RESPONSES, error_response
from corral.server.openenv.links import (
    SESSION_HEADER,
    LinkRegistry,
    LockstepLink,
    close_result,
)
from corral.server.openenv.personality import Personality
from corral.server.service import EnvService
from corral.server.tasks import TaskCatalog


class ResetBody(BaseModel):
    """``POST /reset``: OpenEnv's reset request (extra keys are reset options)."""

    # Strict: the OpenAPI document says "integer", so ``false`` is not a seed of 0.
    model_config = ConfigDict(extra="allow", strict=True)

    seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="Random seed for the episode."
    )
    episode_id: str | None = Field(
        default=None, max_length=255, description="An id for the episode (if the env takes one)."
    )


class StepBody(BaseModel):
    """``POST /step``: OpenEnv's step request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: dict[str, Any] = Field(description="The action, as the /schema action schema says.")
    timeout_s: float | None = Field(
        default=None, gt=0, description="Accepted for OpenEnv; the server's step timeout applies."
    )
    request_id: str | None = Field(
        default=None, max_length=255, description="Accepted for OpenEnv; not used."
    )


class ObservationReply(BaseModel):
    """A flattened observation, OpenEnv's reset/step response (plus corral's extras)."""

    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    truncated: bool = False


_DOCS: dict[str, dict[str, Any]] = {
    "reset": {
        "response_model": ObservationReply,
        "description": "Start an episode and return its first observation (stateless unless "
        f"the {SESSION_HEADER} header names a session).",
    },
    "step": {
        "response_model": ObservationReply,
        "description": "Apply an action. Stateless: the first step of a fresh episode; with "
        f"the {SESSION_HEADER} header: the next step of that session's episode.",
    },
    "state": {
        "description": "A fresh instance's state (stateless), or the session's with the header."
    },
}


def _reply_response(reply: dict[str, Any]) -> JSONResponse:
    kind = reply.get("type")
    if kind == "result":
        return JSONResponse(flatten_observation(reply["observation"]))
    if kind == "state":
        return JSONResponse(reply["state"])
    return error_response(error_from_wire(reply))


class CorralPersonality(Personality):
    """A corral environment, answering OpenEnv's requests through ``corral/1``."""

    reset_body = ResetBody
    step_body = StepBody
    registry: LinkRegistry[LockstepLink]

    def __init__(self, service: EnvService) -> None:
        super().__init__(service, TaskCatalog(service))
        # Collected here: a tool whose signature cannot be described fails when the app
        # is built, not at the first tools/call.
        self.tools: dict[str, Tool] = dict(tools_of(service.env_type))
        self.registry = LinkRegistry(service, self._link)

    def _link(self, registry: LinkRegistry[LockstepLink]) -> LockstepLink:
        return LockstepLink(self.service, self.tools, registry)

    def open_failure(self, exc: CorralError) -> dict[str, Any]:
        """corral's error frame (OpenEnv's code beside corral's)."""
        return error_frame(exc)

    def attach_failure(self, problem: str) -> dict[str, Any]:
        """An ``UNKNOWN_SESSION`` error frame."""
        return error_frame(UnknownSession(problem))

    def rpc_error(self, code: int, message: str, data: Any = None) -> dict[str, Any]:
        """corral's JSON-RPC error shape."""
        return rpc_error(None, code, message, data)

    def route_docs(self, route: str) -> dict[str, Any]:
        """The answer model, description and error statuses of ``route``."""
        return {**_DOCS[route], "responses": ERROR_RESPONSES}

    async def reset(self, body: BaseModel, session_id: str | None) -> Response:
        """Reset a fresh instance, or the session's."""
        return await self._run([envelope("reset", body.model_dump(exclude_unset=True))], session_id)

    async def step(self, body: BaseModel, session_id: str | None) -> Response:
        """Step the session, or a freshly reset instance."""
        assert isinstance(body, StepBody)
        frame = envelope("step", body.action)
        if session_id is not None:
            return await self._run([frame], session_id)
        return await self._run([envelope("reset", {}), frame], None)

    async def state(self, session_id: str | None) -> Response:
        """A fresh instance's state, or the session's."""
        return await self._run([envelope("state")], session_id)

    async def _run(self, messages: list[dict[str, Any]], session_id: str | None) -> Response:
        """Run ``messages`` (OpenEnv frames) on a session; answer with the last reply."""
        if session_id is not None:
            try:
                link = self.registry.lookup(session_id)
            except CorralError as exc:
                return error_response(exc)
            async with link.lock:
                return await self._exchange(link, messages)
        fresh = self.registry.new_link()
        try:
            await fresh.open()
        except CorralError as exc:
            self.service.manager.stats.error(str(exc.code))
            return error_response(exc)
        try:
            return await self._exchange(fresh, messages)
        finally:
            await fresh.close("stateless HTTP call finished")

    async def _exchange(self, link: LockstepLink, messages: list[dict[str, Any]]) -> Response:
        reply: dict[str, Any] = {}
        for message in messages:
            try:
                inbound = link.translator.parse(message)
            except CorralError as exc:
                link.count_error(str(exc.code))
                return error_response(exc)
            if isinstance(inbound, ToolStep):
                response = await link.answer_rpc(inbound.rpc)
                return JSONResponse(link.translator.tool_reply(inbound, response)["data"])
            assert isinstance(inbound, Call)  # HTTP frames are reset, step or state
            reply = await link.run(inbound.request)
            if reply.get("type") == "error":
                break
        return _reply_response(reply)

    async def mcp(self, body: bytes, session_id: str | None, address: str) -> dict[str, Any]:
        """corral's JSON-RPC: the environment's ``@tool`` methods, OpenEnv's sessions."""
        try:
            plan = plan_rpc(parse_rpc_bytes(body), self.tools, self.service.contract.name)
        except RpcError as exc:
            return exc.response()
        if isinstance(plan, ListTools):
            return rpc_result(plan.id, tools_list_result(self.tools))
        if isinstance(plan, CreateSession):
            try:
                link = await self.registry.create(address)
            except CorralError as exc:
                return _rpc_failure(plan.id, exc)
            assert link.session is not None
            return rpc_result(plan.id, {"session_id": link.session.id})
        if isinstance(plan, CloseRpcSession):
            outcome = await self.registry.close(plan.session_id, "closed over MCP")
            if outcome == "unknown":
                message = self.registry.unknown(plan.session_id)
                return rpc_error(plan.id, RpcCode.INVALID_PARAMS, message)
            return rpc_result(plan.id, close_result(plan.session_id, outcome))
        assert isinstance(plan, CallTool)
        target = plan.session_id or session_id
        if target is not None:
            try:
                found = self.registry.lookup(target)
            except CorralError as exc:
                return rpc_error(plan.id, RpcCode.INVALID_PARAMS, exc.message)
            async with found.lock:
                return await found.call_tool(plan)
        fresh = self.registry.new_link()
        try:
            await fresh.open()
        except CorralError as exc:
            return _rpc_failure(plan.id, exc)
        try:
            return await fresh.call_tool(plan)
        finally:
            await fresh.close("stateless MCP call finished")

    async def metadata(self) -> Response:
        """The environment's name, description, version and contract."""
        service = self.service
        env = service.env_type
        return JSONResponse(
            {
                "name": service.contract.name,
                "description": env.description,
                "readme_content": getattr(env, "readme", None),
                "version": service.contract.version,
                "author": getattr(env, "author", None),
                "documentation_url": getattr(env, "documentation_url", None),
                "contract_version": service.contract.version,
                "fingerprint": service.fingerprint,
                "auto_reset": env.auto_reset,
            }
        )


def _rpc_failure(request_id: Any, exc: CorralError) -> dict[str, Any]:
    data = {"corral_code": str(exc.code), **exc.details}
    return rpc_error(request_id, RpcCode.SERVER_ERROR, exc.message, data)


__all__ = ["CorralPersonality", "ObservationReply", "ResetBody", "StepBody"]
