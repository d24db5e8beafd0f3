"""TRL's environment_factory: the generated class through TRL's own tool handling."""

from __future__ import annotations

import gc
import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Found, not imported: trl and transformers take seconds to import, and every pytest-xdist
# worker collects this module; the tests import them when they run.
if importlib.util.find_spec("trl") is None:
    pytest.skip("needs the trl extra", allow_module_level=True)

from tests.support.envs import CounterEnv

from corral.adapters.trl import CorralEnvironment, environment_factory
from corral.envs.echo import EchoEnv
from corral.envs.wordle import SimplePolicy, WordleObservation


def get_json_schema(function: Any) -> dict[str, Any]:
    """transformers' JSON schema of a tool function: what TRL renders into the prompt."""
    from transformers.utils import get_json_schema as schema_of

    return schema_of(function)  # type: ignore[no-any-return]


def trl_tools(instance: object) -> dict[str, Any]:
    """The tools TRL's GRPOTrainer takes from an environment instance.

    This mirrors ``GRPOTrainer.__init__``/``_generate_and_score_completions`` (TRL 1.16):
    every function of the class not starting with ``_`` except ``reset``/``get_reward``.
    """
    methods = {}
    for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction):
        if name not in ("reset", "get_reward") and not name.startswith("_"):
            methods[name] = getattr(instance, name)
    return methods


def test_trl_sees_exactly_one_documented_tool_for_wordle() -> None:
    Wordle = environment_factory("corral.envs.wordle:WordleEnv", tool_name="guess")
    try:
        instance = Wordle()
        assert callable(type(instance).reset)
        tools = trl_tools(instance)
        assert list(tools) == ["guess"]
        described = get_json_schema(tools["guess"])  # what TRL renders into the prompt
        assert described["type"] == "function"
        schema = described["function"]
        assert schema["name"] == "guess"
        assert schema["description"].startswith("One guess: exactly five ASCII letters")
        parameters = schema["parameters"]
        assert parameters["required"] == ["guess"]
        guess = parameters["properties"]["guess"]
        assert guess["type"] == "string"
        assert "Five ASCII letters" in guess["description"]
        assert "^[A-Za-z]{5}$" in guess["description"]
        assert schema["return"]["type"] == "string"
    finally:
        Wordle._pool.close()


def test_typed_arguments_of_every_kind() -> None:
    Counter = environment_factory(CounterEnv)
    tools = trl_tools(Counter())
    schema = get_json_schema(tools["count"])["function"]
    properties = schema["parameters"]["properties"]
    assert properties["amount"]["type"] == "integer"
    assert properties["sleep"]["type"] == "number" and ">= 0" in properties["sleep"]["description"]
    assert properties["fail"]["type"] == "boolean"
    assert properties["note"] == {**properties["note"], "type": "string", "nullable": True}
    assert "required" not in schema["parameters"]  # every CountAction field has a default


def _reward(environments: list[CorralEnvironment], **kwargs: Any) -> list[float]:
    """A reward function as TRL calls it: it reads state from the instances."""
    return [env.reward for env in environments]


@pytest.fixture
def wordle() -> Iterator[type[CorralEnvironment]]:
    cls = environment_factory(
        "corral.envs.wordle:WordleEnv",
        tool_name="guess",
        option_columns=["max_guesses"],
        reward_method=True,
    )
    yield cls
    cls._pool.close()


def test_scripted_rollouts_share_one_server_and_its_sessions(
    wordle: type[CorralEnvironment],
) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": "Play."}], "seed": s, "max_guesses": 6}
        for s in range(4)
    ]
    environments = [wordle() for _ in rows]  # one instance per rollout, no arguments
    pool = wordle._pool
    assert pool.server is not None and pool.created == len(rows)
    for env, row in zip(environments, rows, strict=True):
        intro = env.reset(**row)  # TRL appends this to the last user message
        assert "Guess the 5-letter word in 6 guesses" in intro
    for index, env in enumerate(environments):
        tool = trl_tools(env)["guess"]
        policy = SimplePolicy(seed=index)
        while not env.done:
            assert isinstance(env.observation, WordleObservation) or env.observation is not None
            reply = tool(**{"guess": policy.act(env.observation).guess})  # TRL: tool(**arguments)
            assert isinstance(reply, str)
        with pytest.raises(RuntimeError, match="episode is over"):
            tool(guess="crane")
    rewards = _reward(environments)
    assert rewards == [env.get_reward() for env in environments]  # type: ignore[attr-defined]
    assert all(r > 1.0 for r in rewards), rewards  # SimplePolicy solves these words
    assert all(env.state.model_dump()["solved"] for env in environments)
    # Instances TRL drops hand their sessions back; new ones reuse them.
    del environments, env, tool
    gc.collect()
    assert pool.idle == len(rows)
    again = [wordle() for _ in range(2)]
    assert pool.created == len(rows) and pool.idle == len(rows) - 2
    again[0].reset(seed=9)
    assert again[0].steps == 0 and again[0].reward == 0.0


def test_in_process_class_and_bad_inputs() -> None:
    Echo = environment_factory(EchoEnv, seed_column=None)
    echo = Echo()
    assert echo.reset(prompt="ignored").startswith("{")
    reply = trl_tools(echo)["echo"](message="hi")
    assert '"echoed_message":"hi"' in reply and echo.steps == 1
    with pytest.raises(TypeError, match="unexpected keyword argument 'volume'"):
        trl_tools(echo)["echo"](message="hi", volume=3)
    with pytest.raises(ValueError, match="reserved"):
        environment_factory(EchoEnv, tool_name="reset")
    with pytest.raises(TypeError, match="needs an Environment subclass"):
        environment_factory(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must hold integers"):
        environment_factory(EchoEnv)().reset(seed="three")


def _notes_tools_are_typed_and_documented(instance: object) -> None:
    tools = trl_tools(instance)
    assert sorted(tools) == ["count", "note", "search"]
    search = get_json_schema(tools["search"])["function"]
    assert search["description"].startswith("The notes containing ``word``")
    assert search["parameters"]["required"] == ["word"]
    assert search["parameters"]["properties"]["word"]["type"] == "string"
    assert search["parameters"]["properties"]["limit"]["type"] == "integer"
    assert "default 10" in search["parameters"]["properties"]["limit"]["description"]
    assert get_json_schema(tools["count"])["function"]["name"] == "count"


def _notes_rollout(Notes: type[CorralEnvironment]) -> None:
    first, second = Notes(), Notes()
    first.reset()
    second.reset()
    first.note(text="buy milk")  # type: ignore[attr-defined]
    first.note(text="call mom")  # type: ignore[attr-defined]
    second.note(text="milk again")  # type: ignore[attr-defined]
    # Each rollout's tools run on its own episode's instance.
    assert first.search("milk") == '["buy milk"]'  # type: ignore[attr-defined]
    assert first.count() == "2"  # type: ignore[attr-defined]
    assert second.count() == "1"  # type: ignore[attr-defined]
    assert first.search(word="m", limit=1) == '["buy milk"]'  # type: ignore[attr-defined]
    assert first.search(word=3).startswith("error: ")  # type: ignore[attr-defined]
    assert first.reward == 2.0 and first.steps == 2
    assert first.state.step_count == 2  # type: ignore[attr-defined]


def test_environment_tools_reach_trl_in_process() -> None:
    from tests.support.tool_env import NotesEnv

    Notes = environment_factory(NotesEnv, tool_name="note")
    _notes_tools_are_typed_and_documented(Notes())
    _notes_rollout(Notes)


def test_environment_tools_reach_trl_through_a_real_server() -> None:
    from tests.support.servers import running
    from tests.support.tool_env import NotesEnv

    with running(NotesEnv) as server:
        Notes = environment_factory(server.url, tool_name="note")
        try:
            _notes_tools_are_typed_and_documented(Notes())
            _notes_rollout(Notes)
        finally:
            Notes._pool.close()


TICTACTOE = str(Path(__file__).resolve().parents[2] / "examples" / "tictactoe")


@pytest.mark.parametrize("source", ["in-process", "served"])
def test_an_array_observation_reads_as_numbers_and_bad_actions_as_one_line(source: str) -> None:
    from examples.tictactoe.tictactoe import TicTacToeEnv

    from corral.errors import InvalidAction

    # env= gives the remote client the environment's own models, so both paths validate
    # with the same validators and must say the same.
    Game = (
        environment_factory(TicTacToeEnv)
        if source == "in-process"
        else environment_factory(TICTACTOE, env=TicTacToeEnv)
    )
    try:
        game = Game()
        assert game.reset(seed=2) == '{"board":[[0,0,0],[0,0,0],[0,0,0]],"moves":0}'
        move = trl_tools(game)["move"]
        text = move(row=1, col=1)
        assert text.startswith('{"board":[[') and '"moves":2' in text and "dtype" not in text
        with pytest.raises(InvalidAction) as refused:
            move(row=3, col=0)
        assert str(refused.value) == (
            "[INVALID_ACTION] invalid MoveAction: row: Input should be less than or equal to 2"
        )
    finally:
        Game._pool.close()
