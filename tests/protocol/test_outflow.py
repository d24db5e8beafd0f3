"""The outflow policy: back-pressure marks, the overflow close, clean close codes."""

from __future__ import annotations

from corral.protocol.outflow import SHUTDOWN, CloseCode, Closing, Outflow, clean_close


def test_marks_follow_the_limit():
    default = Outflow(64 * 1024 * 1024)
    assert (default.high, default.low) == (1024 * 1024, 256 * 1024)
    small = Outflow(512 * 1024)
    assert (small.high, small.low) == (256 * 1024, 64 * 1024)
    assert not small.overflowed(512 * 1024) and small.overflowed(512 * 1024 + 1)
    closing = small.overflow()
    assert closing.code == CloseCode.POLICY_VIOLATION and closing.counted == "SLOW_CONSUMER"
    assert "524288" in closing.reason


def test_only_a_clients_normal_close_frees_its_sessions():
    assert clean_close(1000) and clean_close(1001)
    for code in (None, 1005, 1006, 1008, 1011, 1012, 4000):
        assert not clean_close(code), code
    assert SHUTDOWN.code == CloseCode.SERVICE_RESTART and SHUTDOWN.counted is None


def test_a_close_reason_fits_its_frame_on_a_character_boundary():
    reason = Closing(1008, "é" * 100).reason_bytes()
    assert len(reason) <= 123 and reason.decode() == "é" * 61
    assert Closing(1000, "short").reason_bytes() == b"short"
