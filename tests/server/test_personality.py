"""One personality per server, chosen once; each route defined once and answered by it.

``corral.server.openenv.personality_of`` is the one place that tells a corral environment
from an OpenEnv one; the app's routes are each registered once, whatever is served, so
no registration order decides which answers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.envs.echo import EchoEnv
from corral.server import create_app
from corral.server.config import ServerConfig
from corral.server.openenv import personality_of
from corral.server.openenv.lockstep import CorralPersonality
from corral.server.openenv.peer import PeerPersonality
from corral.server.service import EnvService

pytestmark = pytest.mark.xdist_group("openenv")  # the tests importing openenv share a worker


def routes(app: Any) -> Counter[tuple[str, str]]:
    """Every (method, path) the app registers, through included routers."""
    found: Counter[tuple[str, str]] = Counter()
    stack = list(app.routes)
    while stack:
        route = stack.pop()
        router = getattr(route, "original_router", None)
        if router is not None:
            stack.extend(router.routes)
            continue
        methods = getattr(route, "methods", None) or {"WEBSOCKET"}
        for method in methods - {"HEAD"}:
            found[(method, getattr(route, "path", "?"))] += 1
    return found


def served() -> list[Any]:
    from tests.support.openenv_envs import CountEnv

    from corral.adapters.openenv_env import from_openenv

    return [EchoEnv, from_openenv(CountEnv)]


@pytest.mark.parametrize("env", served(), ids=["corral env", "OpenEnv env"])
def test_every_route_is_defined_once(env: Any) -> None:
    counted = routes(create_app(env, web=True))
    twice = {route: n for route, n in counted.items() if n > 1}
    assert not twice, twice
    for path in ("/schema", "/metadata", "/reset", "/step", "/state", "/mcp", "/ws"):
        assert any(p == path for _, p in counted), path
    assert ("POST", "/{env_name}/tasks") in counted


def test_the_personality_is_chosen_once_from_what_is_served() -> None:
    corral_env, openenv_env = served()
    config = ServerConfig()
    assert isinstance(personality_of(EnvService(corral_env, config)), CorralPersonality)
    assert isinstance(personality_of(EnvService(openenv_env, config)), PeerPersonality)


@pytest.mark.parametrize("env", served(), ids=["corral env", "OpenEnv env"])
def test_schema_is_the_handshakes_contract(env: Any) -> None:
    contract = env.contract()
    with TestClient(create_app(env)) as http:
        body = http.get("/schema").json()
    for model in ("action", "observation", "state"):
        assert body[model] == contract.schemas[model]
    assert body["fingerprint"] == contract.fingerprint
