"""The OpenEnv checks: its HTTP simulation routes, its ``/ws`` envelope, its error codes and
its capacity refusal, as OpenEnv's own clients expect them (see docs/openenv.md)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from corral import runtime
from corral.cli.validate.checks import (
    CheckFailed,
    Checks,
    CheckSkipped,
    WsPeer,
    as_object,
    require,
)
from corral.contract.examples import invalid_action_for, schema_problem


class OpenEnvChecks(Checks):
    """The ``openenv.*`` checks, and the detection of OpenEnv's envelope on ``/ws``."""

    async def _openenv_peer(self, settle: float = 2.0) -> tuple[WsPeer, dict[str, Any]]:
        """An OpenEnv connection and its answer to ``state``.

        Retries for ``settle`` seconds while the server reports CAPACITY_REACHED: it
        frees the slot of a connection this checker just closed only once it saw it go.
        """
        deadline = time.monotonic() + settle
        while True:
            peer = WsPeer(await self._ws(), self.timeout)
            require(peer.ws.subprotocol is None, "the server chose a subprotocol nobody offered")
            reply = await peer.ask({"type": "state"})
            data = reply.get("data")
            code = data.get("code") if isinstance(data, dict) else None
            busy = reply.get("type") == "error" and code == "CAPACITY_REACHED"
            if busy and time.monotonic() < deadline:
                await peer.close()
                await asyncio.sleep(0.1)
                continue
            return peer, reply

    async def detect_openenv(self) -> bool:
        """The server answers OpenEnv's envelope on ``/ws``."""
        try:
            peer, reply = await self._openenv_peer()
        except (CheckFailed, InvalidStatus, OSError, TimeoutError, WebSocketException):
            return False
        await peer.close()
        return reply.get("type") in ("state", "error") and "data" in reply

    def _flat_observation(self, data: Any, where: str) -> dict[str, Any]:
        require(isinstance(data, dict), f"{where}: data is not an object")
        obs = data.get("observation")
        require(isinstance(obs, dict), f"{where}: data has no 'observation' object")
        require(isinstance(data.get("done"), bool), f"{where}: data.done is not a boolean")
        reward = data.get("reward")
        require(
            reward is None or (isinstance(reward, (int, float))),
            f"{where}: data.reward is not a number or null",
        )
        for lifted in ("done", "reward"):
            require(
                lifted not in obs,
                f"{where}: data.observation still carries {lifted!r} (OpenEnv lifts it out)",
            )
        whole = {**obs, "done": data["done"], "reward": reward}
        for key in ("metadata", "truncated"):
            # OpenEnv 0.10 sends a top-level "metadata": null when the observation's is
            # empty, and keeps the real one nested: null says nothing.
            if data.get(key) is not None:
                whole[key] = data[key]
        if self.schemas is not None:
            problem = schema_problem(self.schemas.observation, whole)
            require(problem is None, f"{where}: observation does not match /schema: {problem}")
        return whole

    async def run_openenv_http_checks(self) -> None:
        """Run the ``openenv.http.*`` checks (the simulation-mode routes and ``/mcp``)."""

        async def routes() -> str:
            body = (await self.http.get("/openapi.json")).json()
            paths = body.get("paths", {}) if isinstance(body, dict) else {}
            missing = [p for p in ("/reset", "/step", "/state") if p not in paths]
            require(not missing, f"OpenAPI paths lack {missing} (OpenEnv simulation mode)")
            return ""

        async def reset() -> str:
            response = await self.http.post("/reset", json={})
            body = await self._json(response, "POST /reset")
            require(
                response.status_code == 200, f"POST /reset: HTTP {response.status_code}: {body}"
            )
            self._flat_observation(body, "POST /reset")
            return ""

        async def step() -> str:
            action = self._valid_action()
            response = await self.http.post("/step", json={"action": action})
            body = await self._json(response, "POST /step")
            require(response.status_code == 200, f"POST /step: HTTP {response.status_code}: {body}")
            self._flat_observation(body, "POST /step")
            return ""

        async def step_invalid() -> str:
            schemas = self._need_schemas()
            bad = invalid_action_for(schemas.action, self._valid_action())
            if bad is None:
                raise CheckSkipped("cannot build an action the schema rejects")
            response = await self.http.post("/step", json={"action": bad})
            require(
                response.status_code == 422,
                f"POST /step with an invalid action: HTTP {response.status_code} (expected 422)",
            )
            return ""

        async def state() -> str:
            response = await self.http.get("/state")
            body = await self._json(response, "GET /state")
            require(response.status_code == 200, f"GET /state: HTTP {response.status_code}")
            self._state_conforms(body, "GET /state")
            return ""

        async def mcp() -> str:
            response = await self.http.post("/mcp", json={})
            body = await self._json(response, "POST /mcp")
            require(response.status_code == 200, f"POST /mcp: HTTP {response.status_code}")
            require(
                isinstance(body, dict) and body.get("jsonrpc") == "2.0",
                "POST /mcp {} must answer a JSON-RPC 2.0 object",
            )
            error = body.get("error")
            require(
                isinstance(error, dict) and error.get("code") == -32600,
                f"POST /mcp {{}} must be an Invalid Request error (-32600), got {body}",
            )
            listed = await self.http.post(
                "/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 1}
            )
            reply = await self._json(listed, "POST /mcp tools/list")
            require(
                isinstance(reply, dict) and reply.get("id") == 1,
                "tools/list must echo the request id",
            )
            if "result" in reply:
                result = as_object(reply["result"], "tools/list result is not an object")
                tools = result.get("tools")
                if not isinstance(tools, list):
                    raise CheckFailed("tools/list result has no 'tools' list")
                return f"{len(tools)} tool(s)"
            require(
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

    async def run_openenv_ws_checks(self) -> None:
        """Run the ``openenv.ws.*`` checks on one session, then the capacity check."""
        peer: WsPeer | None = None

        async def connect_() -> str:
            nonlocal peer
            peer, reply = await self._openenv_peer()
            require(reply.get("type") == "state", f"'state' was answered with {reply}")
            self._state_conforms(reply.get("data"), "state before reset")
            return ""

        def live() -> WsPeer:
            if peer is None:
                raise CheckSkipped("no OpenEnv session")
            return peer

        async def reset() -> str:
            reply = await live().ask({"type": "reset", "data": {"seed": 1}})
            require(reply.get("type") == "observation", f"'reset' was answered with {reply}")
            self._flat_observation(reply.get("data"), "reset reply")
            return ""

        async def step() -> str:
            reply = await live().ask({"type": "step", "data": self._valid_action()})
            require(reply.get("type") == "observation", f"'step' was answered with {reply}")
            self._flat_observation(reply.get("data"), "step reply")
            return ""

        async def state() -> str:
            reply = await live().ask({"type": "state"})
            require(reply.get("type") == "state", f"'state' was answered with {reply}")
            self._state_conforms(reply.get("data"), "state reply")
            return ""

        async def expect_error(frame: dict[str, Any] | str, code: str) -> dict[str, Any]:
            reply = await live().ask(frame)
            require(reply.get("type") == "error", f"expected an error frame, got {reply}")
            data = as_object(reply.get("data"), f"the error frame has no data object: {reply}")
            require(data.get("code") == code, f"expected code {code}, got {data.get('code')!r}")
            require(isinstance(data.get("message"), str), "the error has no 'message' string")
            after = await live().ask({"type": "state"})
            require(
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
            require(isinstance(data.get("errors"), list), "VALIDATION_ERROR has no 'errors' list")
            return ""

        async def close() -> str:
            session = live()
            await session.send({"type": "close"})
            try:
                extra = await runtime.wait_for(session.ws.recv(), self.timeout)
            except ConnectionClosed:
                code = session.ws.close_code
                require(code == 1000, f"the server closed with code {code}, expected 1000")
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
        peers: list[WsPeer] = []
        try:
            for index in range(self.capacity_probe + 1):
                peer, reply = await self._openenv_peer(settle=2.0 if index == 0 else 0.0)
                peers.append(peer)
                if reply.get("type") == "state":
                    continue
                data = as_object(reply.get("data"), f"connection {index + 1}: got {reply}")
                require(
                    data.get("code") == "CAPACITY_REACHED",
                    f"connection {index + 1} was refused with {data.get('code')!r}",
                )
                for key in ("active_sessions", "max_sessions"):
                    require(
                        isinstance(data.get(key), int), f"CAPACITY_REACHED has no integer {key!r}"
                    )
                try:
                    await runtime.wait_for(peer.ws.recv(), self.timeout)
                except ConnectionClosed:
                    require(
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
