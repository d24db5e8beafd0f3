"""OpenEnv environment classes served by corral, unchanged.

openenv is imported in the tests, not here: it imports gradio (seconds of CPU), and every
pytest-xdist worker collects this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from inspect import iscoroutinefunction

import pytest
from pydantic import ValidationError
from tests.support.peers import corral_server
from tests.support.servers import running

from corral.adapters.openenv_env import from_openenv, is_openenv_environment
from corral.cli.serve import resolve_serve_target
from corral.client import AsyncEnvClient
from corral.contract import Action, Observation, State
from corral.envs.echo import EchoEnv
from corral.errors import EnvError, InvalidAction

# The tests that import openenv (~2.7 s of CPU in a process) share one xdist worker: the
# import is paid once, not by every worker that one of them lands on.
pytestmark = pytest.mark.xdist_group("openenv")


def test_the_models_are_corral_twins_of_the_openenv_models():
    from tests.support.openenv_envs import CountAction, CountEnv, CountObservation, CountState

    env = from_openenv(CountEnv)
    assert env.name == "CountEnv" and env.description == "CountEnv environment"
    assert issubclass(env.action_type, CountAction) and issubclass(env.action_type, Action)
    assert issubclass(env.observation_type, CountObservation)
    assert issubclass(env.observation_type, Observation)
    assert issubclass(env.state_type, CountState) and issubclass(env.state_type, State)
    assert env.action_type.__name__ == "CountAction"
    assert set(env.action_type.model_fields) == {"metadata", "amount", "sleep"}
    with pytest.raises(ValidationError, match="13 is unlucky"):  # the author's validator
        env.action_type(amount=13)
    with pytest.raises(ValidationError):  # the author's bounds
        env.action_type(amount=101)
    assert env.thread_affinity and not iscoroutinefunction(env.reset)
    assert not iscoroutinefunction(env.step)
    assert env.contract().fingerprint.startswith("sha256:")


def test_an_adapted_instance_behaves_like_the_original():
    from tests.support.openenv_envs import CountEnv

    env = from_openenv(CountEnv, name="counter", description="Counts.")
    assert (env.name, env.description) == ("counter", "Counts.")
    instance = env()
    first = instance.reset(seed=5, episode_id="e", start=2)
    assert isinstance(first, env.observation_type) and first.total == 2
    assert first.metadata == {"seed": 5}
    result = instance.step(env.action_type(amount=3))
    assert result.total == 5 and result.reward == 3.0
    state = instance.state()
    assert isinstance(state, env.state_type)
    assert (state.episode_id, state.step_count, state.total) == ("e", 1, 5)  # type: ignore[attr-defined]
    asyncio.run(instance.close())


def test_reset_keywords_follow_openenvs_signature_rule():
    from tests.support.openenv_envs import CountEnv, StrictCountEnv

    strict = from_openenv(StrictCountEnv)()
    strict.reset(episode_id="fine")
    # OpenEnv passes only what the signature names: 'start' is dropped, not an error.
    assert strict.reset(start=1).total == 0
    loose = from_openenv(CountEnv)()  # takes **kw: everything is passed on
    assert loose.reset(start=4, anything=1).total == 4


def test_models_come_from_generics_annotations_or_arguments():
    from openenv.core.env_server import types as oe_types
    from tests.support.openenv_envs import (
        CountAction,
        CountObservation,
        CountState,
        StrictCountEnv,
        UntypedEnv,
    )

    strict = from_openenv(StrictCountEnv)  # no generic parameters: annotations
    assert issubclass(strict.action_type, CountAction)
    assert issubclass(strict.state_type, CountState)
    with pytest.raises(TypeError, match="cannot tell the action model of UntypedEnv"):
        from_openenv(UntypedEnv)
    untyped = from_openenv(UntypedEnv, action_type=CountAction, observation_type=CountObservation)
    assert issubclass(untyped.state_type, oe_types.State)
    with pytest.raises(TypeError, match="not a subclass of openenv's Action"):
        from_openenv(UntypedEnv, action_type=CountObservation, observation_type=CountObservation)
    with pytest.raises(TypeError, match="needs a subclass of openenv's Environment"):
        from_openenv(EchoEnv)


def test_async_overrides_are_awaited():
    from tests.support.openenv_envs import AsyncCountEnv

    env = from_openenv(AsyncCountEnv)
    assert iscoroutinefunction(env.reset) and iscoroutinefunction(env.step)
    assert not iscoroutinefunction(env.state)


def test_detection_and_corral_serve_resolution():
    from tests.support.openenv_envs import CountEnv, StrictCountEnv

    assert is_openenv_environment(CountEnv) and is_openenv_environment(StrictCountEnv)
    assert not is_openenv_environment(EchoEnv) and not is_openenv_environment(CountEnv())
    resolved = resolve_serve_target("tests.support.openenv_envs:CountEnv")
    assert resolved.__name__ == "CountEnvAdapter" and resolved.openenv_class is CountEnv
    assert resolve_serve_target("corral.envs.echo:EchoEnv") is EchoEnv


async def test_async_openenv_env_through_a_server():
    from tests.support.openenv_envs import AsyncCountEnv

    with running(from_openenv(AsyncCountEnv)) as srv:
        async with AsyncEnvClient(srv.url) as env:
            assert (await env.reset(start=3)).observation.total == 3  # type: ignore[attr-defined]
            result = await env.step({"amount": 2})
            assert result.observation.total == 5  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    # `corral serve module:Class` with an OpenEnv class: adapted automatically.
    with corral_server("tests.support.openenv_envs:CountEnv") as url:
        yield url


async def test_served_by_corral_serve_to_a_corral_client(served):
    from tests.support.openenv_envs import CountEnv

    adapted = from_openenv(CountEnv)
    async with AsyncEnvClient(served, env=adapted) as env:
        assert env.server_info["compat"] == "exact"  # same twin models, same fingerprint
        result = await env.reset(seed=1, episode_id="ep", start=1)
        assert result.observation.note == "seed=1" and result.info == {"seed": 1}
        result = await env.step(adapted.action_type(amount=4))
        assert result.observation.total == 5 and result.reward == 4.0
        with pytest.raises(EnvError, match="seven is not allowed"):
            await env.step({"amount": 7})
        with pytest.raises(InvalidAction):
            await env.step({"amount": 13})
        result = await env.step({"amount": 5})
        assert result.terminated
        state = await env.state()
        assert (state.episode_id, state.total) == ("ep", 10)  # type: ignore[attr-defined]


def test_served_to_openenv_clients_with_the_validator_bug_fixed(served):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=served).sync() as env:
        env.reset(start=0)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"amount": 13})  # openenv-core itself would end the session here
        result = env.step({"amount": 2})
        assert result.observation == {"total": 2, "note": ""} and result.reward == 2.0
        assert env.state()["total"] == 2
