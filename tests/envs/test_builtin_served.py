"""The built-in environments through the real client and server (in process), both codecs."""

from __future__ import annotations

import pytest

from corral.envs.echo import EchoAction, EchoEnv
from corral.envs.wordle import SimplePolicy, WordleAction, WordleEnv
from corral.errors import InvalidAction, InvalidArgument
from corral.testing import InProcessServer

CODECS = ["msgpack", "json"]


@pytest.mark.parametrize("codec", CODECS)
async def test_echo_served(codec):
    async with InProcessServer(EchoEnv) as srv, srv.client(codec=codec) as env:
        first = await env.reset(seed=4, episode_id="ep-1")
        assert first.observation.echoed_message == "ready" and first.info == {"seed": 4}
        hi = await env.step(EchoAction(message="héllo 🌍"))
        assert hi.observation.echoed_message == "héllo 🌍"
        assert hi.reward == pytest.approx(0.7)
        with pytest.raises(InvalidAction):  # refused by the server's validation
            await env.step(EchoAction.model_construct(message=""))
        bye = await env.step(EchoAction(message="bye"))
        assert bye.terminated and not bye.truncated
        state = await env.state()
        assert state.episode_id == "ep-1" and state.step_count == 2 and state.total_length == 10


@pytest.mark.parametrize("codec", CODECS)
async def test_wordle_served_is_deterministic_and_typed(codec):
    async with InProcessServer(WordleEnv) as srv:
        runs = []
        for _ in range(2):
            async with srv.client(codec=codec) as env:
                policy = SimplePolicy(seed=11)
                result = await env.reset(seed=11)
                trace = []
                while not result.done:
                    result = await env.step(policy.act(result.observation))
                    trace.append(
                        (result.observation.guess, result.observation.pattern, result.reward)
                    )
                state = await env.state()
                assert state.solved == result.terminated
                runs.append((trace, result.observation.secret))
        assert runs[0] == runs[1]


async def test_wordle_truncation_and_errors():
    async with InProcessServer(WordleEnv) as srv, srv.client() as env:
        await env.reset(seed=1, max_turns=2)
        await env.step(WordleAction(guess="qqqqq"))  # not a word: uses a turn, not a guess
        last = await env.step(WordleAction(guess="zzzzz"))
        assert last.truncated and not last.terminated and last.done
        with pytest.raises(InvalidAction):
            await env.step({"guess": "toolong"})
        with pytest.raises(InvalidArgument):
            await env.reset(color="blue")
