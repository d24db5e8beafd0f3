"""The OpenEnv envelope translation, without sockets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.errors import (
    BadFrame,
    BadMessage,
    CapacityReached,
    EnvError,
    EpisodeEnded,
    ErrorCode,
    FactoryError,
    FrameTooLarge,
    InvalidAction,
    InvalidArgument,
    ResetRequired,
    SessionLost,
    StepTimeout,
    UnknownType,
    UnsupportedProtocol,
)
from corral.protocol import messages as m
from corral.protocol import openenv as oe

# -- error mapping -------------------------------------------------------------------


def test_every_corral_code_has_an_openenv_code():
    assert set(oe.OPENENV_CODES) == {str(code) for code in ErrorCode}
    assert set(oe.OPENENV_CODES.values()) <= set(oe.OpenEnvCode)


@pytest.mark.parametrize(
    ("exc", "code", "fatal"),
    [
        (BadFrame("x"), "INVALID_JSON", False),
        (UnknownType("x"), "UNKNOWN_TYPE", False),
        (BadMessage("x", details={"field": "data"}), "VALIDATION_ERROR", False),
        (InvalidAction("x", details={"errors": [{"loc": ["a"]}]}), "VALIDATION_ERROR", False),
        (InvalidArgument("x"), "VALIDATION_ERROR", False),
        (FrameTooLarge("x"), "VALIDATION_ERROR", False),
        (ResetRequired("x"), "EXECUTION_ERROR", False),
        (EpisodeEnded("x"), "EXECUTION_ERROR", False),
        (EnvError("x"), "EXECUTION_ERROR", False),
        (
            CapacityReached("x", details={"active_sessions": 2, "max_sessions": 2}),
            "CAPACITY_REACHED",
            True,
        ),
        (FactoryError("x", details={"factory": "Env"}), "FACTORY_ERROR", True),
        (StepTimeout("x"), "SESSION_ERROR", True),
        (SessionLost("x"), "SESSION_ERROR", True),
    ],
)
def test_error_frames(exc, code, fatal):
    frame = oe.error_frame(exc)
    assert frame["type"] == "error"
    data = frame["data"]
    assert data["code"] == code and data["message"] == "x"
    assert data["corral_code"] == str(exc.code)
    assert oe.is_fatal(frame) is fatal
    orjson.dumps(frame)  # always serializable


def test_error_frame_extras():
    data = oe.error_frame(InvalidAction("bad", details={"errors": [{"loc": ["a"]}]}))["data"]
    assert data["errors"] == [{"loc": ["a"]}] and "details" not in data
    data = oe.error_frame(BadMessage("bad", details={"field": "data"}))["data"]
    assert data["errors"] == [{"type": "bad_message", "loc": ["data"], "msg": "bad"}]
    data = oe.error_frame(
        CapacityReached("full", details={"active_sessions": 3, "max_sessions": 3})
    )["data"]
    assert (data["active_sessions"], data["max_sessions"]) == (3, 3)
    data = oe.error_frame(FactoryError("no", details={"factory": "Env"}))["data"]
    assert data["factory_name"] == "Env" and data["details"] == {"factory": "Env"}
    assert not oe.is_fatal({"type": "observation", "data": {}})


# -- observations --------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    fields=st.dictionaries(
        st.text(min_size=1, max_size=6).filter(lambda k: k not in oe.LIFTED_KEYS),
        json_values,
        max_size=5,
    ),
    reward=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    done=st.booleans(),
    truncated=st.booleans(),
    metadata=st.dictionaries(st.text(max_size=4), json_values, max_size=3),
)
def test_flatten_then_unflatten_round_trips(fields, reward, done, truncated, metadata):
    obs = {**fields, "reward": reward, "done": done, "truncated": truncated, "metadata": metadata}
    flat = oe.flatten_observation(obs)
    assert flat["observation"] == fields
    assert flat["done"] is done and flat["truncated"] is truncated
    assert flat["reward"] == reward and flat["metadata"] == metadata
    back = oe.unflatten_observation(orjson.loads(orjson.dumps(flat)))
    expected = {k: v for k, v in obs.items() if not (k in oe.LIFTED_KEYS and v is None)}
    assert back == expected


def test_unflatten_openenv_layouts():
    # openenv-core 0.3: no metadata; bool rewards are allowed there.
    assert oe.unflatten_observation({"observation": {"a": 1}, "reward": True, "done": False}) == {
        "a": 1,
        "reward": 1.0,
        "done": False,
    }
    # openenv 0.10: metadata both nested and top level; the top level wins.
    back = oe.unflatten_observation(
        {"observation": {"a": 1, "metadata": {"x": 0}}, "done": True, "metadata": {"x": 1}}
    )
    assert back == {"a": 1, "metadata": {"x": 1}, "done": True}
    for bad in (None, [], {"observation": 3}, {"reward": 1}):
        with pytest.raises(BadMessage, match=r"data\.observation"):
            oe.unflatten_observation(bad)


# -- server side ---------------------------------------------------------------------


def translator(
    reset_options: frozenset[str] | None = None, action_fields: frozenset[str] = frozenset({"x"})
) -> oe.ServerTranslator:
    return oe.ServerTranslator(
        "s1", reset_options=reset_options, action_fields=action_fields, max_frame_bytes=1000
    )


def test_reset_step_state_become_corral_requests():
    t = translator()
    call = t.read(b'{"type": "reset", "data": {"seed": 3, "episode_id": "e", "k": 1}}')
    assert isinstance(call, oe.Call)
    assert call.request == m.Reset(id=1, session="s1", seed=3, options={"episode_id": "e", "k": 1})
    call = t.read('{"type": "reset"}')
    assert call == oe.Call(m.Reset(id=2, session="s1", seed=None, options={}))
    call = t.read('{"type": "step", "data": {"x": 1}}')
    assert call == oe.Call(m.Step(id=3, session="s1", action={"x": 1}))
    assert t.read('{"type": "state"}') == oe.Call(m.GetState(id=4, session="s1"))
    assert t.read('{"type": "close"}') == oe.OpenEnvClose()
    assert t.read('{"type": "mcp", "data": {"jsonrpc": "2.0"}}') == oe.McpMessage(
        {"jsonrpc": "2.0"}
    )


def test_episode_id_is_dropped_only_when_the_env_does_not_take_it():
    frame = '{"type": "reset", "data": {"episode_id": "e"}}'
    for options, kept in ((None, True), (frozenset({"episode_id"}), True), (frozenset(), False)):
        call = translator(reset_options=options).read(frame)
        assert isinstance(call, oe.Call) and isinstance(call.request, m.Reset)
        assert ("episode_id" in call.request.options) is kept
    # Other unknown options are passed on, for the service to refuse loudly.
    call = translator(reset_options=frozenset()).read('{"type": "reset", "data": {"typo": 1}}')
    assert isinstance(call, oe.Call) and call.request.options == {"typo": 1}  # type: ignore[union-attr]


def test_openenv_base_action_metadata_is_dropped_when_the_model_has_none():
    t = translator(action_fields=frozenset({"x"}))
    call = t.read('{"type": "step", "data": {"x": 1, "metadata": {}}}')
    assert call.request.action == {"x": 1}  # type: ignore[union-attr]
    call = t.read('{"type": "step", "data": {"x": 1, "metadata": {"a": 1}}}')
    assert call.request.action == {"x": 1, "metadata": {"a": 1}}  # type: ignore[union-attr]
    t = translator(action_fields=frozenset({"x", "metadata"}))
    call = t.read('{"type": "step", "data": {"x": 1, "metadata": {}}}')
    assert call.request.action == {"x": 1, "metadata": {}}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("frame", "error", "match"),
    [
        ("not json", BadFrame, "Invalid JSON"),
        ("[1, 2]", BadMessage, "JSON object"),
        ('{"data": {}}', UnknownType, "Unknown message type: None"),
        ('{"type": "nope"}', UnknownType, "Unknown message type: 'nope'"),
        ('{"type": 3}', UnknownType, "Unknown message type"),
        ('{"type": "state", "extra": 1}', BadMessage, "invalid 'state' message"),
        ('{"type": "close", "data": {}}', BadMessage, "invalid 'close' message"),
        ('{"type": "step"}', BadMessage, "invalid 'step' message"),
        ('{"type": "step", "data": [1]}', BadMessage, "invalid 'step' message"),
        ('{"type": "reset", "data": null}', BadMessage, "invalid 'reset' message"),
        ('{"type": "mcp"}', BadMessage, "invalid 'mcp' message"),
        ('{"type": "reset", "data": {"seed": -1}}', InvalidArgument, "seed"),
        ('{"type": "reset", "data": {"seed": "3"}}', BadMessage, "seed"),
        ('{"type": "reset", "data": {"seed": true}}', BadMessage, "seed"),
        ('{"type": "state", "pad": "' + "x" * 1000 + '"}', FrameTooLarge, "exceeds"),
    ],
)
def test_bad_frames(frame, error, match):
    with pytest.raises(error, match=match) as info:
        translator().read(frame)
    frame_out = oe.error_frame(info.value)
    orjson.dumps(frame_out)
    if frame_out["data"]["code"] == "VALIDATION_ERROR":
        assert isinstance(frame_out["data"]["errors"], list) and frame_out["data"]["errors"]


def test_envelope_errors_list_the_offending_keys():
    with pytest.raises(BadMessage) as info:
        translator().read('{"type": "state", "extra": 1}')
    errors = oe.error_frame(info.value)["data"]["errors"]
    assert errors[0]["type"] == "extra_forbidden" and errors[0]["loc"] == ["extra"]


def test_corral_replies_become_openenv_frames():
    t = translator()
    obs = {"a": 1, "reward": 0.5, "done": True, "truncated": False, "metadata": {"m": 1}}
    assert t.reply(m.Result(1, "s1", obs).to_wire()) == {
        "type": "observation",
        "data": {
            "observation": {"a": 1},
            "reward": 0.5,
            "done": True,
            "metadata": {"m": 1},
            "truncated": False,
        },
    }
    assert t.reply(m.StateReply(2, "s1", {"step_count": 1}).to_wire()) == {
        "type": "state",
        "data": {"step_count": 1},
    }
    frame = t.reply(m.ErrorReply(3, "RESET_REQUIRED", "reset first").to_wire())
    assert (
        frame["data"]["code"] == "EXECUTION_ERROR"
        and frame["data"]["corral_code"] == "RESET_REQUIRED"
    )
    with pytest.raises(ValueError, match="no OpenEnv form"):
        t.reply(m.Closed(4, "s1").to_wire())


# -- mcp frames ----------------------------------------------------------------------


def test_mcp_frames_carry_the_json_rpc_object():
    assert oe.mcp_frame({"x": 1}) == {"type": "mcp", "data": {"x": 1}}


# -- client side ---------------------------------------------------------------------


def test_client_frames():
    assert oe.client_frame({"type": "reset", "seed": 2, "options": {"k": 1}}) == {
        "type": "reset",
        "data": {"k": 1, "seed": 2},
    }
    assert oe.client_frame({"type": "reset", "seed": None, "options": {}}) == {
        "type": "reset",
        "data": {},
    }
    assert oe.client_frame({"type": "step", "action": {"a": 1}}) == {
        "type": "step",
        "data": {"a": 1},
    }
    assert oe.client_frame({"type": "state"}) == {"type": "state"}
    assert oe.client_frame({"type": "close", "session": "s"}) == {"type": "close"}
    with pytest.raises(BadMessage, match="must be an object"):
        oe.client_frame({"type": "step", "action": [1]})
    for kind in ("attach", "hello", "batch"):
        with pytest.raises(UnsupportedProtocol, match="not available over the OpenEnv envelope"):
            oe.client_frame({"type": kind})


def reply(kind: str, frame: Any) -> dict[str, Any]:
    return oe.client_reply(kind, orjson.dumps(frame), request_id=5, session="s")


def test_client_replies():
    got = reply(
        "step",
        {"type": "observation", "data": {"observation": {"a": 1}, "reward": 1, "done": True}},
    )
    assert got == m.Result(5, "s", {"a": 1, "reward": 1, "done": True}).to_wire()
    assert (
        reply("state", {"type": "state", "data": {"step_count": 2}})
        == m.StateReply(5, "s", {"step_count": 2}).to_wire()
    )
    with pytest.raises(
        BadMessage, match="expected an OpenEnv 'state' reply to 'state', got 'observation'"
    ):
        reply("state", {"type": "observation", "data": {"observation": {}}})
    with pytest.raises(BadMessage, match="must carry an object"):
        reply("state", {"type": "state", "data": [1]})
    with pytest.raises(BadFrame):
        oe.client_reply("state", b"nope", request_id=1, session="s")
    with pytest.raises(BadMessage):
        oe.client_reply("state", b"[1]", request_id=1, session="s")


@pytest.mark.parametrize(
    ("kind", "data", "error"),
    [
        ("step", {"code": "VALIDATION_ERROR", "message": "m", "errors": []}, InvalidAction),
        ("reset", {"code": "VALIDATION_ERROR", "message": "m"}, InvalidArgument),
        ("state", {"code": "VALIDATION_ERROR", "message": "m"}, BadMessage),
        ("step", {"code": "INVALID_JSON", "message": "m"}, BadFrame),
        ("step", {"code": "UNKNOWN_TYPE", "message": "m"}, UnknownType),
        ("step", {"code": "EXECUTION_ERROR", "message": "m"}, EnvError),
        (
            "step",
            {"code": "CAPACITY_REACHED", "message": "m", "active_sessions": 1, "max_sessions": 1},
            CapacityReached,
        ),
        ("step", {"code": "FACTORY_ERROR", "message": "m", "factory_name": "f"}, FactoryError),
        ("step", {"code": "SESSION_ERROR", "message": "m"}, SessionLost),
        ("step", {"code": "SOMETHING_NEW", "message": "m"}, EnvError),
        (
            "step",
            {"code": "EXECUTION_ERROR", "corral_code": "EPISODE_ENDED", "message": "m"},
            EpisodeEnded,
        ),
    ],
)
def test_client_error_replies(kind, data, error):
    with pytest.raises(error) as info:
        reply(kind, {"type": "error", "data": data})
    exc = info.value
    assert exc.message == "m" and exc.request_id == 5
    assert exc.details["openenv_code"] == data["code"]
    for key in ("errors", "active_sessions", "max_sessions", "factory_name"):
        if key in data:
            assert exc.details[key] == data[key]


def test_tool_actions_become_tool_steps_only_when_asked():
    """OpenEnv 0.3's MCPToolClient sends list_tools/call_tool as step actions; a translator
    for an environment with tools (and no ``type`` in its action) reads them as such."""
    from corral.protocol.openenv import ServerTranslator, ToolStep

    def translator(tool_actions: bool) -> ServerTranslator:
        return ServerTranslator(
            "s1",
            reset_options=None,
            action_fields=frozenset({"text"}),
            max_frame_bytes=1 << 20,
            tool_actions=tool_actions,
        )

    frame = (
        '{"type": "step", "data": {"type": "call_tool", "tool_name": "add", "arguments": {"a": 1}}}'
    )
    step = translator(True).read(frame)
    assert isinstance(step, ToolStep) and step.tool_name == "add"
    assert step.rpc["params"] == {"name": "add", "arguments": {"a": 1}}
    listed = translator(True).read('{"type": "step", "data": {"type": "list_tools"}}')
    assert isinstance(listed, ToolStep) and listed.rpc["method"] == "tools/list"
    assert not isinstance(translator(False).read(frame), ToolStep)
    assert not isinstance(
        translator(True).read('{"type": "step", "data": {"text": "x"}}'), ToolStep
    )


def test_tool_step_observations_have_openenvs_shapes():
    from corral.protocol.openenv import tool_step, tool_step_observation

    listing = tool_step({"type": "list_tools"})
    assert listing is not None
    tools = {"tools": [{"name": "add", "description": "Adds.", "inputSchema": {"type": "object"}}]}
    observed = tool_step_observation(listing, {"jsonrpc": "2.0", "id": 0, "result": tools})
    assert observed["tools"] == [
        {"name": "add", "description": "Adds.", "input_schema": {"type": "object"}}
    ]
    call = tool_step({"type": "call_tool", "tool_name": "add", "arguments": {}})
    assert call is not None
    ok = tool_step_observation(call, {"result": {"data": 3, "isError": False}})
    assert ok["tool_name"] == "add" and ok["result"]["data"] == 3 and ok["error"] is None
    unknown = {"error": {"code": -32602, "message": "Unknown tool: 'add'"}}
    assert tool_step_observation(call, unknown)["error"]["error_type"] == "tool_not_found"
    bad = {"error": {"code": -32602, "message": "invalid arguments for tool 'add'"}}
    assert tool_step_observation(call, bad)["error"]["error_type"] == "invalid_args"
    raised = {"result": {"content": [{"type": "text", "text": "boom"}], "isError": True}}
    assert tool_step_observation(call, raised)["error"] == {
        "error_type": "execution_error",
        "message": "boom",
    }
