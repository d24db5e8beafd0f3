"""The corral/1 checks: handshake and contract, an episode, snapshot → restore → the same
observations (or "not supported"), every error code a client can provoke from outside,
and the capacity refusal at the handshake."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidStatus, WebSocketException

from corral.cli.validate.checks import (
    CORRAL_SUBPROTOCOL,
    CheckFailed,
    Checks,
    CheckSkipped,
    WsPeer,
    as_object,
    require,
)
from corral.contract.examples import invalid_action_for, schema_problem
from corral.contract.schema import fingerprint


class CorralChecks(Checks):
    """The ``corral.*`` checks, and the detection of corral/1 on ``/ws``."""

    async def detect_corral(self) -> bool:
        """The server accepts corral/1 (the JSON subprotocol) on ``/ws``."""
        try:
            ws = await self._ws([CORRAL_SUBPROTOCOL])
        except (InvalidStatus, OSError, TimeoutError, WebSocketException):
            return False
        try:
            return ws.subprotocol == CORRAL_SUBPROTOCOL
        finally:
            await WsPeer(ws, self.timeout).close()

    @contextlib.asynccontextmanager
    async def _corral(self, hello: bool = True) -> Any:
        ws = await self._ws([CORRAL_SUBPROTOCOL])
        peer = CorralPeer(ws, self.timeout)
        try:
            if hello:
                reply = await peer.request({"type": "hello", "protocol": "corral/1"})
                require(reply.get("type") == "welcome", f"hello was answered with {reply}")
            yield peer
        finally:
            await peer.close()

    async def run_corral_checks(self) -> None:
        """Run the ``corral.*`` checks."""
        welcome: dict[str, Any] = {}

        async def handshake() -> str:
            nonlocal welcome
            async with self._corral(hello=False) as peer:
                reply = await peer.request(
                    {"type": "hello", "protocol": "corral/1", "schemas": True}
                )
                require(reply.get("type") == "welcome", f"hello was answered with {reply}")
                require(reply.get("protocol") == "corral/1", "welcome.protocol is not corral/1")
                for key in ("server", "env", "limits"):
                    require(isinstance(reply.get(key), dict), f"welcome has no {key!r} object")
                require(
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
            schemas = as_object(welcome.get("schemas"), "welcome has no schemas although asked")
            mine = self._need_schemas()
            for key in ("action", "observation", "state"):
                require(
                    schemas.get(key) == getattr(mine, key),
                    f"the handshake's {key} schema differs from GET /schema's",
                )
            # Over every schema the contract has (reset options and snapshot included).
            computed = fingerprint(schemas)
            require(
                computed == welcome["env"]["fingerprint"],
                f"fingerprint {welcome['env']['fingerprint']} is not the hash of the schemas "
                f"({computed})",
            )
            return ""

        async def episode() -> str:
            async with self._corral() as peer:
                sid = await peer.open_session()
                reply = await peer.request({"type": "reset", "session": sid, "seed": 1})
                require(reply.get("type") == "result", f"reset was answered with {reply}")
                self._corral_observation(reply.get("observation"), "reset")
                action = self._valid_action()
                reply = await peer.request({"type": "step", "session": sid, "action": action})
                require(reply.get("type") == "result", f"step was answered with {reply}")
                self._corral_observation(reply.get("observation"), "step")
                reply = await peer.request({"type": "state", "session": sid})
                require(reply.get("type") == "state", f"state was answered with {reply}")
                self._state_conforms(reply.get("state"), "state")
                reply = await peer.request({"type": "close", "session": sid})
                require(reply.get("type") == "closed", f"close was answered with {reply}")
            return ""

        await self.check("corral.handshake", "corral", "hello → welcome", handshake)
        await self.check("corral.contract", "corral", "schemas and fingerprint agree", contract)
        await self.check("corral.episode", "corral", "open/reset/step/state/close", episode)
        await self.check(
            "corral.snapshot",
            "corral",
            "snapshot → restore → the same observations",
            self._corral_snapshot,
        )
        for check_id, title, body in self._corral_error_checks():
            await self.check(f"corral.{check_id}", "corral", title, body)
        await self.check(
            "corral.CAPACITY_REACHED",
            "corral",
            "full server refused at handshake",
            self._corral_capacity,
        )

    async def _corral_snapshot(self, steps: int = 3) -> str:
        """Snapshot a session mid-episode, restore it in a new session, step both with the
        same action and compare; skipped ("not supported") when the env has no snapshot."""
        async with self._corral() as peer:
            sid = await peer.open_session()
            reply = await peer.request({"type": "reset", "session": sid, "seed": 1})
            require(reply.get("type") == "result", f"reset was answered with {reply}")
            action = self._valid_action()
            last = await peer.request({"type": "step", "session": sid, "action": action})
            require(last.get("type") == "result", f"step was answered with {last}")
            reply = await peer.request({"type": "snapshot", "session": sid})
            if reply.get("code") == "SNAPSHOT_UNSUPPORTED":
                raise CheckSkipped(f"not supported: {reply.get('message')}")
            if reply.get("code") == "SNAPSHOT_TOO_LARGE":
                raise CheckSkipped(f"the server's limit refuses it: {reply.get('message')}")
            require(reply.get("type") == "snapshot", f"snapshot was answered with {reply}")
            envelope = as_object(reply.get("snapshot"), "the snapshot reply has no envelope")
            restored = await peer.request({"type": "restore", "snapshot": envelope})
            require(restored.get("type") == "restored", f"restore was answered with {restored}")
            copy = str(restored.get("session"))
            require(copy != sid, "restore did not open a new session")
            require(
                restored.get("observation") == last.get("observation"),
                "restore returned another observation than the last step's",
            )
            compared = 0
            observation = last.get("observation") or {}
            while compared < steps and not observation.get("done"):
                a = await peer.request({"type": "step", "session": sid, "action": action})
                b = await peer.request({"type": "step", "session": copy, "action": action})
                require(
                    a.get("type") == b.get("type") == "result",
                    f"steps after the restore were answered with {a} and {b}",
                )
                require(
                    a.get("observation") == b.get("observation"),
                    f"step {compared + 1} after the restore differs from the original's",
                )
                observation = a.get("observation") or {}
                compared += 1
            for session in (sid, copy):
                await peer.request({"type": "close", "session": session})
        size = len(json.dumps(envelope.get("snapshot")))
        return f"restored a snapshot of {size} bytes (JSON); {compared} more step(s) identical"

    def _corral_observation(self, obs: Any, where: str) -> None:
        require(isinstance(obs, dict), f"{where}: the observation is not an object")
        if self.schemas is not None:
            problem = schema_problem(self.schemas.observation, obs)
            require(problem is None, f"{where}: observation does not match /schema: {problem}")

    def _corral_error_checks(self) -> Iterator[tuple[str, str, Callable[[], Awaitable[str]]]]:
        async def expect(peer: CorralPeer, message: dict[str, Any] | str, code: str) -> str:
            rid = None
            if isinstance(message, dict):
                rid = message.setdefault("id", peer.fresh_id())
            reply = await peer.ask(message)
            require(reply.get("type") == "error", f"expected {code}, got {reply}")
            require(reply.get("code") == code, f"expected {code}, got {reply.get('code')!r}")
            require(isinstance(reply.get("message"), str), "the error has no 'message'")
            require(isinstance(reply.get("details"), dict), "the error has no 'details' object")
            if rid is not None:
                require(reply.get("id") == rid, f"the error does not echo request id {rid}")
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
                require(reply.get("type") == "result", f"reset was answered with {reply}")
                return await expect(
                    peer, {"type": "step", "session": sid, "action": bad}, "INVALID_ACTION"
                )

        async def session_lost() -> str:
            async with self._corral() as peer:
                sid = await peer.open_session()
                reply = await peer.request({"type": "close", "session": sid})
                require(reply.get("type") == "closed", f"close was answered with {reply}")
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
                require(
                    reply.get("code") == "CAPACITY_REACHED" and time.monotonic() < deadline,
                    f"open #{opened + 1} was answered with {reply}",
                )
                await asyncio.sleep(0.1)
            reply = await peer.request({"type": "open"})
            require(
                reply.get("code") == "CAPACITY_REACHED",
                f"open beyond max_sessions={limit} was answered with {reply}",
            )
            details = reply.get("details", {})
            require(
                details.get("max_sessions") == limit,
                f"CAPACITY_REACHED details {details} do not name max_sessions={limit}",
            )
            try:
                extra = await self._ws([CORRAL_SUBPROTOCOL])
            except InvalidStatus as exc:
                status = exc.response.status_code
                require(status == 503, f"a full server refused the handshake with HTTP {status}")
                require("Retry-After" in exc.response.headers, "the 503 refusal has no Retry-After")
                return f"{limit} sessions, then 503 + Retry-After"
            await WsPeer(extra, self.timeout).close()
            raise CheckFailed("a full server accepted another corral/1 WebSocket")


class CorralPeer(WsPeer):
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
        require(reply.get("type") == "opened", f"open was answered with {reply}")
        session = reply.get("session")
        require(isinstance(session, str), "opened has no session id")
        require(isinstance(reply.get("token"), str), "opened has no resume token")
        return str(session)
