"""The error-code list: one exception per code, documented in one place."""

from __future__ import annotations

from pathlib import Path

from corral.errors import EXCEPTIONS, CorralError, ErrorCode, StepTimeout, error_from_wire

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
