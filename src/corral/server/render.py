"""``/render``: an environment's own view of an observation, for the web UI.

``POST /render`` with ``{"observation": <wire object>}`` answers ``{"html", "actions"}``:
what :meth:`Environment.render_html` and :meth:`Environment.web_actions` return for
that observation (``null`` and ``[]`` when the environment does not define them).
``GET /render`` says which of the two hooks the environment defines, so a client asks
only when there is something to show.

The hooks are called on a short-lived instance of the environment's own (made by the
server's factory, closed right after), never on a session's: they must depend on the
observation alone. They run off the event loop, a few at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from corral.contract import Environment
from corral.errors import CorralError, EnvError, InvalidArgument, validation_message
from corral.protocol.codecs import JsonCodec
from corral.server.service import EnvService
from corral.server.webui import error_reply, read_limited

_CONCURRENT_RENDERS = 2


def hooks_of(env_type: type[Environment[Any, Any, Any]]) -> dict[str, bool]:
    """Which web hooks ``env_type`` overrides."""
    return {
        name: getattr(env_type, name) is not getattr(Environment, name)
        for name in ("render_html", "web_actions")
    }


class Renderer:
    """Runs one environment class's web hooks on throwaway instances."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self.hooks = hooks_of(service.env_type)
        self._codec = JsonCodec()
        self._slots = asyncio.Semaphore(_CONCURRENT_RENDERS)

    def load(self, body: bytes) -> Any:
        """The observation model from a request body.

        Raises:
            InvalidArgument: it is not ``{"observation": ...}`` or does not validate.
        """
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidArgument(f"the body is not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("observation"), dict):
            raise InvalidArgument(
                'send {"observation": {...}}, the observation as /ws delivers it',
                details={"field": "observation"},
            )
        model = self.service.contract.observation
        try:
            return self._codec.load(model, data["observation"])
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False, include_input=False)
            raise InvalidArgument(
                validation_message(f"not a {model.__name__}", exc),
                details={"errors": [{**e, "loc": list(e["loc"])} for e in errors]},
            ) from None

    async def render(self, observation: Any) -> dict[str, Any]:
        """``{"html", "actions"}`` for ``observation``.

        Raises:
            EnvError: building the instance or a hook failed, or returned the wrong type.
        """
        if not any(self.hooks.values()):
            return {"html": None, "actions": []}
        async with self._slots:
            html, actions = await asyncio.to_thread(self._call_hooks, observation)
        return {"html": html, "actions": actions}

    def _call_hooks(self, observation: Any) -> tuple[str | None, list[dict[str, Any]]]:
        name = self.service.env_type.__name__
        try:
            env = self.service.manager.factory()
        except Exception as exc:
            raise EnvError(f"could not make a {name} to render with: {exc}") from None
        try:
            html = env.render_html(observation) if self.hooks["render_html"] else None
            pairs = env.web_actions(observation) if self.hooks["web_actions"] else []
        except Exception as exc:
            raise EnvError(f"{name}'s web hook raised {type(exc).__name__}: {exc}") from None
        finally:
            env.close()
        if html is not None and not isinstance(html, str):
            raise EnvError(f"{name}.render_html() returned {type(html).__name__}, not str")
        return html, [self._action(name, pair) for pair in pairs]

    def _action(self, name: str, pair: Any) -> dict[str, Any]:
        try:
            label, action = pair
            model = self.service.contract.action
            valid = action if isinstance(action, model) else model.model_validate(action)
        except (TypeError, ValueError) as exc:
            raise EnvError(
                f"{name}.web_actions() must return (label, action) pairs of "
                f"{self.service.contract.action.__name__}: {exc}"
            ) from None
        return {"label": str(label), "action": self._codec.dump(valid)}


def render_router(service: EnvService) -> APIRouter:
    """``GET /render`` and ``POST /render`` for ``service``."""
    renderer = Renderer(service)
    router = APIRouter(tags=["web"])

    @router.get("/render", summary="Which web hooks the environment defines")
    async def hooks() -> dict[str, bool]:
        return renderer.hooks

    @router.post("/render", summary="The environment's HTML view and one-click actions")
    async def render(request: Request) -> JSONResponse:
        try:
            body = await read_limited(request, service.config.max_frame_bytes)
            return JSONResponse(await renderer.render(renderer.load(body)))
        except CorralError as exc:
            return error_reply(exc)

    return router
