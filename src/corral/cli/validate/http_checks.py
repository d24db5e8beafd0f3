"""The HTTP basics every server must get right: OpenAPI, ``/health``, ``/metadata``,
``/schema`` (which also yields the action the other checks play) and ``/ready``."""

from __future__ import annotations

from corral.cli.validate.checks import CheckFailed, Checks, CheckSkipped, Schemas, require
from corral.contract.examples import example_for, schema_problem, schema_validator


class HttpChecks(Checks):
    """The ``http.*`` checks."""

    async def run_http_checks(self) -> None:
        """Run the ``http.*`` checks (``/schema`` also chooses the action to play)."""

        async def openapi() -> str:
            response = await self.http.get("/openapi.json")
            require(response.status_code == 200, f"GET /openapi.json: HTTP {response.status_code}")
            body = await self._json(response, "GET /openapi.json")
            version = body.get("info", {}).get("version") if isinstance(body, dict) else None
            if not isinstance(version, str):
                raise CheckFailed("GET /openapi.json has no info.version string")
            require(
                version.startswith("1."),
                f"info.version is {version!r}; OpenEnv clients expect the 1.x profile",
            )
            return f"info.version {version}"

        async def health() -> str:
            response = await self.http.get("/health")
            body = await self._json(response, "GET /health")
            require(
                response.status_code == 200 and isinstance(body, dict),
                f"GET /health: HTTP {response.status_code}",
            )
            require(
                body.get("status") == "healthy",
                f'GET /health must return {{"status": "healthy"}}, got {body!r}',
            )
            return ""

        async def metadata() -> str:
            response = await self.http.get("/metadata")
            body = await self._json(response, "GET /metadata")
            require(response.status_code == 200, f"GET /metadata: HTTP {response.status_code}")
            require(isinstance(body, dict), "GET /metadata must return an object")
            for key in ("name", "description"):
                require(isinstance(body.get(key), str), f"GET /metadata: {key!r} is not a string")
            return f"name {body['name']!r}"

        async def schema() -> str:
            response = await self.http.get("/schema")
            body = await self._json(response, "GET /schema")
            require(response.status_code == 200, f"GET /schema: HTTP {response.status_code}")
            require(isinstance(body, dict), "GET /schema must return an object")
            parts = {}
            for key in ("action", "observation", "state"):
                value = body.get(key)
                require(isinstance(value, dict), f"GET /schema: {key!r} is not an object")
                validator = schema_validator(value)
                try:
                    validator.check_schema(value)
                except Exception as exc:
                    message = f"GET /schema: {key!r} is not a valid JSON Schema: {exc}"
                    raise CheckFailed(message) from None
                parts[key] = value
            self.schemas = Schemas(**parts)
            self._choose_action()
            return self._action_note

        async def ready() -> str:
            response = await self.http.get("/ready")
            if response.status_code == 404:
                raise CheckSkipped("no /ready route (not a corral server)")
            body = await self._json(response, "GET /ready")
            require(isinstance(body, dict), "GET /ready must return an object")
            require(
                response.status_code in (200, 503),
                f"GET /ready: HTTP {response.status_code} (expected 200 or 503)",
            )
            require(
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
