"""The error-code list, the exception tree, and pydantic errors on the wire."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import orjson
import pytest
from pydantic import BaseModel, ValidationError, field_validator

from corral import errors
from corral.errors import (
    EXCEPTIONS,
    INPUT_LIMIT,
    CorralError,
    ErrorCode,
    StepTimeout,
    error_from_wire,
    validation_errors,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def test_every_code_has_its_own_exception_and_doc_row():
    text = DOC.read_text()
    for code in ErrorCode:
        cls = EXCEPTIONS[code.value]
        assert cls.code == code and issubclass(cls, CorralError)
        assert f"| `{code.value}` | `{cls.__name__}` |" in text


def test_round_trip_through_the_wire_form():
    err = StepTimeout("slow", details={"timeout_s": 1.0}, request_id=3)
    back = error_from_wire(err.to_wire(), 3)
    assert isinstance(back, StepTimeout) and back.details == {"timeout_s": 1.0}
    assert str(back) == "[STEP_TIMEOUT] slow" and back.request_id == 3
    unknown = error_from_wire({"code": "FUTURE_CODE", "message": "m"})
    assert type(unknown) is CorralError and unknown.code == "FUTURE_CODE"
    assert error_from_wire({}).code == ErrorCode.INTERNAL_ERROR


def drawn_tree(text: str) -> dict[str, str | None]:
    """``{class: parent}`` from a drawing of the exception tree (box-drawing lines)."""
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in text.splitlines():
        match = re.match(r"^\s*((?:[│ ]   )*)(?:[├└]── )?(\w+)\s", line + " ")
        if match is None or not (line.strip().startswith(("├", "└", "│")) or stack == []):
            continue
        name = match.group(2)
        if not hasattr(errors, name):
            continue
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        del stack[depth:]
        parents[name] = stack[-1] if stack else None
        stack.append(name)
    return parents


def test_the_drawn_tree_is_the_class_tree():
    docstring = errors.__doc__ or ""
    drawing = docstring[docstring.index("CorralError   ") :]
    parents = drawn_tree(drawing)
    actual: dict[str, str | None] = {"CorralError": None}
    pending = [CorralError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub.__module__ == errors.__name__:
                actual[sub.__name__] = cls.__name__
                pending.append(sub)
    assert parents == actual, "redraw the tree in corral/errors.py's docstring"
    tree = "\n".join(line.strip() for line in drawing.split("\n\n")[0].splitlines())
    doc = "\n".join(line.strip() for line in DOC.read_text().splitlines())
    assert tree in doc, "copy the tree to docs/errors.md"


class Shouty(BaseModel):
    text: str
    count: int = 0

    @field_validator("text")
    @classmethod
    def _quiet(cls, value: str) -> str:
        if value.isupper():
            raise ValueError("no shouting")
        return value


def errors_of(data: object) -> list[dict[str, object]]:
    with pytest.raises(ValidationError) as info:
        Shouty.model_validate(data)
    found = validation_errors(info.value)
    orjson.dumps(found)  # wire-safe
    return found


def test_validation_errors_echo_small_plain_inputs_and_bound_the_rest():
    # Moved here from tests/protocol/test_openenv.py with the function it tests.
    assert errors_of({"text": "HEY"}) == [
        {"type": "value_error", "loc": ["text"], "msg": "Value error, no shouting", "input": "HEY"}
    ]
    (big,) = errors_of({"text": "A" * 100_000})
    assert isinstance(big["input"], str) and len(big["input"]) <= INPUT_LIMIT
    (raw,) = errors_of({"text": "t", "count": b"\x00bytes"})
    assert raw["input"] == "b'\\x00bytes'"
    (nested,) = errors_of({"text": "t", "count": [[[[[[1]]]]]] * 50})
    assert isinstance(nested["input"], str) and len(nested["input"]) <= INPUT_LIMIT
    (huge_int,) = errors_of({"text": 2**70})
    assert huge_int["input"] == repr(2**70)
    (unknown,) = errors_of({"text": object()})
    assert isinstance(unknown["input"], str) and unknown["input"].startswith("<object")
    assert "ctx" not in errors_of({"text": "HEY"})[0]


INTERNAL_EXCEPTIONS = {
    "RpcError": "protocol/jsonrpc.py: becomes a JSON-RPC error reply, never leaves the server",
    "FrameError": "client/dialers/wsframes.py: the socket's own; surfaces as ConnectionLost",
    "SocketClosed": "client/dialers/base.py: a dialer's socket tells its connection it is "
    "closed; the connection's caller sees ConnectionLost or a reconnect",
    "McpFailure": "adapters/openenv_env.py: becomes a JSON-RPC error answer",
    "InflateTooLarge": "protocol/deflate.py: becomes a 1009 close of the connection",
    "Refused": "protocol/inflow.py: a frame breaking a rule; becomes the connection's close "
    "(a client's dialer: ConnectionLost)",
    "CheckFailed": "cli/validate/checks.py: a failed check, reported as a row",
    "CheckSkipped": "cli/validate/checks.py: a skipped check, reported as a row",
}
"""Exception classes that never reach a caller of corral, each with where it ends."""


def exception_classes() -> dict[str, str]:
    """``{class name: module}`` of every public class of a public module of
    ``src/corral`` whose bases look like exceptions (a name ending in Error, Exception,
    Unavailable, Unreachable)."""
    src = Path(errors.__file__).parent
    found = {}
    for path in src.rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        if any(part.startswith("_") and part != "__init__" for part in parts):
            continue  # a private module (the sandbox's worker): nothing in it is public
        module = ".".join(("corral", *parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
            if any(b.endswith(("Error", "Exception", "Unavailable", "Unreachable")) for b in bases):
                found[node.name] = module.removesuffix(".__init__")
    return found


def test_everything_corral_raises_is_a_corral_error():
    """Issue 32.6: ``except CorralError`` catches every exception corral raises to its
    callers (the local ones as ``UsageError`` / ``PlatformError``, Python-standard bases
    kept); the internal ones never leave corral."""
    found = exception_classes()
    assert {"ManifestError", "TargetError", "KubeError", "EpisodeFormatError"} <= set(found)
    outside = []
    for name, module in sorted(found.items()):
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError as exc:  # an optional extra that is not installed
            pytest.skip(f"{module} needs {exc.name}")
        public = name not in INTERNAL_EXCEPTIONS
        if public and issubclass(cls, BaseException) and not issubclass(cls, CorralError):
            outside.append(f"{module}.{name}")
    assert outside == []
    assert set(INTERNAL_EXCEPTIONS) <= set(found), "an internal class is gone: drop it"


def test_local_errors_keep_their_standard_bases_and_read_as_their_message():
    from corral.contract.lock import LockError
    from corral.errors import PlatformError, UsageError
    from corral.providers.hfspace import HubUnreachable
    from corral.providers.manifest import ManifestError
    from corral.server.target import TargetError

    error = LockError("the lock file is stale")
    assert isinstance(error, UsageError) and isinstance(error, ValueError)
    assert str(error) == "the lock file is stale" and error.code == "USAGE_ERROR"
    assert issubclass(TargetError, ImportError) and issubclass(ManifestError, ValueError)
    assert issubclass(HubUnreachable, PlatformError) and issubclass(HubUnreachable, ConnectionError)
    with pytest.raises(CorralError):
        raise error
