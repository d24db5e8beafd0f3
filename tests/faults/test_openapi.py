"""Schemathesis against the server's own OpenAPI document, for every HTTP route.

Each route is called with inputs generated from its schema (and, in negative mode,
inputs that violate it); every response must conform to the schema (status, content
type, body), invalid inputs must be rejected, and no input may cause a server error.
The server runs with a bearer token, so the suite also checks that every route refuses
a request without it.

One default check is left out: ``positive_data_acceptance``. OpenEnv's HTTP bodies are
generic by design (``action`` is any object, ``/reset`` takes any extra keys as reset
options); the environment's own models, published at ``/schema``, decide, and answer a
schema-valid but wrong action with ``422 INVALID_ACTION``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from tests.faults.conftest import local_server, started

from corral.auth import bearer_header
from corral.client.local_server import LocalServer

TOKEN = "openapi-suite-token-0123456789"
AUTH = bearer_header(TOKEN)


@pytest.fixture(scope="module")
def api_server() -> Iterator[LocalServer]:
    server = local_server("corral.envs.echo:EchoEnv", env={"CORRAL_TOKEN": TOKEN})
    yield started(server)
    server.stop_now()


@pytest.fixture(scope="module")
def api_schema(api_server: LocalServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{api_server.url}/openapi.json", headers=AUTH)


def test_routes_conform_to_the_openapi_document(api_server, api_schema, scale, figures):
    # Driven by hand rather than by schemathesis' pytest plugin, which does not support
    # the pytest this project uses; the cases and checks are the same.
    calls = Counter[str]()
    unviolable: list[str] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        takes_input = any(True for _ in operation.iter_parameters()) or bool(
            operation.get_request_payload_content_types()
        )
        # A route without parameters or body has nothing to violate: positive cases only.
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if takes_input else [])
        for mode in modes:

            @settings(
                max_examples=scale.openapi_examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(operation.as_strategy(generation_mode=mode))
            def check(case: schemathesis.Case) -> None:
                response = case.call_and_validate(
                    base_url=api_server.url,
                    headers=AUTH,
                    excluded_checks=[positive_data_acceptance],
                )
                calls[f"{case.method} {case.path} {response.status_code}"] += 1

            try:
                check()
            except Unsatisfiable:
                # Nothing violates this route's schema (say, an optional string header):
                # hypothesis proves no negative input exists. Only then is it skipped.
                assert mode is GenerationMode.NEGATIVE, operation.label
                unviolable.append(operation.label)
    figures["routes_without_negative_inputs"] = unviolable
    figures["http_calls"] = sum(calls.values())
    figures["routes"] = len({key.rsplit(" ", 1)[0] for key in calls})
    assert not any(key.endswith(tuple(f" 5{d:02d}" for d in range(100))) for key in calls)


def test_every_route_requires_the_token(api_server, api_schema):
    paths = sorted(api_schema.raw_schema["paths"])
    assert {"/health", "/ready", "/schema", "/metadata"} <= set(paths)
    with httpx.Client(base_url=api_server.url, trust_env=False) as http:
        for path in [*paths, "/openapi.json", "/docs"]:
            if "{" in path:
                continue
            refused = http.get(path)
            assert refused.status_code == 401, path
            assert refused.json()["code"] == "UNAUTHORIZED"
            assert refused.headers["www-authenticate"].startswith("Bearer")
            wrong = http.get(path, headers=bearer_header("not-the-right-token"))
            assert wrong.status_code == 401, path
