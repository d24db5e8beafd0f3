"""The official MCP SDK client plays a served environment: reset, its action, its tools."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import BaseModel, Field

# Found, not imported: the MCP SDK takes seconds to import, and every pytest-xdist worker
# collects this module; sdk_client() imports it when a test runs.
if importlib.util.find_spec("mcp") is None:
    pytest.skip("needs the mcp extra", allow_module_level=True)

from examples.tictactoe.tictactoe import TicTacToeEnv
from tests.support.servers import ThreadServer, wait_until

from corral.adapters.mcp import DEFAULT_PATH, SESSION_HEADER, mount_mcp
from corral.contract import Action, Environment, Observation, State
from corral.contract.arrays import NDArray
from corral.contract.tools import tool


def sdk_client(*args: Any, **kwargs: Any) -> Any:
    """The official MCP SDK's client (``mcp.Client(*args, **kwargs)``)."""
    from mcp import Client as SdkClient

    return SdkClient(*args, **kwargs)


class NoteAction(Action):
    """Write a plain note."""

    text: str = Field(description="What to write.")


class NoteObservation(Observation):
    notes: int = 0


class Note(BaseModel):
    text: str
    priority: int


class NotebookEnv(Environment[NoteAction, NoteObservation, State]):
    """A notebook the agent writes in through tools."""

    description = "Keep notes."

    def __init__(self) -> None:
        self.notes: list[Note] = []
        self.seed: int | None = None
        self.topic = ""

    def reset(self, seed: int | None = None, topic: str = "") -> NoteObservation:
        self.notes, self.seed, self.topic = [], seed, topic
        return NoteObservation()

    def step(self, action: NoteAction) -> NoteObservation:
        self.notes.append(Note(text=action.text, priority=0))
        return NoteObservation(notes=len(self.notes))

    def state(self) -> State:
        return State(step_count=len(self.notes))

    @tool
    def add_note(self, text: str, priority: int = 1) -> Note:
        """Write a note.

        Args:
            text: what to write.
            priority: 1 (low) to 5 (high).
        """
        note = Note(text=text, priority=priority)
        self.notes.append(note)
        return note

    @tool
    def count(self) -> int:
        """How many notes there are."""
        return len(self.notes)

    @tool(name="find")
    async def search(self, word: str) -> list[str]:
        """Notes containing ``word``."""
        return [n.text for n in self.notes if word in n.text]

    @tool
    def episode(self) -> dict[str, Any]:
        """The episode's seed and topic."""
        return {"seed": self.seed, "topic": self.topic}

    @tool
    def tear_out(self) -> None:
        """Always fails."""
        raise ValueError("the page is glued")

    @tool
    def lengths(self) -> NDArray:
        """The length of each note, as an array."""
        return np.array([len(n.text) for n in self.notes], dtype=np.int32)


def notebook_server(idle_timeout_s: float) -> Iterator[ThreadServer]:
    server = ThreadServer(NotebookEnv, idle_timeout_s=idle_timeout_s)
    mount_mcp(server.app)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    # Sessions must outlive the pauses of a loaded machine between two requests of a test.
    yield from notebook_server(idle_timeout_s=600)


@pytest.fixture
def reaping_server() -> Iterator[ThreadServer]:
    yield from notebook_server(idle_timeout_s=0.5)


def _text(result: Any) -> str:
    return "".join(part.text for part in result.content)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_sdk_lists_and_calls_tools(server: ThreadServer, mode: str) -> None:
    async with sdk_client(f"{server.url}{DEFAULT_PATH}", mode=mode) as client:
        assert client.server_info is not None and client.server_info.name == "NotebookEnv"
        listed = await client.list_tools()
        names = [t.name for t in listed.tools]
        # reset and the action (named after NoteAction) first, then the env's own tools
        assert names[:2] == ["reset", "note"]
        assert set(names[2:]) == {"add_note", "count", "find", "episode", "tear_out", "lengths"}
        note = listed.tools[1]
        assert note.description.startswith("Write a plain note.")
        assert note.input_schema["properties"]["text"]["description"] == "What to write."
        add = next(t for t in listed.tools if t.name == "add_note")
        assert add.description.startswith("Write a note.")
        assert add.input_schema["properties"]["priority"]["default"] == 1
        assert add.input_schema["required"] == ["text"]
        written = await client.call_tool("add_note", {"text": "buy milk", "priority": 3})
        assert not written.is_error
        assert written.structured_content == {"text": "buy milk", "priority": 3}
        await client.call_tool("add_note", {"text": "buy bread"})
        counted = await client.call_tool("count", {})
        assert counted.structured_content == {"result": 2} and _text(counted) == "2"
        found = await client.call_tool("find", {"word": "milk"})
        assert found.structured_content == {"result": ["buy milk"]}
        failed = await client.call_tool("tear_out", {})
        assert failed.is_error and "the page is glued" in _text(failed)
        invalid = await client.call_tool("add_note", {"priority": "high"})
        assert invalid.is_error and "text" in _text(invalid) and "priority" in _text(invalid)
        # An array result reads as numbers, and matches the published output schema (the
        # SDK validates structured content against it).
        lengths = await client.call_tool("lengths", {})
        assert lengths.structured_content == {"result": [8, 9]} and _text(lengths) == "[8,9]"
        stepped = await client.call_tool("note", {"text": "a plain one"})
        assert not stepped.is_error and stepped.structured_content["notes"] == 3


async def test_one_mcp_session_is_one_episode(server: ThreadServer) -> None:
    url = f"{server.url}{DEFAULT_PATH}?seed=7&options=%7B%22topic%22%3A%22chores%22%7D"
    async with sdk_client(url, mode="legacy") as first:
        await first.call_tool("add_note", {"text": "a"})
        async with sdk_client(f"{server.url}{DEFAULT_PATH}", mode="legacy") as second:
            assert (await second.call_tool("count", {})).structured_content == {"result": 0}
            unseeded = await second.call_tool("episode", {})
            assert unseeded.structured_content == {"seed": None, "topic": ""}
        assert (await first.call_tool("count", {})).structured_content == {"result": 1}
        seeded = await first.call_tool("episode", {})
        assert seeded.structured_content == {"seed": 7, "topic": "chores"}
    # Leaving the client deleted both MCP sessions, freeing their slots.
    assert wait_until(lambda: server.manager.active == 0, timeout=60)


def _initialize(url: str, **headers: str) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    return httpx.post(url, json=body, headers={"Accept": "application/json", **headers})


def test_transport_rules(server: ThreadServer) -> None:
    url = f"{server.url}{DEFAULT_PATH}"
    reply = _initialize(url)
    assert reply.status_code == 200 and reply.json()["result"]["protocolVersion"] == "2025-06-18"
    session = reply.headers[SESSION_HEADER]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert httpx.post(url, json=call).status_code == 400  # no session header
    assert httpx.post(url, json=call, headers={SESSION_HEADER: "nope"}).status_code == 404
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx.post(url, json=notification, headers={SESSION_HEADER: session}).status_code == 202
    unknown = httpx.post(
        url, json={**call, "method": "resources/list"}, headers={SESSION_HEADER: session}
    )
    assert unknown.json()["error"]["code"] == -32601
    missing = httpx.post(
        url,
        json={**call, "method": "tools/call", "params": {"name": "nope"}},
        headers={SESSION_HEADER: session},
    )
    assert (
        missing.json()["error"]["code"] == -32602
        and "'reset'" in missing.json()["error"]["message"]
    )
    assert httpx.get(url).status_code == 405
    bad_version = httpx.post(
        url, json=call, headers={SESSION_HEADER: session, "MCP-Protocol-Version": "1999-01-01"}
    )
    assert bad_version.status_code == 400
    assert _initialize(url, Origin="http://evil.example").status_code == 403
    assert _initialize(f"{url}?seed=x").status_code == 400
    assert httpx.delete(url, headers={SESSION_HEADER: session}).status_code == 200
    assert httpx.delete(url, headers={SESSION_HEADER: session}).status_code == 404


def test_reaped_episodes_answer_404(reaping_server: ThreadServer) -> None:
    server = reaping_server
    url = f"{server.url}{DEFAULT_PATH}"
    session = _initialize(url).headers[SESSION_HEADER]
    assert wait_until(lambda: server.manager.active == 0, timeout=60)  # idle_timeout_s=0.5
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert httpx.post(url, json=call, headers={SESSION_HEADER: session}).status_code == 404


def test_args_docstring_becomes_parameter_descriptions():
    from corral.contract.tools import tools_of

    spec = tools_of(NotebookEnv)["add_note"]
    props = spec.input_schema["properties"]
    assert props["text"]["description"] == "what to write."
    assert props["priority"]["description"] == "1 (low) to 5 (high)."
    assert spec.description == "Write a note."


async def test_stdio_transport_runs_one_episode():
    import asyncio

    import orjson

    from corral.adapters.mcp import serve_stdio
    from corral.server import ServerConfig
    from corral.server.service import EnvService

    service = EnvService(NotebookEnv, ServerConfig())
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "add_note", "arguments": {"text": "hi"}},
        },
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "count"}},
    ]
    queue = [orjson.dumps(line) + b"\n" for line in lines] + [b"not json\n", b""]
    out: list[Any] = []

    async def read_line() -> bytes:
        await asyncio.sleep(0)
        return queue.pop(0)

    await serve_stdio(service, read_line, lambda data: out.append(orjson.loads(data)))
    assert out[0]["error"]["code"] == -32600  # not initialized yet
    assert out[1]["result"]["serverInfo"]["name"] == "NotebookEnv"
    assert out[2]["result"]["structuredContent"] == {"text": "hi", "priority": 1}
    assert out[3]["result"]["data"] == 1
    assert out[4]["error"]["code"] == -32700
    assert len(out) == 5 and service.manager.active == 0  # the episode ended with the input


@pytest.fixture(scope="module")
def tictactoe() -> Iterator[ThreadServer]:
    server = ThreadServer(TicTacToeEnv, idle_timeout_s=600)
    mount_mcp(server.app)
    server.start()
    yield server
    server.stop()


async def test_an_agent_plays_an_env_without_tools_through_reset_and_its_action(
    tictactoe: ThreadServer,
) -> None:
    async with sdk_client(f"{tictactoe.url}{DEFAULT_PATH}", mode="legacy") as client:
        assert client.server_info is not None
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert sorted(listed) == ["move", "reset"]
        move = listed["move"]
        assert move.description.startswith("Put your X on an empty cell.")
        row = move.input_schema["properties"]["row"]
        assert row["description"] == "The row, 0 (top) to 2 (bottom)."
        assert (row["minimum"], row["maximum"]) == (0, 2)
        assert listed["reset"].input_schema["properties"]["seed"]["default"] is None

        first = await client.call_tool("reset", {"seed": 3})
        assert not first.is_error
        assert first.structured_content["board"] == [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
        assert '"board":[[0,0,0],[0,0,0],[0,0,0]]' in _text(first)  # numbers, not base64

        invalid = await client.call_tool("move", {"row": 5, "col": 0})
        assert invalid.is_error
        assert _text(invalid) == (
            "[INVALID_ACTION] invalid MoveAction: row: Input should be less than or equal to 2"
        )

        observation = first.structured_content
        while not observation["done"]:
            board = observation["board"]
            cell = next((r, c) for r in range(3) for c in range(3) if board[r][c] == 0)
            result = await client.call_tool("move", {"row": cell[0], "col": cell[1]})
            assert not result.is_error, _text(result)
            observation = result.structured_content
            assert observation["board"][cell[0]][cell[1]] == 1
        assert observation["reward"] in (-1.0, 0.0, 1.0) and observation["metadata"]["result"]
        over = await client.call_tool("move", {"row": 0, "col": 0})
        assert over.is_error and _text(over).startswith("[EPISODE_ENDED]")
        again = await client.call_tool("reset", {})
        assert not again.is_error and again.structured_content["moves"] == 0
        seed = await client.call_tool("reset", {"seed": "three"})
        assert seed.is_error and "seed" in _text(seed)


def test_the_first_observation_is_in_the_instructions(tictactoe: ThreadServer) -> None:
    reply = _initialize(f"{tictactoe.url}{DEFAULT_PATH}?seed=1")
    instructions = reply.json()["result"]["instructions"]
    assert 'its first observation: {"board":[[0,0,0],[0,0,0],[0,0,0]],"moves":0}' in instructions
    assert "Act with the move tool" in instructions
    session = reply.headers[SESSION_HEADER]
    assert httpx.delete(f"{tictactoe.url}{DEFAULT_PATH}", headers={SESSION_HEADER: session})


def test_tool_names_that_clash_are_refused_when_mounted() -> None:
    from corral.adapters.mcp import McpSessions
    from corral.server import ServerConfig
    from corral.server.service import EnvService

    service = EnvService(NotebookEnv, ServerConfig())
    with pytest.raises(TypeError, match=r"\['count'\] take the name"):
        McpSessions(service, action_tool="count")
    with pytest.raises(TypeError, match="reserved"):
        McpSessions(service, action_tool="step")
    assert McpSessions(service, action_tool="write").play is not None
