"""The built-in environments' snapshots: echo, Wordle and Gymnasium's classic control,
in process and through a real server on both codecs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.support.servers import ThreadServer, running

from corral.adapters.gymnasium.serving import GymEnvironment, SnapshotGymEnvironment
from corral.client import AsyncEnvClient
from corral.contract import Environment
from corral.contract.schema import fingerprint
from corral.envs.echo import EchoAction, EchoEnv, EchoSnapshot
from corral.envs.wordle import SimplePolicy, WordleAction, WordleEnv, WordleSnapshot
from corral.errors import BadSnapshot, SnapshotUnsupported

CODECS = ["msgpack", "json"]

CARTPOLE = GymEnvironment.for_id("CartPole-v1")
FROZEN_LAKE = GymEnvironment.for_id("FrozenLake-v1")


def through_json(env: type[Environment[Any, Any, Any]], snapshot: Any) -> Any:
    """The snapshot as a restore receives it: its JSON form, validated by the model."""
    model = env.snapshot_type
    assert model is not None
    return model.model_validate_json(snapshot.model_dump_json())


def continues_exactly(
    env: type[Environment[Any, Any, Any]],
    seed: int,
    before: int,
    act: Callable[[int, Any], Any],
    after: int = 50,
) -> None:
    """Play ``before`` steps, snapshot, restore in a fresh instance, then play both on."""
    source = env()
    last = source.reset(seed=seed)
    for i in range(before):
        last = source.step(act(i, last))
    copy = env()
    restored = copy.restore(through_json(env, source.snapshot()))
    assert restored == last
    for i in range(before, before + after):
        if last.done:
            break
        action = act(i, last)
        last = source.step(action)
        assert copy.step(action) == last
    assert copy.state() == source.state()


def test_the_builtin_snapshot_models() -> None:
    assert EchoEnv.snapshot_type is EchoSnapshot
    assert WordleEnv.snapshot_type is WordleSnapshot
    assert issubclass(CARTPOLE, SnapshotGymEnvironment) and CARTPOLE.has_snapshots()
    assert not FROZEN_LAKE.has_snapshots()  # its state is not unwrapped.state


@pytest.mark.parametrize(
    ("env", "old"),
    [
        # Fingerprints before snapshots existed (main at 6ef6a18): the rest of the contract
        # is unchanged; only the snapshot schema was added.
        (EchoEnv, "sha256:58d8500a1c234bd7"),
        (WordleEnv, "sha256:19ec3a2da741602e"),
        (CARTPOLE, "sha256:5be2dc34caa42914"),
    ],
)
def test_declaring_a_snapshot_only_adds_its_schema(
    env: type[Environment[Any, Any, Any]], old: str
) -> None:
    schemas = env.contract().schemas
    assert "snapshot" in schemas
    assert fingerprint({k: v for k, v in schemas.items() if k != "snapshot"}) == old
    assert FROZEN_LAKE.contract().fingerprint == "sha256:36ec592ae7683f21"  # unchanged


def test_echo_continues_exactly() -> None:
    continues_exactly(EchoEnv, 1, 3, lambda i, _: EchoAction(message="x" * (i + 1)))
    fresh = EchoEnv().snapshot()  # before any reset
    assert EchoEnv().restore(through_json(EchoEnv, fresh)).echoed_message == ""


def test_wordle_continues_exactly_and_keeps_its_secret() -> None:
    policy = SimplePolicy(seed=5)
    continues_exactly(WordleEnv, 5, 2, lambda _, obs: policy.act(obs), after=10)
    source = WordleEnv()
    source.reset(seed=9)
    source.step(WordleAction(guess="crane"))
    snapshot = source.snapshot()
    assert snapshot.state.secret == source.state().secret  # the whole state travels
    small = WordleEnv(words=["apple", "crane", "zesty"])
    with pytest.raises(BadSnapshot, match="not in this server's word list"):
        small.restore(through_json(WordleEnv, snapshot))


@pytest.mark.parametrize(
    ("env_id", "actions"),
    [
        ("CartPole-v1", lambda i: i % 2),
        ("MountainCar-v0", lambda i: i % 3),
        ("Acrobot-v1", lambda i: i % 3),
        ("Pendulum-v1", lambda i: [((i % 5) - 2) / 2]),
    ],
)
@pytest.mark.parametrize("before", [0, 9])
def test_classic_control_continues_exactly(
    env_id: str, actions: Callable[[int], Any], before: int
) -> None:
    env = GymEnvironment.for_id(env_id)
    assert env.has_snapshots()
    continues_exactly(env, 3, before, lambda i, _: env.action_type(action=actions(i)), 300)
    # The generator travels too: an unseeded reset continues it the same way.
    source = env()
    source.reset(seed=4)
    copy = env()
    copy.restore(through_json(env, source.snapshot()))
    assert copy.reset() == source.reset()


def test_the_time_limit_travels_with_the_snapshot() -> None:
    env = GymEnvironment.for_id("MountainCar-v0", max_episode_steps=12)
    source = env()
    source.reset(seed=0)
    for _ in range(10):
        source.step(env.action_type(action=1))
    copy = env()
    copy.restore(through_json(env, source.snapshot()))
    copy.step(env.action_type(action=1))
    assert copy.step(env.action_type(action=1)).truncated  # step 12 of 12


def test_a_gym_snapshot_that_does_not_fit_is_refused() -> None:
    source = CARTPOLE()
    source.reset(seed=0)
    good = source.snapshot()
    for bad, field in [
        (good.model_copy(update={"env_state": good.env_state[:2]}), "state"),
        (good.model_copy(update={"rng": '{"bit_generator": "os.system"}'}), "generator"),
        (good.model_copy(update={"wrappers": {"FrameStack.frames": 4}}), "wrapper state"),
        (good.model_copy(update={"episode": {"gravity": 0.0}}), "episode attribute"),
    ]:
        with pytest.raises(BadSnapshot, match=field):
            CARTPOLE().restore(bad)


def test_a_never_reset_gym_session_restores_to_one_that_needs_a_reset() -> None:
    source = CARTPOLE()
    copy = CARTPOLE()
    placeholder = copy.restore(through_json(CARTPOLE, source.snapshot()))
    assert placeholder.observation.shape == (4,) and not placeholder.done
    assert copy.reset(seed=1) == source.reset(seed=1)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ThreadServer]]:
    with (
        running(EchoEnv) as echo,
        running(WordleEnv) as wordle,
        running(CARTPOLE) as cartpole,
        running(FROZEN_LAKE) as lake,
    ):
        yield {"echo": echo, "wordle": wordle, "cartpole": cartpole, "lake": lake}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", ["echo", "wordle", "cartpole"])
async def test_builtin_envs_restore_through_a_real_server(
    servers: dict[str, ThreadServer], name: str, codec: str
) -> None:
    env, act = {
        "echo": (EchoEnv, lambda i, _: EchoAction(message=f"m{i}")),
        "wordle": (WordleEnv, lambda _, obs: SimplePolicy(seed=2).act(obs)),
        "cartpole": (CARTPOLE, lambda i, _: CARTPOLE.action_type(action=i % 2)),
    }[name]
    url = servers[name].url
    async with AsyncEnvClient(url, env=env, codec=codec) as source:
        last = await source.reset(seed=2)
        for i in range(3):
            last = await source.step(act(i, last.observation))
        forks = await source.fork(2)
        try:
            for i in range(3, 6):
                if last.done:
                    break
                action = act(i, last.observation)
                last = await source.step(action)
                for fork in forks:
                    assert (await fork.step(action)).observation == last.observation
        finally:
            for fork in forks:
                await fork.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_an_env_gymnasium_cannot_snapshot_is_refused_cleanly(
    servers: dict[str, ThreadServer], codec: str
) -> None:
    async with AsyncEnvClient(servers["lake"].url, env=FROZEN_LAKE, codec=codec) as env:
        await env.reset(seed=1)
        with pytest.raises(SnapshotUnsupported, match="declares no snapshot"):
            await env.snapshot()
        assert (await env.step(FROZEN_LAKE.action_type(action=1))).observation is not None
