"""End to end: client → serialize → server → deserialize → env, and back, both codecs.

For random contracts (hypothesis-generated Action models: optional fields, defaults,
nested models, unicode, large ints and floats, bytes, datetimes, empty and missing
values), an environment that echoes the action inside its observation and state is served
on 127.0.0.1; the typed result must equal what was sent, through msgpack and JSON alike.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, create_model
from tests.strategies import instances, model_classes
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.contract import Action, Environment, Observation, State
from corral.errors import InvalidAction


def echo_env(action_type: type[Action]) -> type[Environment[Any, Any, Any]]:
    """An environment whose observation and state carry the last action back."""
    obs_type = create_model("EchoObs", __base__=Observation, echo=(action_type | None, None))
    state_type = create_model(
        "EchoState", __base__=State, last=(action_type | None, None), count=(int, 0)
    )

    class ModelEcho(Environment[action_type, obs_type, state_type]):  # type: ignore[valid-type]
        def reset(self, seed: int | None = None, **options: Any) -> Any:
            self._state = state_type(episode_id=str(seed), note=options.get("note"))
            return obs_type(metadata={"options": options})

        def step(self, action: Any) -> Any:
            self._state.last = action
            self._state.count += 1
            return obs_type(echo=action, reward=float(self._state.count))

        def state(self) -> Any:
            return self._state

    return ModelEcho


def dump(model: BaseModel | None) -> Any:
    return None if model is None else model.model_dump(mode="json")


@given(data=st.data())
async def test_random_contracts_round_trip_through_a_real_server(data):
    action_type = data.draw(model_classes(base=Action))
    env_type = echo_env(action_type)
    sent = [data.draw(instances(action_type)) for _ in range(2)]
    with running(env_type) as srv:
        for codec in ("msgpack", "json"):
            async with AsyncEnvClient(srv.url, env=env_type, codec=codec) as env:
                first = await env.reset(seed=1, note="ünï ☃")
                assert first.info == {"options": {"note": "ünï ☃"}}
                for i, action in enumerate(sent, start=1):
                    result = await env.step(action)
                    assert dump(result.observation.echo) == dump(action)
                    assert result.reward == float(i)
                state = await env.state()
                assert dump(state.last) == dump(sent[-1]) and state.count == len(sent)
                assert state.model_extra == {"note": "ünï ☃"}  # State subclass extras survive


async def test_schema_decoded_client_matches_typed_client_and_errors_are_typed():
    action_type = create_model(
        "Act", __base__=Action, name=(str, ...), size=(int | None, None), tags=(list[str], [])
    )
    env_type = echo_env(action_type)
    with running(env_type) as srv:
        for codec in ("msgpack", "json"):
            async with AsyncEnvClient(srv.url, codec=codec) as env:  # models from /schema
                await env.reset()
                result = await env.step({"name": "x", "tags": ["a", ""]})
                assert result.observation.echo.model_dump() == {
                    "name": "x",
                    "size": None,
                    "tags": ["a", ""],
                }
                for bad in ({"size": 3}, {"name": "x", "size": "big"}, {"name": "x", "zz": 1}):
                    try:
                        await env.step(bad)
                    except InvalidAction as exc:
                        assert exc.details["errors"]
                    else:
                        raise AssertionError(f"{bad} was accepted")
