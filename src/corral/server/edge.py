"""One server's WebSocket edge: the state its transports share, and the deadline sweep.

Every decision is sans-I/O and lives in :mod:`corral.protocol` — the upgrade
(:mod:`~corral.protocol.upgrade`), who may connect (:mod:`~corral.protocol.access`),
incoming frames (:mod:`~corral.protocol.inflow`), back-pressure and close codes
(:mod:`~corral.protocol.outflow`). :class:`Edge` holds the one instance of each that a
server's faces share — the native picows transport, uvicorn's WebSocket protocol under
the ASGI route, the in-process transport — so that, say, the budget of unfinished
messages is one budget whichever transport a peer came through, and a refusal is
counted in the metrics the same way.

:class:`Sweep` is the one timer of the deadlines: every ``tick`` (a quarter of the
shortest deadline step) it hands each open link the time, and the link renders what its
:class:`~corral.protocol.inflow.Inflow` decides (a ping, a close). No timer is armed per
frame or per message, and none at all while no link is open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI

from corral.protocol.access import Refusal, RequestHead
from corral.protocol.inflow import Inflow, PartialBudget, Reassembler
from corral.protocol.outflow import Closing, Outflow
from corral.protocol.upgrade import Accept, UpgradePolicy, admit_upgrade
from corral.server.auth import AccessGuard
from corral.server.config import ServerConfig
from corral.server.http_errors import install_errors

if TYPE_CHECKING:
    from corral.server.service import EnvService

log = logging.getLogger("corral.server")


def hard_frame_limit(config: ServerConfig) -> int:
    """The longest message a WebSocket transport holds: past it the connection closes
    with 1009.

    Twice the protocol's limit (plus room for the envelope), so that a frame over the
    limit is still read whole and answered ``FRAME_TOO_LARGE`` with its request id.
    """
    return config.max_frame_bytes * 2 + 65536


class Swept(Protocol):
    """A link the sweep checks: it asks its inflow and renders the answer."""

    def sweep(self, now: float) -> None:
        """Check the link's deadlines at ``now`` (the loop's clock)."""


class Sweep:
    """One periodic timer over a server's open links (see the module docstring).

    Args:
        tick: seconds between checks (None: no deadline to check; links are not held).
    """

    def __init__(self, tick: float | None) -> None:
        self.tick = tick
        self.links: set[Swept] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, link: Swept) -> None:
        """Check ``link`` from now on (arming the timer if it was idle)."""
        if self.tick is None:
            return
        self.links.add(link)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick, self._run)

    def discard(self, link: Swept) -> None:
        """Stop checking ``link`` (its connection ended)."""
        self.links.discard(link)

    def _run(self) -> None:
        self._timer = None
        if not self.links or self.tick is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for link in list(self.links):
            try:
                link.sweep(now)
            except Exception:  # one broken link must not stop the deadlines of the others
                log.exception("checking a connection's deadlines failed")
        if self.links:
            self._timer = loop.call_later(self.tick, self._run)


class Edge:
    """The edge state of one server, shared by its transports (see the module docstring).

    Args:
        service: the environment service (its gate, registry, config and metrics).
    """

    def __init__(self, service: EnvService) -> None:
        config = service.config
        self.service = service
        self.policy = UpgradePolicy(
            config.access(), service.gate, service.manager.registry, deflate=config.deflate
        )
        self.max_message = hard_frame_limit(config)
        self.budget = PartialBudget(max(config.max_partial_bytes, self.max_message))
        """Unfinished fragmented messages, across every connection of every transport."""
        self.outflow = Outflow(config.max_outgoing_bytes)
        self.limits = config.inflow()
        self.sweep = Sweep(self.limits.tick)

    def admit(self, head: RequestHead, *, fallback: bool = False) -> Accept | Refusal:
        """:func:`~corral.protocol.upgrade.admit_upgrade` for this server, refusals counted."""
        answer = admit_upgrade(head, self.policy, fallback=fallback)
        if isinstance(answer, Refusal):
            self.count(str(answer.error.code))
        return answer

    def inflow(self, now: float, *, compression: bool = False) -> Inflow:
        """The incoming side of a connection opened at ``now`` (``compression``: it
        agreed permessage-deflate, so its messages may arrive compressed)."""
        assembler = Reassembler(self.max_message, self.budget, compression=compression)
        return Inflow(self.limits, assembler, now)

    def closing(self, closing: Closing, address: str) -> None:
        """Count and log a close the server decided (a deadline, a limit, a violation)."""
        if closing.counted is not None:
            self.count(closing.counted)
        log.info("closing the connection of %s (%d): %s", address, closing.code, closing.reason)

    def count(self, code: str) -> None:
        """Count one refusal or forced close under ``code`` in the metrics."""
        self.service.manager.stats.error(code)


def install_edge(
    app: FastAPI, service: EnvService, *, public: Callable[[str], bool] | None = None
) -> Edge:
    """Give ``app`` (serving ``service``) its edge: the access rules on every request and
    WebSocket (:class:`~corral.server.auth.AccessGuard`, outermost, so nothing is read
    before they pass), structured JSON for every HTTP error
    (:func:`~corral.server.http_errors.install_errors`), and the :class:`Edge` its transports
    share (also ``app.state.edge``, where :func:`corral.server.serve.install_front` finds
    it). Call it after every other middleware is added.

    ``public``: paths served without credentials (the web UI's static files).
    """
    edge = Edge(service)
    app.state.edge = edge
    app.add_middleware(AccessGuard, policy=edge.policy.access, public=public, count=edge.count)
    install_errors(app)
    return edge


__all__ = ["Edge", "Sweep", "Swept", "hard_frame_limit", "install_edge"]
