"""``corral validate``: black-box conformance checks of a running server.

    corral validate --url http://127.0.0.1:8000          # a table; exit 1 on failure
    corral validate --url http://127.0.0.1:8000 --json   # the report as JSON

The runtime mode (:func:`validate_url`) connects over HTTP and WebSocket, detects
whether the server speaks ``corral/1``, OpenEnv's envelope or both, and runs scripted
checks for each: the handshake, reset/step/state with replies validated against the
server's own ``/schema`` (``jsonschema``), every error code it can provoke from
outside, capacity behaviour and close. A valid action is synthesized from the action
schema (``--action`` supplies one when the schema is too clever for that).

A static mode (``corral validate [PATH]``: an environment's directory and manifest, the
current directory by default, checked statically and then run through a provider) plugs
in through :data:`STATIC_VALIDATOR` (:mod:`corral.cli.validate_local`); both modes
produce a :class:`Report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import orjson
import typer
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from corral.client.connection import http_url, ws_url
from corral.contract.schema import fingerprint
from corral.protocol.codecs import JsonCodec

CORRAL_SUBPROTOCOL = JsonCodec.subprotocol


class Status(StrEnum):
    """The outcome of one check."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass
class Check:
    """One check's outcome: ``protocol`` is ``http``, ``openenv``, ``corral`` or ``static``."""

    id: str
    protocol: str
    title: str
    status: Status
    detail: str = ""


@dataclass
class Report:
    """All checks of one validation run."""

    target: str
    protocols: dict[str, bool] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No check failed (skipped checks do not count)."""
        return all(check.status is not Status.FAIL for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        """The failed checks."""
        return [check for check in self.checks if check.status is Status.FAIL]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-compatible dict."""
        counts = {s.value: sum(c.status is s for c in self.checks) for s in Status}
        return {
            "target": self.target,
            "protocols": self.protocols,
            "passed": self.passed,
            "summary": counts,
            "checks": [
                {
                    "id": c.id,
                    "protocol": c.protocol,
                    "title": c.title,
                    "status": c.status.value,
                    "detail": c.detail,
                }
                for c in self.checks
            ],
        }


StaticValidator = Callable[..., Report]
STATIC_VALIDATOR: StaticValidator | None = None
"""The static mode, set by the module that implements it; called as
``STATIC_VALIDATOR(path, **options)`` with the options of that mode (``runtime``,
``docker``, ``image``, ``venv``, ``sandbox``, ``network``, ``action``, ``seed``,
``steps``, ``timeout``)."""


class CheckFailed(Exception):
    """Raised inside a check: it failed, and the message says how."""


class CheckSkipped(Exception):
    """Raised inside a check: it does not apply to this server, and why."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def _dict(value: Any, message: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else fail with ``message``."""
    if not isinstance(value, dict):
        raise CheckFailed(message)
    return value


# -- JSON Schema helpers -------------------------------------------------------------


def _validator(schema: dict[str, Any]) -> Any:
    try:
        from jsonschema import Draft202012Validator
    except ImportError:  # pragma: no cover - depends on the installation
        raise CheckFailed("schema checks need jsonschema: pip install 'corral[validate]'") from None
    return Draft202012Validator(schema)


def schema_problem(schema: dict[str, Any], instance: Any) -> str | None:
    """The first way ``instance`` violates ``schema`` (``"path: message"``), or None."""
    errors = sorted(_validator(schema).iter_errors(instance), key=lambda e: list(e.path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.path) or "(root)"
    return f"{where}: {first.message}"


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = schema
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _resolve(schema, target) if isinstance(target, dict) else {}
    return node


def example_for(schema: dict[str, Any], node: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A small instance of ``node`` (default: the whole ``schema``), or raise ValueError.

    Uses ``examples``/``default``/``const``/``enum`` where the schema gives them, else
    the smallest value its constraints allow. The caller validates the result.
    """
    node = _resolve(schema, schema if node is None else node)
    if depth > 12:
        raise ValueError("schema nests too deeply to synthesize an example")
    for key in ("examples",):
        if isinstance(node.get(key), list) and node[key]:
            return node[key][0]
    if "const" in node:
        return node["const"]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return node["enum"][0]
    if "default" in node:
        return node["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = node.get(key)
        if isinstance(options, list) and options:
            for option in options:
                with contextlib.suppress(ValueError):
                    return example_for(schema, option, depth + 1)
            raise ValueError(f"no {key} branch could be synthesized")
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in node:
        props = node.get("properties", {})
        return {
            name: example_for(schema, props.get(name, {}), depth + 1)
            for name in node.get("required", [])
        }
    if kind == "string":
        return "a" * max(1, int(node.get("minLength", 1)))
    if kind in ("integer", "number"):
        low = node.get("minimum", node.get("exclusiveMinimum", 0))
        value = low + 1 if "exclusiveMinimum" in node else low
        high = node.get("maximum")
        if high is not None and value > high:
            value = high
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "array":
        items = node.get("items", {})
        return [example_for(schema, items, depth + 1) for _ in range(int(node.get("minItems", 0)))]
    if kind == "null":
        return None
    raise ValueError(f"cannot synthesize a value for schema {node!r}")


def invalid_action_for(schema: dict[str, Any], valid: dict[str, Any]) -> dict[str, Any] | None:
    """An action the schema rejects (an unknown field, or a mistyped one), or None."""
    candidates: list[dict[str, Any]] = []
    if schema.get("additionalProperties") is False:
        candidates.append({**valid, "__corral_validate_unknown__": 1})
    for name, prop in schema.get("properties", {}).items():
        kind = _resolve(schema, prop).get("type")
        wrong = {"string": 12345, "integer": "x", "number": "x", "boolean": "x"}.get(str(kind))
        if wrong is not None:
            candidates.append({**valid, name: wrong})
            candidates.append({**valid, name: [[], {}]})
    for candidate in candidates:
        if schema_problem(schema, candidate) is not None:
            return candidate
    return None


# -- the runtime checks ------------------------------------------------------------


@dataclass
class _Schemas:
    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]


class _WsPeer:
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
            frame = await asyncio.wait_for(self.ws.recv(), self.timeout)
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
            await asyncio.wait_for(self.ws.close(), 2.0)


class Validator:
    """Runs the runtime checks against one server (see :func:`validate_url`)."""

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
        self.schemas: _Schemas | None = None
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
            detail = await asyncio.wait_for(body(), self.timeout * 4 + 5)
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

    def _need_schemas(self) -> _Schemas:
        if self.schemas is None:
            raise CheckSkipped("GET /schema gave no usable schemas")
        return self.schemas

    # -- run -------------------------------------------------------------------------

    async def run(self) -> Report:
        """Run every applicable check and return the report."""
        async with httpx.AsyncClient(
            base_url=self.base, timeout=self.timeout, trust_env=False
        ) as http:
            self._http = http
            await self._http_checks()
            corral = await self._detect_corral()
            openenv = await self._detect_openenv()
            self.report.protocols = {"corral": corral, "openenv": openenv}
            if not (corral or openenv):
                self._record(
                    "detect",
                    "http",
                    "The server speaks corral/1 or OpenEnv on /ws",
                    Status.FAIL,
                    f"{self.ws_url} answered neither corral/1 (subprotocol {CORRAL_SUBPROTOCOL}) "
                    "nor OpenEnv's envelope",
                )
            if openenv:
                await self._openenv_http_checks()
                await self._openenv_ws_checks()
            if corral:
                await self._corral_checks()
        return self.report

    # -- HTTP basics -----------------------------------------------------------------

    async def _http_checks(self) -> None:
        async def openapi() -> str:
            response = await self.http.get("/openapi.json")
            _require(response.status_code == 200, f"GET /openapi.json: HTTP {response.status_code}")
            body = await self._json(response, "GET /openapi.json")
            version = body.get("info", {}).get("version") if isinstance(body, dict) else None
            if not isinstance(version, str):
                raise CheckFailed("GET /openapi.json has no info.version string")
            _require(
                version.startswith("1."),
                f"info.version is {version!r}; OpenEnv clients expect the 1.x profile",
            )
            return f"info.version {version}"

        async def health() -> str:
            response = await self.http.get("/health")
            body = await self._json(response, "GET /health")
            _require(
                response.status_code == 200 and isinstance(body, dict),
                f"GET /health: HTTP {response.status_code}",
            )
            _require(
                body.get("status") == "healthy",
                f'GET /health must return {{"status": "healthy"}}, got {body!r}',
            )
            return ""

        async def metadata() -> str:
            response = await self.http.get("/metadata")
            body = await self._json(response, "GET /metadata")
            _require(response.status_code == 200, f"GET /metadata: HTTP {response.status_code}")
            _require(isinstance(body, dict), "GET /metadata must return an object")
            for key in ("name", "description"):
                _require(isinstance(body.get(key), str), f"GET /metadata: {key!r} is not a string")
            return f"name {body['name']!r}"

        async def schema() -> str:
            response = await self.http.get("/schema")
            body = await self._json(response, "GET /schema")
            _require(response.status_code == 200, f"GET /schema: HTTP {response.status_code}")
            _require(isinstance(body, dict), "GET /schema must return an object")
            parts = {}
            for key in ("action", "observation", "state"):
                value = body.get(key)
                _require(isinstance(value, dict), f"GET /schema: {key!r} is not an object")
                try:
                    _validator(value).check_schema(value)
                except Exception as exc:
                    message = f"GET /schema: {key!r} is not a valid JSON Schema: {exc}"
                    raise CheckFailed(message) from None
                parts[key] = value
            self.schemas = _Schemas(**parts)
            self._choose_action()
            return self._action_note

        async def ready() -> str:
            response = await self.http.get("/ready")
            if response.status_code == 404:
                raise CheckSkipped("no /ready route (not a corral server)")
            body = await self._json(response, "GET /ready")
            _require(isinstance(body, dict), "GET /ready must return an object")
            _require(
                response.status_code in (200, 503),
                f"GET /ready: HTTP {response.status_code} (expected 200 or 503)",
            )
            _require(
                (response.status_code == 200) == bool(body.get("ready")),
                "GET /ready: the status code disagrees with 'ready'",
            )
            if isinstance(body.get("max_sessions"), int):
                self.max_sessions = body["max_sessions"]
            return f"{body.get('active_sessions')}/{body.get('max_sessions')} sessions"

        await self.check("http.openapi", "http", "OpenAPI document, info.version 1.x", openapi)
        await self.check("http.health", "http", "GET /health is healthy", health)
        await self.check(
            "http.metadata", "http", "GET /metadata has name and description", metadata
        )
        await self.check("http.schema", "http", "GET /schema has three JSON Schemas", schema)
        await self.check("http.ready", "http", "GET /ready reports readiness", ready)

    def _choose_action(self) -> None:
        assert self.schemas is not None
        schema = self.schemas.action
        if self.given_action is not None:
            problem = schema_problem(schema, self.given_action)
            if problem is not None:
                raise CheckFailed(f"--action does not match the action schema: {problem}")
            self._action, self._action_note = self.given_action, "using --action"
            return
        try:
            candidate = example_for(schema)
        except ValueError as exc:
            self._action_note = f"cannot synthesize an action ({exc}); pass --action JSON"
            return
        problem = (
            schema_problem(schema, candidate) if isinstance(candidate, dict) else "not an object"
        )
        if problem is not None:
            self._action_note = (
                f"the synthesized action {candidate!r} fails the schema ({problem}); "
                "pass --action JSON"
            )
            return
        self._action, self._action_note = candidate, f"synthesized action {candidate!r}"

    # -- detection -------------------------------------------------------------------

    async def _detect_corral(self) -> bool:
        try:
            ws = await self._ws([CORRAL_SUBPROTOCOL])
        except (InvalidStatus, OSError, TimeoutError, WebSocketException):
            return False
        try:
            return ws.subprotocol == CORRAL_SUBPROTOCOL
        finally:
            await _WsPeer(ws, self.timeout).close()

    async def _openenv_peer(self, settle: float = 2.0) -> tuple[_WsPeer, dict[str, Any]]:
        """An OpenEnv connection and its answer to ``state``.

        Retries for ``settle`` seconds while the server reports CAPACITY_REACHED: it
        frees the slot of a connection this checker just closed only once it saw it go.
        """
        deadline = time.monotonic() + settle
        while True:
            peer = _WsPeer(await self._ws(), self.timeout)
            _require(peer.ws.subprotocol is None, "the server chose a subprotocol nobody offered")
            reply = await peer.ask({"type": "state"})
            data = reply.get("data")
            code = data.get("code") if isinstance(data, dict) else None
            busy = reply.get("type") == "error" and code == "CAPACITY_REACHED"
            if busy and time.monotonic() < deadline:
                await peer.close()
                await asyncio.sleep(0.1)
                continue
            return peer, reply

    async def _detect_openenv(self) -> bool:
        try:
            peer, reply = await self._openenv_peer()
        except (CheckFailed, InvalidStatus, OSError, TimeoutError, WebSocketException):
            return False
        await peer.close()
        return reply.get("type") in ("state", "error") and "data" in reply

    # -- OpenEnv ---------------------------------------------------------------------

    def _flat_observation(self, data: Any, where: str) -> dict[str, Any]:
        _require(isinstance(data, dict), f"{where}: data is not an object")
        obs = data.get("observation")
        _require(isinstance(obs, dict), f"{where}: data has no 'observation' object")
        _require(isinstance(data.get("done"), bool), f"{where}: data.done is not a boolean")
        reward = data.get("reward")
        _require(
            reward is None or (isinstance(reward, (int, float))),
            f"{where}: data.reward is not a number or null",
        )
        for lifted in ("done", "reward"):
            _require(
                lifted not in obs,
                f"{where}: data.observation still carries {lifted!r} (OpenEnv lifts it out)",
            )
        whole = {**obs, "done": data["done"], "reward": reward}
        for key in ("metadata", "truncated"):
            if key in data:
                whole[key] = data[key]
        if self.schemas is not None:
            problem = schema_problem(self.schemas.observation, whole)
            _require(problem is None, f"{where}: observation does not match /schema: {problem}")
        return whole

    def _state_conforms(self, state: Any, where: str) -> None:
        _require(isinstance(state, dict), f"{where}: the state is not an object")
        if self.schemas is not None:
            problem = schema_problem(self.schemas.state, state)
            _require(problem is None, f"{where}: state does not match /schema: {problem}")

    async def _openenv_http_checks(self) -> None:
        async def routes() -> str:
            body = (await self.http.get("/openapi.json")).json()
            paths = body.get("paths", {}) if isinstance(body, dict) else {}
            missing = [p for p in ("/reset", "/step", "/state") if p not in paths]
            _require(not missing, f"OpenAPI paths lack {missing} (OpenEnv simulation mode)")
            return ""

        async def reset() -> str:
            response = await self.http.post("/reset", json={})
            body = await self._json(response, "POST /reset")
            _require(
                response.status_code == 200, f"POST /reset: HTTP {response.status_code}: {body}"
            )
            self._flat_observation(body, "POST /reset")
            return ""

        async def step() -> str:
            action = self._valid_action()
            response = await self.http.post("/step", json={"action": action})
            body = await self._json(response, "POST /step")
            _require(
                response.status_code == 200, f"POST /step: HTTP {response.status_code}: {body}"
            )
            self._flat_observation(body, "POST /step")
            return ""

        async def step_invalid() -> str:
            schemas = self._need_schemas()
            bad = invalid_action_for(schemas.action, self._valid_action())
            if bad is None:
                raise CheckSkipped("cannot build an action the schema rejects")
            response = await self.http.post("/step", json={"action": bad})
            _require(
                response.status_code == 422,
                f"POST /step with an invalid action: HTTP {response.status_code} (expected 422)",
            )
            return ""

        async def state() -> str:
            response = await self.http.get("/state")
            body = await self._json(response, "GET /state")
            _require(response.status_code == 200, f"GET /state: HTTP {response.status_code}")
            self._state_conforms(body, "GET /state")
            return ""

        async def mcp() -> str:
            response = await self.http.post("/mcp", json={})
            body = await self._json(response, "POST /mcp")
            _require(response.status_code == 200, f"POST /mcp: HTTP {response.status_code}")
            _require(
                isinstance(body, dict) and body.get("jsonrpc") == "2.0",
                "POST /mcp {} must answer a JSON-RPC 2.0 object",
            )
            error = body.get("error")
            _require(
                isinstance(error, dict) and error.get("code") == -32600,
                f"POST /mcp {{}} must be an Invalid Request error (-32600), got {body}",
            )
            listed = await self.http.post(
                "/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 1}
            )
            reply = await self._json(listed, "POST /mcp tools/list")
            _require(
                isinstance(reply, dict) and reply.get("id") == 1,
                "tools/list must echo the request id",
            )
            if "result" in reply:
                tools = _dict(reply["result"], "tools/list result is not an object").get("tools")
                if not isinstance(tools, list):
                    raise CheckFailed("tools/list result has no 'tools' list")
                return f"{len(tools)} tool(s)"
            _require(
                isinstance(reply.get("error"), dict)
                and isinstance(reply["error"].get("code"), int),
                "tools/list answered neither a result nor a JSON-RPC error",
            )
            return f"no tools ({reply['error'].get('message')})"

        await self.check("openenv.http.routes", "openenv", "/reset /step /state in OpenAPI", routes)
        await self.check("openenv.http.reset", "openenv", "POST /reset observation", reset)
        await self.check("openenv.http.step", "openenv", "POST /step observation", step)
        await self.check(
            "openenv.http.step_invalid", "openenv", "POST /step invalid action: 422", step_invalid
        )
        await self.check("openenv.http.state", "openenv", "GET /state conforms", state)
        await self.check("openenv.http.mcp", "openenv", "POST /mcp speaks JSON-RPC 2.0", mcp)

    async def _openenv_ws_checks(self) -> None:
        peer: _WsPeer | None = None

        async def connect_() -> str:
            nonlocal peer
            peer, reply = await self._openenv_peer()
            _require(reply.get("type") == "state", f"'state' was answered with {reply}")
            self._state_conforms(reply.get("data"), "state before reset")
            return ""

        def live() -> _WsPeer:
            if peer is None:
                raise CheckSkipped("no OpenEnv session")
            return peer

        async def reset() -> str:
            reply = await live().ask({"type": "reset", "data": {"seed": 1}})
            _require(reply.get("type") == "observation", f"'reset' was answered with {reply}")
            self._flat_observation(reply.get("data"), "reset reply")
            return ""

        async def step() -> str:
            reply = await live().ask({"type": "step", "data": self._valid_action()})
            _require(reply.get("type") == "observation", f"'step' was answered with {reply}")
            self._flat_observation(reply.get("data"), "step reply")
            return ""

        async def state() -> str:
            reply = await live().ask({"type": "state"})
            _require(reply.get("type") == "state", f"'state' was answered with {reply}")
            self._state_conforms(reply.get("data"), "state reply")
            return ""

        async def expect_error(frame: dict[str, Any] | str, code: str) -> dict[str, Any]:
            reply = await live().ask(frame)
            _require(reply.get("type") == "error", f"expected an error frame, got {reply}")
            data = _dict(reply.get("data"), f"the error frame has no data object: {reply}")
            _require(data.get("code") == code, f"expected code {code}, got {data.get('code')!r}")
            _require(isinstance(data.get("message"), str), "the error has no 'message' string")
            after = await live().ask({"type": "state"})
            _require(
                after.get("type") == "state",
                f"the session did not survive the {code} error (next 'state' got {after})",
            )
            return data

        async def invalid_json() -> str:
            await expect_error("{not json", "INVALID_JSON")
            return ""

        async def unknown_type() -> str:
            await expect_error({"type": "__corral_validate__"}, "UNKNOWN_TYPE")
            return ""

        async def validation() -> str:
            schemas = self._need_schemas()
            bad = invalid_action_for(schemas.action, self._valid_action())
            if bad is None:
                raise CheckSkipped("cannot build an action the schema rejects")
            data = await expect_error({"type": "step", "data": bad}, "VALIDATION_ERROR")
            _require(isinstance(data.get("errors"), list), "VALIDATION_ERROR has no 'errors' list")
            return ""

        async def close() -> str:
            session = live()
            await session.send({"type": "close"})
            try:
                extra = await asyncio.wait_for(session.ws.recv(), self.timeout)
            except ConnectionClosed:
                code = session.ws.close_code
                _require(code == 1000, f"the server closed with code {code}, expected 1000")
                return ""
            except TimeoutError:
                raise CheckFailed(f"the server did not close within {self.timeout:g} s") from None
            raise CheckFailed(f"'close' must get no reply, got {extra!r}")

        async def capacity() -> str:
            return await self._openenv_capacity()

        try:
            if await self.check(
                "openenv.ws.connect", "openenv", "OpenEnv session on /ws", connect_
            ):
                await self.check("openenv.ws.reset", "openenv", "reset → observation", reset)
                await self.check("openenv.ws.step", "openenv", "step → observation", step)
                await self.check("openenv.ws.state", "openenv", "state → state", state)
                await self.check(
                    "openenv.ws.INVALID_JSON", "openenv", "bad JSON → INVALID_JSON", invalid_json
                )
                await self.check(
                    "openenv.ws.UNKNOWN_TYPE",
                    "openenv",
                    "unknown type → UNKNOWN_TYPE",
                    unknown_type,
                )
                await self.check(
                    "openenv.ws.VALIDATION_ERROR",
                    "openenv",
                    "invalid action → VALIDATION_ERROR",
                    validation,
                )
                await self.check("openenv.ws.close", "openenv", "close → closed 1000", close)
        finally:
            if peer is not None:
                await peer.close()
        await self.check(
            "openenv.ws.CAPACITY_REACHED", "openenv", "full server → CAPACITY_REACHED", capacity
        )

    async def _openenv_capacity(self) -> str:
        if self.max_sessions is not None and self.max_sessions > self.capacity_probe:
            raise CheckSkipped(
                f"max_sessions is {self.max_sessions}, above --capacity-probe {self.capacity_probe}"
            )
        peers: list[_WsPeer] = []
        try:
            for index in range(self.capacity_probe + 1):
                peer, reply = await self._openenv_peer(settle=2.0 if index == 0 else 0.0)
                peers.append(peer)
                if reply.get("type") == "state":
                    continue
                data = _dict(reply.get("data"), f"connection {index + 1}: got {reply}")
                _require(
                    data.get("code") == "CAPACITY_REACHED",
                    f"connection {index + 1} was refused with {data.get('code')!r}",
                )
                for key in ("active_sessions", "max_sessions"):
                    _require(
                        isinstance(data.get(key), int), f"CAPACITY_REACHED has no integer {key!r}"
                    )
                try:
                    await asyncio.wait_for(peer.ws.recv(), self.timeout)
                except ConnectionClosed:
                    _require(
                        peer.ws.close_code == 1000,
                        f"closed with {peer.ws.close_code} after CAPACITY_REACHED, expected 1000",
                    )
                except TimeoutError:
                    raise CheckFailed("the server kept a refused connection open") from None
                else:
                    raise CheckFailed("the server sent more frames after CAPACITY_REACHED")
                counts = f"{data['active_sessions']}/{data['max_sessions']}"
                return f"refused connection {index + 1} ({counts})"
        finally:
            for peer in peers:
                await peer.close()
        raise CheckSkipped(f"{self.capacity_probe + 1} sessions did not fill the server")

    # -- corral/1 --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _corral(self, hello: bool = True) -> Any:
        ws = await self._ws([CORRAL_SUBPROTOCOL])
        peer = _CorralPeer(ws, self.timeout)
        try:
            if hello:
                reply = await peer.request({"type": "hello", "protocol": "corral/1"})
                _require(reply.get("type") == "welcome", f"hello was answered with {reply}")
            yield peer
        finally:
            await peer.close()

    async def _corral_checks(self) -> None:
        welcome: dict[str, Any] = {}

        async def handshake() -> str:
            nonlocal welcome
            async with self._corral(hello=False) as peer:
                reply = await peer.request(
                    {"type": "hello", "protocol": "corral/1", "schemas": True}
                )
                _require(reply.get("type") == "welcome", f"hello was answered with {reply}")
                _require(reply.get("protocol") == "corral/1", "welcome.protocol is not corral/1")
                for key in ("server", "env", "limits"):
                    _require(isinstance(reply.get(key), dict), f"welcome has no {key!r} object")
                _require(
                    isinstance(reply["env"].get("fingerprint"), str),
                    "welcome.env has no fingerprint",
                )
                welcome = reply
                limit = reply["limits"].get("max_sessions")
                if isinstance(limit, int):
                    self.max_sessions = limit
            return f"contract {reply['env'].get('contract_version')} {reply['env']['fingerprint']}"

        async def contract() -> str:
            if not welcome:
                raise CheckSkipped("no welcome")
            schemas = _dict(welcome.get("schemas"), "welcome has no schemas although asked")
            mine = self._need_schemas()
            for key in ("action", "observation", "state"):
                _require(
                    schemas.get(key) == getattr(mine, key),
                    f"the handshake's {key} schema differs from GET /schema's",
                )
            computed = fingerprint({k: schemas[k] for k in ("action", "observation", "state")})
            _require(
                computed == welcome["env"]["fingerprint"],
                f"fingerprint {welcome['env']['fingerprint']} is not the hash of the schemas "
                f"({computed})",
            )
            return ""

        async def episode() -> str:
            async with self._corral() as peer:
                sid = await peer.open_session()
                reply = await peer.request({"type": "reset", "session": sid, "seed": 1})
                _require(reply.get("type") == "result", f"reset was answered with {reply}")
                self._corral_observation(reply.get("observation"), "reset")
                action = self._valid_action()
                reply = await peer.request({"type": "step", "session": sid, "action": action})
                _require(reply.get("type") == "result", f"step was answered with {reply}")
                self._corral_observation(reply.get("observation"), "step")
                reply = await peer.request({"type": "state", "session": sid})
                _require(reply.get("type") == "state", f"state was answered with {reply}")
                self._state_conforms(reply.get("state"), "state")
                reply = await peer.request({"type": "close", "session": sid})
                _require(reply.get("type") == "closed", f"close was answered with {reply}")
            return ""

        await self.check("corral.handshake", "corral", "hello → welcome", handshake)
        await self.check("corral.contract", "corral", "schemas and fingerprint agree", contract)
        await self.check("corral.episode", "corral", "open/reset/step/state/close", episode)
        for check_id, title, body in self._corral_error_checks():
            await self.check(f"corral.{check_id}", "corral", title, body)
        await self.check(
            "corral.CAPACITY_REACHED",
            "corral",
            "full server refused at handshake",
            self._corral_capacity,
        )

    def _corral_observation(self, obs: Any, where: str) -> None:
        _require(isinstance(obs, dict), f"{where}: the observation is not an object")
        if self.schemas is not None:
            problem = schema_problem(self.schemas.observation, obs)
            _require(problem is None, f"{where}: observation does not match /schema: {problem}")

    def _corral_error_checks(self) -> Iterator[tuple[str, str, Callable[[], Awaitable[str]]]]:
        async def expect(peer: _CorralPeer, message: dict[str, Any] | str, code: str) -> str:
            rid = None
            if isinstance(message, dict):
                rid = message.setdefault("id", peer.fresh_id())
            reply = await peer.ask(message)
            _require(reply.get("type") == "error", f"expected {code}, got {reply}")
            _require(reply.get("code") == code, f"expected {code}, got {reply.get('code')!r}")
            _require(isinstance(reply.get("message"), str), "the error has no 'message'")
            _require(isinstance(reply.get("details"), dict), "the error has no 'details' object")
            if rid is not None:
                _require(reply.get("id") == rid, f"the error does not echo request id {rid}")
            return ""

        async def bad_frame() -> str:
            async with self._corral() as peer:
                return await expect(peer, "{not json", "BAD_FRAME")

        async def unknown_type() -> str:
            async with self._corral() as peer:
                return await expect(peer, {"type": "__corral_validate__"}, "UNKNOWN_TYPE")

        async def bad_message() -> str:
            async with self._corral() as peer:
                return await expect(peer, {"type": "reset"}, "BAD_MESSAGE")

        async def handshake_required() -> str:
            async with self._corral(hello=False) as peer:
                return await expect(peer, {"type": "open"}, "HANDSHAKE_REQUIRED")

        async def unsupported() -> str:
            async with self._corral(hello=False) as peer:
                hello = {"type": "hello", "protocol": "corral/999"}
                return await expect(peer, hello, "UNSUPPORTED_PROTOCOL")

        async def mismatch() -> str:
            async with self._corral(hello=False) as peer:
                contract = {"version": "999.0.0", "fingerprint": "sha256:0000000000000000"}
                hello = {"type": "hello", "protocol": "corral/1", "contract": contract}
                return await expect(peer, hello, "CONTRACT_MISMATCH")

        async def unknown_session() -> str:
            async with self._corral() as peer:
                return await expect(peer, {"type": "state", "session": "nope"}, "UNKNOWN_SESSION")

        async def reset_required() -> str:
            async with self._corral() as peer:
                sid = await peer.open_session()
                step = {"type": "step", "session": sid, "action": self._action or {}}
                return await expect(peer, step, "RESET_REQUIRED")

        async def invalid_argument() -> str:
            async with self._corral() as peer:
                sid = await peer.open_session()
                return await expect(
                    peer, {"type": "reset", "session": sid, "seed": -1}, "INVALID_ARGUMENT"
                )

        async def invalid_action() -> str:
            schemas = self._need_schemas()
            bad = invalid_action_for(schemas.action, self._valid_action())
            if bad is None:
                raise CheckSkipped("cannot build an action the schema rejects")
            async with self._corral() as peer:
                sid = await peer.open_session()
                reply = await peer.request({"type": "reset", "session": sid})
                _require(reply.get("type") == "result", f"reset was answered with {reply}")
                return await expect(
                    peer, {"type": "step", "session": sid, "action": bad}, "INVALID_ACTION"
                )

        async def session_lost() -> str:
            async with self._corral() as peer:
                sid = await peer.open_session()
                reply = await peer.request({"type": "close", "session": sid})
                _require(reply.get("type") == "closed", f"close was answered with {reply}")
                return await expect(peer, {"type": "state", "session": sid}, "SESSION_LOST")

        async def frame_too_large() -> str:
            async with self._corral(hello=False) as peer:
                welcome = await peer.request({"type": "hello", "protocol": "corral/1"})
                limit = welcome.get("limits", {}).get("max_frame_bytes")
                if not isinstance(limit, int) or limit > 1024 * 1024:
                    raise CheckSkipped(f"max_frame_bytes {limit} is too large to send cheaply")
                big = {"type": "state", "session": "x", "pad": "x" * (limit + 1)}
                return await expect(peer, big, "FRAME_TOO_LARGE")

        yield "BAD_FRAME", "bad JSON → BAD_FRAME", bad_frame
        yield "UNKNOWN_TYPE", "unknown type → UNKNOWN_TYPE", unknown_type
        yield "BAD_MESSAGE", "missing field → BAD_MESSAGE", bad_message
        yield "HANDSHAKE_REQUIRED", "request before hello", handshake_required
        yield "UNSUPPORTED_PROTOCOL", "hello corral/999", unsupported
        yield "CONTRACT_MISMATCH", "incompatible contract", mismatch
        yield "UNKNOWN_SESSION", "unknown session id", unknown_session
        yield "RESET_REQUIRED", "step before reset", reset_required
        yield "INVALID_ARGUMENT", "reset seed -1", invalid_argument
        yield "INVALID_ACTION", "invalid action", invalid_action
        yield "SESSION_LOST", "request on a closed session", session_lost
        yield "FRAME_TOO_LARGE", "oversized frame", frame_too_large

    async def _corral_capacity(self) -> str:
        limit = self.max_sessions
        if limit is None:
            raise CheckSkipped("the server did not state max_sessions")
        if limit > self.capacity_probe:
            raise CheckSkipped(
                f"max_sessions {limit} is above --capacity-probe {self.capacity_probe}"
            )
        async with self._corral() as peer:
            opened = 0
            deadline = time.monotonic() + 2.0
            while opened < limit:
                reply = await peer.request({"type": "open"})
                if reply.get("type") == "opened":
                    opened += 1
                    continue
                if reply.get("code") == "TOO_MANY_SESSIONS":
                    raise CheckSkipped("max_sessions_per_connection is below max_sessions")
                # Sessions of connections this checker just closed may still be closing.
                _require(
                    reply.get("code") == "CAPACITY_REACHED" and time.monotonic() < deadline,
                    f"open #{opened + 1} was answered with {reply}",
                )
                await asyncio.sleep(0.1)
            reply = await peer.request({"type": "open"})
            _require(
                reply.get("code") == "CAPACITY_REACHED",
                f"open beyond max_sessions={limit} was answered with {reply}",
            )
            details = reply.get("details", {})
            _require(
                details.get("max_sessions") == limit,
                f"CAPACITY_REACHED details {details} do not name max_sessions={limit}",
            )
            try:
                extra = await self._ws([CORRAL_SUBPROTOCOL])
            except InvalidStatus as exc:
                status = exc.response.status_code
                _require(status == 503, f"a full server refused the handshake with HTTP {status}")
                _require(
                    "Retry-After" in exc.response.headers, "the 503 refusal has no Retry-After"
                )
                return f"{limit} sessions, then 503 + Retry-After"
            await _WsPeer(extra, self.timeout).close()
            raise CheckFailed("a full server accepted another corral/1 WebSocket")


class _CorralPeer(_WsPeer):
    """A corral/1 JSON peer: request ids and matching by id."""

    def __init__(self, ws: ClientConnection, timeout: float) -> None:
        super().__init__(ws, timeout)
        self._next = 1

    def fresh_id(self) -> int:
        self._next += 1
        return self._next

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        rid = message.setdefault("id", self.fresh_id())
        await self.send(message)
        while True:
            reply = await self.recv()
            if reply.get("id") == rid or (reply.get("type") == "error" and reply.get("id") is None):
                return reply

    async def open_session(self) -> str:
        reply = await self.request({"type": "open"})
        _require(reply.get("type") == "opened", f"open was answered with {reply}")
        session = reply.get("session")
        _require(isinstance(session, str), "opened has no session id")
        _require(isinstance(reply.get("token"), str), "opened has no resume token")
        return str(session)


async def validate_url(
    url: str,
    *,
    timeout: float = 5.0,
    action: dict[str, Any] | None = None,
    capacity_probe: int = 8,
) -> Report:
    """Run the runtime checks against the server at ``url`` and return the report.

    Args:
        url: the server's base URL (``http://host:port``).
        timeout: seconds to wait for any single reply.
        action: a valid action (else one is synthesized from the action schema).
        capacity_probe: check capacity only when the server holds at most this many
            sessions (opening that many is cheap enough).
    """
    return await Validator(url, timeout=timeout, action=action, capacity_probe=capacity_probe).run()


# -- the command ---------------------------------------------------------------------

_MARKS = {
    Status.PASS: "[green]PASS[/]",
    Status.FAIL: "[bold red]FAIL[/]",
    Status.SKIP: "[dim]skip[/]",
}


def print_report(report: Report) -> None:
    """Print ``report`` as a table with a verdict line."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    found = [name for name, ok in report.protocols.items() if ok]
    table = Table(title=f"corral validate {report.target}", title_justify="left")
    table.add_column("", no_wrap=True, min_width=4)
    table.add_column("protocol", style="cyan", no_wrap=True, min_width=7)
    table.add_column("check", overflow="fold", ratio=2)
    table.add_column("detail", overflow="fold", ratio=3)
    for check in report.checks:
        table.add_row(
            _MARKS[check.status], check.protocol, f"{check.id}: {check.title}", check.detail
        )
    console.print(table)
    console.print(f"protocols: {', '.join(found) if found else 'none detected'}")
    if report.passed:
        console.print("[green]passed[/]")
    for check in report.failures:
        console.print(f"[bold red]FAILED[/] {check.id}: {check.detail}")


def _parse_action(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--action") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("the action must be a JSON object", param_hint="--action")
    return value


def validate_command(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="An environment directory to validate (default: the current one, unless "
            "--url is given)."
        ),
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="Check the running server at this base URL.")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds to wait for any single reply.")
    ] = 5.0,
    action: Annotated[
        str | None,
        typer.Option(help="A valid action as JSON, when one cannot be synthesized."),
    ] = None,
    capacity_probe: Annotated[
        int,
        typer.Option(
            min=0, help="Check capacity when the server holds at most this many sessions."
        ),
    ] = 8,
    static: Annotated[
        bool, typer.Option("--static", help="PATH: static checks only, start no server.")
    ] = False,
    docker: Annotated[
        bool,
        typer.Option("--docker", help="PATH: run the image 'corral build' made, in Docker."),
    ] = False,
    image: Annotated[
        str | None, typer.Option(help="PATH: run this image of the environment, in Docker.")
    ] = None,
    venv: Annotated[
        bool,
        typer.Option(
            "--venv", help="PATH: run the local server in a virtualenv from pyproject.toml."
        ),
    ] = False,
    sandbox: Annotated[
        str,
        typer.Option(help="PATH: run the local server in a sandbox: none, auto, bwrap, unshare."),
    ] = "none",
    network: Annotated[
        str, typer.Option(help="PATH: Docker networking for --docker/--image: bridge, host.")
    ] = "bridge",
    seed: Annotated[int, typer.Option(help="PATH: the seed of every episode.")] = 0,
    steps: Annotated[int, typer.Option(min=1, help="PATH: the most steps per episode.")] = 20,
) -> None:
    """Validate an environment (PATH: static checks and a runtime smoke test) or a running
    server (--url: corral/1 and OpenEnv conformance); exit 1 on failure."""
    if url is not None and path is not None:
        raise typer.BadParameter("give either PATH or --url, not both", param_hint="PATH")
    local_only = {
        "--static": static,
        "--docker": docker,
        "--image": image is not None,
        "--venv": venv,
        "--sandbox": sandbox != "none",
    }
    if url is not None and any(local_only.values()):
        given = ", ".join(name for name, used in local_only.items() if used)
        raise typer.BadParameter(f"{given} apply to PATH, not to --url", param_hint="--url")
    if url is not None:
        report = asyncio.run(
            validate_url(
                url, timeout=timeout, action=_parse_action(action), capacity_probe=capacity_probe
            )
        )
    else:
        if STATIC_VALIDATOR is None:
            typer.echo(
                "static validation (corral validate PATH) is not available; "
                "check a running server with --url URL",
                err=True,
            )
            raise typer.Exit(2)
        if sandbox not in ("none", "auto", "bwrap", "unshare"):
            raise typer.BadParameter(
                f"{sandbox!r} is not a sandbox; use none, auto, bwrap or unshare",
                param_hint="--sandbox",
            )
        if network not in ("bridge", "host"):
            raise typer.BadParameter(
                f"{network!r} is not a Docker network mode; use bridge or host",
                param_hint="--network",
            )
        report = STATIC_VALIDATOR(
            path or Path("."),
            runtime=not static,
            docker=docker,
            image=image,
            venv=venv,
            sandbox=sandbox,
            network=network,
            action=_parse_action(action),
            seed=seed,
            steps=steps,
            timeout=timeout,
        )
    if json_output:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report)
    if not report.passed:
        raise typer.Exit(1)
