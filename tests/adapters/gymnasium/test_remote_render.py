"""``RemoteEnv`` behaves like ``gymnasium.make``'s environments: a spec, render modes
(frames rendered by the session's environment on the server) and ``gymnasium.make``
keywords on ``corral serve``'s command line."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium
import numpy as np
import pytest
import typer
from gymnasium.utils.env_checker import check_env
from gymnasium.wrappers import RenderCollection
from tests.support.gym_envs import PAINTED_ID

from corral.adapters.gymnasium import GymEnvironment, RemoteEnv
from corral.adapters.gymnasium.serving import GymFrameState
from corral.cli.serve import parse_make_kwargs, resolve_serve_target
from corral.testing import InProcessServer


@pytest.fixture(scope="module")
def painted() -> Any:
    served = GymEnvironment.for_id(PAINTED_ID, render_mode="rgb_array", shade=7)
    with InProcessServer(served) as server:
        yield server


def test_a_remote_env_has_a_spec_and_renders_server_frames(painted: Any) -> None:
    env = RemoteEnv.from_url(painted.url, dialer=painted.dialer, render_mode="rgb_array")
    try:
        assert env.spec is not None and env.spec.id == "corral/Painted-v0"
        assert env.metadata == {"render_modes": ["rgb_array"], "render_fps": 10.0}
        env.reset(seed=1)
        env.step(1)
        env.step(1)
        frame = env.render()
        count = int(env.state().step_count)  # type: ignore[attr-defined]
        assert count == 2
        assert frame.shape == (8, 8, 3) and frame.dtype == np.uint8
        assert int(frame[0, 0, 1]) == 7  # the make keyword reached the server's env
        obs = env.step(0)[0]
        assert int(env.render()[0, 0, 0]) == int(obs[0])  # the session's own env's frame
    finally:
        env.close()


def test_check_env_does_not_warn_with_the_render_check(painted: Any) -> None:
    env = RemoteEnv.from_url(painted.url, dialer=painted.dialer, render_mode="rgb_array")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env)
        assert [str(w.message) for w in caught] == []
        again = gymnasium.make(env.spec, render_mode="rgb_array")  # type: ignore[arg-type]
        again.reset(seed=0)
        assert again.render().shape == (8, 8, 3)
        again.close()
    finally:
        env.close()


def test_render_wrappers_collect_remote_frames(painted: Any) -> None:
    env = RenderCollection(
        RemoteEnv.from_url(painted.url, dialer=painted.dialer, render_mode="rgb_array")
    )
    env.reset(seed=0)
    for _ in range(3):
        env.step(1)
    frames = env.render()
    assert len(frames) == 4 and all(f.shape == (8, 8, 3) for f in frames)
    env.close()


def test_record_video_writes_a_file(painted: Any, tmp_path: Any) -> None:
    pytest.importorskip("moviepy")
    from gymnasium.wrappers import RecordVideo

    env = RecordVideo(
        RemoteEnv.from_url(painted.url, dialer=painted.dialer, render_mode="rgb_array"),
        str(tmp_path),
        episode_trigger=lambda _: True,
        disable_logger=True,
    )
    env.reset(seed=0)
    for _ in range(5):
        env.step(1)
    env.close()
    assert list(tmp_path.glob("*.mp4"))


def test_a_server_without_frames_refuses_rgb_array(painted: Any) -> None:
    with InProcessServer(GymEnvironment.for_id(PAINTED_ID)) as server:
        env = RemoteEnv.from_url(server.url, dialer=server.dialer)
        assert env.metadata["render_modes"] == [] and env.render() is None
        env.close()
        with pytest.raises(ValueError, match="render_mode 'rgb_array' is not served"):
            RemoteEnv.from_url(server.url, dialer=server.dialer, render_mode="rgb_array")


def test_make_kwargs_from_the_command_line() -> None:
    assert parse_make_kwargs(["render_mode=rgb_array", "shade=3", "flag=true", "x=[1, 2]"]) == {
        "render_mode": "rgb_array",
        "shade": 3,
        "flag": True,
        "x": [1, 2],
    }
    with pytest.raises(typer.BadParameter, match="key=value"):
        parse_make_kwargs(["novalue"])
    served = resolve_serve_target(f"gym:{PAINTED_ID}", make_kwargs={"render_mode": "rgb_array"})
    assert issubclass(served.state_type, GymFrameState)
    with pytest.raises(typer.BadParameter, match="only a 'gym:ENV_ID' target"):
        resolve_serve_target("corral.envs.echo:EchoEnv", make_kwargs={"a": 1})


def test_corral_serve_kwarg_through_a_real_server() -> None:
    from corral.client import SyncEnvClient

    client = SyncEnvClient.from_env(
        f"gym:{PAINTED_ID}",
        server_args=["--kwarg", "render_mode=rgb_array", "--kwarg", "shade=9"],
    )
    env = RemoteEnv(client, render_mode="rgb_array")
    try:
        env.reset(seed=0)
        assert int(env.render()[0, 0, 1]) == 9
    finally:
        env.close()
