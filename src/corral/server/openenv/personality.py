"""The one interface between the routes and the kind of environment served.

"Is this a corral environment or an OpenEnv one?" is asked once, by
:func:`corral.server.openenv.personality_of` when the app is built; the answer is a
:class:`Personality`, and every route, socket and link of the server calls it instead of
asking again:

* :class:`~corral.server.openenv.lockstep.CorralPersonality`: a corral environment;
  OpenEnv's frames and HTTP calls are translated to ``corral/1`` and run through the
  service (corral's lifecycle, corral's error codes with OpenEnv's beside them);
* :class:`~corral.server.openenv.peer.PeerPersonality`: an environment written for
  OpenEnv; OpenEnv clients get OpenEnv's semantics, computed by the installed release.

Both publish one contract: ``GET /schema`` is the service's contract (the models corral
clients get in the handshake, with its version and fingerprint), whatever the kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.errors import CorralError
from corral.server.openenv.links import LinkRegistry
from corral.server.service import EnvService
from corral.server.tasks import TaskAnswers


class Personality(ABC):
    """How the served environment answers what the two kinds answer differently.

    Attributes:
        service: the environment service.
        registry: the server's OpenEnv sessions (links of this personality's kind).
        tasks: the answers of the Task API routes.
        reset_body / step_body: the body models of ``POST /reset`` and ``POST /step``
            (FastAPI validates and documents bodies with them).
    """

    reset_body: type[BaseModel]
    step_body: type[BaseModel]
    registry: LinkRegistry[Any]

    def __init__(self, service: EnvService, tasks: TaskAnswers) -> None:
        self.service = service
        self.tasks = tasks

    # -- sessions and sockets --------------------------------------------------------

    @abstractmethod
    def open_failure(self, exc: CorralError) -> dict[str, Any]:
        """The ``/ws`` frame saying a session could not be opened (then close 1000)."""

    @abstractmethod
    def attach_failure(self, problem: str) -> dict[str, Any]:
        """The ``/ws`` frame refusing ``?session_id=`` (no such session, or taken)."""

    @abstractmethod
    def rpc_error(self, code: int, message: str, data: Any = None) -> dict[str, Any]:
        """A JSON-RPC error response with no request id (``/mcp`` socket failures)."""

    # -- HTTP: one route each, answered here -------------------------------------------

    def route_docs(self, route: str) -> dict[str, Any]:
        """Extra OpenAPI keywords (``response_model``, ``responses``, ``description``) of
        ``route`` (``reset``, ``step``, ``state``)."""
        return {}

    @abstractmethod
    async def reset(self, body: BaseModel, session_id: str | None) -> Response:
        """``POST /reset``: a fresh instance's first observation, or the session's."""

    @abstractmethod
    async def step(self, body: BaseModel, session_id: str | None) -> Response:
        """``POST /step``: stateless, or the next step of the session's episode."""

    @abstractmethod
    async def state(self, session_id: str | None) -> Response:
        """``GET /state``: a fresh instance's state, or the session's."""

    @abstractmethod
    async def mcp(self, body: bytes, session_id: str | None, address: str) -> dict[str, Any]:
        """The JSON-RPC answer of ``POST /mcp`` (always HTTP 200)."""

    def schema(self) -> dict[str, Any]:
        """``GET /schema``: the one contract, as the corral/1 handshake gives it.

        The JSON Schemas of Action, Observation and the environment's real State, the
        contract version and the fingerprint (the hash of those three schemas).
        """
        service = self.service
        return {
            **service.contract.schemas,
            "contract_version": service.contract.version,
            "fingerprint": service.fingerprint,
        }

    @abstractmethod
    async def metadata(self) -> Response:
        """``GET /metadata``."""

    def own_routes(self) -> list[BaseRoute]:
        """Routes the environment's own code serves beside the standard ones."""
        return []

    async def close(self) -> None:
        """Release what the answers hold (the task catalog's instance), with the app."""
        await self.tasks.close()


__all__ = ["Personality"]
