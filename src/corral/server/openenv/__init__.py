"""OpenEnv support of the server: one folder, one choice, one route each.

Whether the served environment is a corral one or an OpenEnv one is decided once, by
:func:`personality_of`, when the app is built; the :class:`Personality` it returns
answers everything the two kinds answer differently, and every route asks it:

* :mod:`.personality`: the interface;
* :mod:`.lockstep`: a corral environment (OpenEnv's requests run as ``corral/1``);
* :mod:`.peer`: an OpenEnv environment (OpenEnv's semantics, from the installed release);
* :mod:`.links`: one session driven in OpenEnv's lockstep, and the registry of sessions
  HTTP clients address by id;
* :mod:`.routes`: ``/reset``, ``/step``, ``/state``, ``/sessions``, ``/mcp`` (HTTP and
  WebSocket), each defined once;
* :mod:`.sockets`: the ``/ws`` connections without a corral subprotocol, and ``/mcp``'s.

``/schema``, ``/metadata`` (:mod:`corral.server.http`) and the Task API
(:mod:`corral.server.tasks`) are defined once too, and ask the same personality.
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from corral.server.openenv.links import SESSION_HEADER
from corral.server.openenv.lockstep import CorralPersonality
from corral.server.openenv.peer import PeerPersonality
from corral.server.openenv.personality import Personality
from corral.server.openenv.routes import STREAM_PATH, mcp_transport_request, openenv_router
from corral.server.openenv.sockets import VERSION_HEADER, serve_openenv
from corral.server.service import EnvService
from corral.server.ws import FallbackHandler


def personality_of(service: EnvService) -> Personality:
    """The personality of the environment ``service`` serves: the one place that asks.

    An environment adapted from OpenEnv (:mod:`corral.adapters.openenv_env`) carries the
    installed release's semantics as ``openenv_runtime``; any other is a corral one.
    """
    runtime = getattr(service.env_type, "openenv_runtime", None)
    if runtime is not None:
        return PeerPersonality(service, runtime)
    return CorralPersonality(service)


def openenv_fallback(personality: Personality) -> FallbackHandler:
    """The ``/ws`` handler for connections without a corral subprotocol: OpenEnv's."""

    async def handler(websocket: WebSocket) -> None:
        await serve_openenv(websocket, personality)

    return handler


__all__ = [
    "SESSION_HEADER",
    "STREAM_PATH",
    "VERSION_HEADER",
    "Personality",
    "mcp_transport_request",
    "openenv_fallback",
    "openenv_router",
    "personality_of",
]
