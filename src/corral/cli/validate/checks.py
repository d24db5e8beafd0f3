"""The plumbing of the ``--url`` checks: one server, its schemas, a WebSocket peer, outcomes.

:class:`Checks` runs each check (:meth:`Checks.check`: pass, fail or skip, never an
exception) and holds what the checks learn on the way (the schemas, a valid action,
``max_sessions``). The suites (:mod:`~corral.cli.validate.http_checks`,
:mod:`~corral.cli.validate.openenv_checks`, :mod:`~corral.cli.validate.corral_checks`)
build on it; :mod:`~corral.cli.validate.remote` runs them in order.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from corral import runtime
from corral.cli.validate.report import Check, Report, Status
from corral.client.connection import http_url, ws_url
from corral.contract.examples import schema_problem
from corral.protocol.codecs import JsonCodec

CORRAL_SUBPROTOCOL = JsonCodec.subprotocol


class CheckFailed(Exception):
    """Raised inside a check: it failed, and the message says how."""


class CheckSkipped(Exception):
    """Raised inside a check: it does not apply to this server, and why."""


def require(condition: bool, message: str) -> None:
    """Fail the running check with ``message`` unless ``condition``."""
    if not condition:
        raise CheckFailed(message)


def as_object(value: Any, message: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else fail with ``message``."""
    if not isinstance(value, dict):
        raise CheckFailed(message)
    return value


@dataclass
class Schemas:
    """The three JSON Schemas the server publishes at ``/schema``."""

    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]


class WsPeer:
    """A WebSocket with JSON frames and bounded waits."""

    def __init__(self, ws: ClientConnection, timeout: float) -> None:
        self.ws = ws
        self.timeout = timeout

    async def send(self, message: dict[str, Any] | str) -> None:
        # A server that closed right after speaking (e.g. CAPACITY_REACHED) refuses the
        # send, but what it said is still buffered: recv() reports it, then the close.
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(message if isinstance(message, str) else json.dumps(message))

    async def recv(self) -> dict[str, Any]:
        try:
            frame = await runtime.wait_for(self.ws.recv(), self.timeout)
        except TimeoutError:
            raise CheckFailed(f"no reply within {self.timeout:g} s") from None
        except ConnectionClosed as exc:
            raise CheckFailed(f"the server closed the connection ({exc})") from None
        try:
            message = orjson.loads(frame)
        except orjson.JSONDecodeError:
            raise CheckFailed(f"the server sent a frame that is not JSON: {frame[:80]!r}") from None
        if not isinstance(message, dict):
            raise CheckFailed("the server sent a frame that is not a JSON object")
        return message

    async def ask(self, message: dict[str, Any] | str) -> dict[str, Any]:
        await self.send(message)
        return await self.recv()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await runtime.wait_for(self.ws.close(), 2.0)


class Checks:
    """One server under check: its URLs, what the checks learned, and the report so far."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        action: dict[str, Any] | None = None,
        capacity_probe: int = 8,
    ) -> None:
        self.base = http_url(url)
        self.ws_url = ws_url(url)
        self.timeout = timeout
        self.given_action = action
        self.capacity_probe = capacity_probe
        self.report = Report(target=self.base)
        self.schemas: Schemas | None = None
        self.max_sessions: int | None = None
        self._action: dict[str, Any] | None = None
        self._action_note = ""
        self._http: httpx.AsyncClient | None = None

    # -- plumbing ------------------------------------------------------------------

    async def check(
        self, check_id: str, protocol: str, title: str, body: Callable[[], Awaitable[str | None]]
    ) -> bool:
        """Run one check; record pass (with the detail it returns), fail or skip."""
        try:
            detail = await runtime.wait_for(body(), self.timeout * 4 + 5)
        except CheckSkipped as exc:
            self._record(check_id, protocol, title, Status.SKIP, str(exc))
            return False
        except CheckFailed as exc:
            self._record(check_id, protocol, title, Status.FAIL, str(exc))
            return False
        except TimeoutError:
            self._record(check_id, protocol, title, Status.FAIL, "the check timed out")
            return False
        except (httpx.HTTPError, OSError, WebSocketException) as exc:
            self._record(check_id, protocol, title, Status.FAIL, f"{type(exc).__name__}: {exc}")
            return False
        except ImportError as exc:  # jsonschema, for the schema checks
            self._record(check_id, protocol, title, Status.FAIL, str(exc))
            return False
        self._record(check_id, protocol, title, Status.PASS, detail or "")
        return True

    def _record(self, cid: str, proto: str, title: str, status: Status, detail: str) -> None:
        self.report.checks.append(Check(cid, proto, title, status, detail))

    @property
    def http(self) -> httpx.AsyncClient:
        assert self._http is not None
        return self._http

    async def _json(self, response: httpx.Response, what: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise CheckFailed(
                f"{what} answered HTTP {response.status_code} with a body that is not JSON: "
                f"{response.text[:120]!r}"
            ) from None

    async def _ws(self, subprotocols: list[str] | None = None) -> ClientConnection:
        return await connect(
            self.ws_url,
            subprotocols=subprotocols,  # type: ignore[arg-type]
            open_timeout=self.timeout,
            ping_interval=None,
            compression=None,
        )

    def _valid_action(self) -> dict[str, Any]:
        if self._action is None:
            raise CheckSkipped(self._action_note or "no valid action is known; pass --action")
        return self._action

    def _need_schemas(self) -> Schemas:
        if self.schemas is None:
            raise CheckSkipped("GET /schema gave no usable schemas")
        return self.schemas

    def _state_conforms(self, state: Any, where: str) -> None:
        require(isinstance(state, dict), f"{where}: the state is not an object")
        if self.schemas is not None:
            problem = schema_problem(self.schemas.state, state)
            require(problem is None, f"{where}: state does not match /schema: {problem}")
