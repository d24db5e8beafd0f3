"""Proof, server side: openenv-core's own clients and validator against corral servers.

Every server here is a real ``corral serve`` child process on 127.0.0.1; the clients are
``openenv.core`` 0.3.0's, unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from pydantic import BaseModel
from tests.support.peers import corral_server
from websockets.exceptions import ConnectionClosed

# The tests that import openenv (~2.7 s of CPU in a process) share one xdist worker: the
# import is paid once, not by every worker that one of them lands on.
pytestmark = pytest.mark.xdist_group("openenv")


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with corral_server("corral.envs.echo:EchoEnv", "--max-sessions", "4") as url:
        yield url


@pytest.fixture(scope="module")
def wordle_url() -> Iterator[str]:
    with corral_server("corral.envs.wordle:WordleEnv") as url:
        yield url


# -- GenericEnvClient ----------------------------------------------------------------


async def test_generic_client_async_echo_episode(echo_url):
    from openenv.core.generic_client import GenericEnvClient

    async with GenericEnvClient(base_url=echo_url) as env:
        with pytest.raises(RuntimeError, match=r"call reset\(\) before step.*EXECUTION_ERROR"):
            await env.step({"message": "too early"})
        result = await env.reset(seed=7, episode_id="ep-7")
        assert result.observation == {"echoed_message": "ready", "message_length": 0}
        assert result.done is False and result.reward is None
        result = await env.step({"message": "hello"})
        assert result.observation["echoed_message"] == "hello"
        assert result.reward == pytest.approx(0.5)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            await env.step({"message": ""})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            await env.step({"nessage": "typo"})
        state = await env.state()
        assert state == {"episode_id": "ep-7", "step_count": 1, "total_length": 5}
        result = await env.step({"message": "bye"})
        assert result.done is True
        with pytest.raises(RuntimeError, match=r"the episode has ended.*EXECUTION_ERROR"):
            await env.step({"message": "after"})
        result = await env.reset()
        assert result.done is False


def test_generic_client_sync_wordle_episode(wordle_url):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=wordle_url).sync() as env:
        result = env.reset(seed=1, word="crane")
        assert result.observation["guesses_left"] == 6
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"guess": "ab"})  # the custom validator's error keeps the session
        result = env.step({"guess": "slate"})
        assert result.observation["pattern"] and result.done is False
        result = env.step({"guess": "crane"})
        assert result.done is True and result.reward > 1
        assert result.observation["secret"] == "crane"
        state = env.state()
        assert state["solved"] is True and state["guesses"] == ["slate", "crane"]
        with pytest.raises(RuntimeError, match=r"invalid wordle options.*VALIDATION_ERROR"):
            env.reset(max_guesses=0)
        assert env.reset(seed=2).done is False


def test_generic_client_against_a_full_server():
    from openenv.core.generic_client import GenericEnvClient

    with corral_server("corral.envs.echo:EchoEnv", "--max-sessions", "1") as url:
        holder = GenericEnvClient(base_url=url).sync()
        with holder:
            holder.reset()
            refused = GenericEnvClient(base_url=url).sync()
            with refused, pytest.raises((RuntimeError, ConnectionClosed)) as info:
                refused.reset()
            # The server sends CAPACITY_REACHED and closes with 1000 (as openenv-core does):
            # the OpenEnv client raises it, or fails its send if the close came first.
            if isinstance(info.value, RuntimeError):
                assert "CAPACITY_REACHED" in str(info.value)
            else:
                assert info.value.rcvd is not None and info.value.rcvd.code == 1000
            assert holder.step({"message": "still here"}).observation["message_length"] == 10
        # the slot is freed once the first client closed
        with GenericEnvClient(base_url=url).sync() as again:
            assert again.reset().done is False


# -- typed EnvClient subclasses ------------------------------------------------------


async def test_typed_client_echo(echo_url):
    from tests.support.openenv_clients import EchoAction, EchoClient, EchoObservation

    async with EchoClient(base_url=echo_url) as env:
        result = await env.reset(seed=3)
        assert isinstance(result.observation, EchoObservation)
        assert result.observation.metadata == {"seed": 3}  # corral keeps metadata
        result = await env.step(EchoAction(message="typed"))
        assert result.observation.echoed_message == "typed"
        assert result.observation.message_length == 5
        state = await env.state()
        assert state.step_count == 1 and state.total_length == 5  # type: ignore[attr-defined]


def test_typed_client_wordle_sync(wordle_url):
    from tests.support.openenv_clients import WordleAction, WordleClient, WordleObservation

    with WordleClient(base_url=wordle_url).sync() as env:
        result = env.reset(word="crane")
        assert isinstance(result.observation, WordleObservation)
        for guess in ("slate", "crane"):
            result = env.step(WordleAction(guess=guess))
        assert result.done and result.observation.secret == "crane"
        assert [h["guess"] for h in result.observation.history] == ["slate", "crane"]
        with pytest.raises(RuntimeError, match="EXECUTION_ERROR"):
            env.step(WordleAction(guess="crane"))


# -- MCP and the validator -----------------------------------------------------------


async def test_openenv_mcp_client_over_http():
    from openenv.core.mcp_client import MCPToolClient

    with corral_server("tests.support.tool_env:NotesEnv") as url:
        client = MCPToolClient(base_url=url)
        client.use_production_mode = True  # OpenEnv's HTTP /mcp path, with a session
        try:
            tools = await client.list_tools()
            assert sorted(t.name for t in tools) == ["count", "search"]
            assert tools[0].input_schema["type"] == "object"
            assert await client.call_tool("count") == 0
            assert await client.call_tool("search", word="x") == []
            with pytest.raises(RuntimeError, match="Unknown tool"):
                await client.call_tool("nope")
        finally:
            await client.close()


class _Note(BaseModel):
    """A plain action: MCPToolClient sends its ``model_dump()`` as the step's data."""

    text: str


async def test_openenv_mcp_client_tool_actions_over_ws():
    """openenv-core 0.3's MCPToolClient lists and calls tools as step actions on /ws;
    a corral environment with @tool methods answers them as OpenEnv's MCPEnvironment."""
    from openenv.core.mcp_client import MCPToolClient

    with corral_server("tests.support.tool_env:NotesEnv") as url:
        client = MCPToolClient(base_url=url)
        try:
            tools = await client.list_tools()
            assert sorted(t.name for t in tools) == ["count", "search"]
            search = next(t for t in tools if t.name == "search")
            assert search.input_schema["properties"]["word"]["type"] == "string"
            await client.reset()
            assert await client.call_tool("count") == 0
            # The session's own instance: a note stepped in is what the tools see.
            await client.step(_Note(text="a fox"))
            assert await client.call_tool("count") == 1
            assert await client.call_tool("search", word="fox") == ["a fox"]
            with pytest.raises(RuntimeError, match="tool_not_found"):
                await client.call_tool("nope")
            with pytest.raises(RuntimeError, match="invalid_args"):
                await client.call_tool("search", limit="many")
        finally:
            await client.close()


def test_openenv_validate_passes(echo_url):
    url = echo_url
    run = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "validate", "--url", url, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["passed"] is True
    assert report["standard_profile"] == "openenv-http/1.x" and report["mode"] == "simulation"
    assert report["summary"]["failed_criteria"] == []
