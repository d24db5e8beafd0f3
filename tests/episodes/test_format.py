"""The line models of the episode format: validation, versioning, JSON form, schema."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from corral.contract import Action, Observation
from corral.episodes import (
    FORMAT,
    LINE,
    EnvInfo,
    EpisodeEnd,
    ErrorInfo,
    Header,
    StepRecord,
    TaskRef,
    dump_line,
    line_schema,
)
from corral.errors import InvalidAction


class Blob(Action):
    data: bytes
    label: str = ""


class Seen(Observation):
    data: bytes = b""


def test_header_defaults_name_the_format_and_version() -> None:
    header = Header(env=EnvInfo(name="wordle", contract_version="1.0.0", fingerprint="sha256:x"))
    assert header.format == FORMAT == "corral-episodes/1"
    assert header.corral_version and header.created.tzinfo is not None
    back = LINE.validate_json(dump_line(header))
    assert back == header


def test_a_newer_format_is_refused_with_the_fix() -> None:
    raw = orjson.dumps({"kind": "header", "format": "corral-episodes/2"})
    with pytest.raises(ValidationError, match="newer corral"):
        LINE.validate_json(raw)
    with pytest.raises(ValidationError, match="not an episode file"):
        LINE.validate_json(orjson.dumps({"kind": "header", "format": "something/1"}))


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValidationError, match="kind"):
        LINE.validate_json(b'{"kind": "chapter"}')


def test_a_step_line_needs_an_outcome_and_a_step_its_action() -> None:
    with pytest.raises(ValidationError, match="observation or an error"):
        StepRecord(episode="e", index=0, op="reset")
    with pytest.raises(ValidationError, match="needs its action"):
        StepRecord(episode="e", index=1, op="step", observation={})
    failed = StepRecord(
        episode="e", index=1, op="step", action={"x": 1}, error=ErrorInfo(code="ENV_ERROR")
    )
    assert failed.observation is None and not failed.done


def test_lines_are_compact_one_line_json_without_nulls() -> None:
    record = StepRecord(
        episode="e1",
        session="s",
        index=0,
        op="reset",
        seed=3,
        task=TaskRef(split="test", index=2),
        observation={"text": "a\nb", "done": False},
        t=1.5,
    )
    data = dump_line(record)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    obj = orjson.loads(data)
    assert "action" not in obj and "error" not in obj and "latency_s" not in obj
    assert obj["task"] == {"split": "test", "index": 2}
    assert LINE.validate_json(data) == record


def test_unknown_fields_survive_a_round_trip() -> None:
    raw = b'{"kind":"end","episode":"e","outcome":"terminated","note":"from the web UI"}'
    line = LINE.validate_json(raw)
    assert isinstance(line, EpisodeEnd)
    assert orjson.loads(dump_line(line))["note"] == "from the web UI"


def test_the_schema_describes_every_kind() -> None:
    schema = line_schema()
    text = orjson.dumps(schema).decode()
    for kind in ("header", "step", "end"):
        assert f'"{kind}"' in text
    assert schema["discriminator"]["propertyName"] == "kind"


def test_error_info_from_corral_errors_and_other_exceptions() -> None:
    err = InvalidAction("bad guess", details={"errors": [{"loc": ("guess",), "msg": "short"}]})
    info = ErrorInfo.of(err)
    assert info.code == "INVALID_ACTION" and info.message == "bad guess"
    assert info.details == {"errors": [{"loc": ["guess"], "msg": "short"}]}
    other = ErrorInfo.of(KeyError("k"))
    assert other.code == "INTERNAL_ERROR" and "KeyError" in other.message


def test_typed_views_decode_bytes_from_their_json_form() -> None:
    action = Blob(data=b"\x00\xff raw", label="x")
    obs = Seen(data=b"\x01\x02", reward=0.5)
    record = StepRecord(
        episode="e",
        index=1,
        op="step",
        action=action.model_dump(mode="json"),
        observation=obs.model_dump(mode="json"),
    )
    back = LINE.validate_json(dump_line(record))
    assert isinstance(back, StepRecord)
    assert back.action_as(Blob) == action
    assert back.observation_as(Seen) == obs
    with pytest.raises(ValueError, match="no observation"):
        StepRecord(
            episode="e", index=1, op="step", action={}, error=ErrorInfo(code="X")
        ).observation_as(Seen)
    with pytest.raises(ValidationError):
        back.action_as(Seen)  # the action does not fit another model


def test_task_refs_are_checked() -> None:
    with pytest.raises(ValidationError):
        TaskRef(split="", index=0)
    with pytest.raises(ValidationError):
        TaskRef(split="test", index=-1)
    with pytest.raises(ValidationError):
        TaskRef(split="../etc", index=0)
    assert str(TaskRef(split="train", index=4)) == "train[4]"
