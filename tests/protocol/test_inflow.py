"""Incoming messages without a socket: reassembly, its bounds, the budget, the deadlines."""

from __future__ import annotations

import pytest

from corral.protocol.inflow import (
    BINARY,
    CONTINUATION,
    PROBE,
    TEXT,
    Assembled,
    Inflow,
    InflowLimits,
    PartialBudget,
    Reassembler,
    Refused,
)
from corral.protocol.outflow import CloseCode, Closing


def test_whole_and_fragmented_messages():
    r = Reassembler(100)
    assert r.feed(BINARY, True, b"whole") == Assembled(False, b"whole", False)
    assert r.feed(TEXT, False, b"he", now=5.0) is None
    assert r.pending and r.started == 5.0 and r.size == 2
    assert r.feed(CONTINUATION, False, b"ll") is None
    assert r.feed(CONTINUATION, True, b"o") == Assembled(True, b"hello", False)
    assert not r.pending and r.size == 0


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([(CONTINUATION, True, False)], CloseCode.PROTOCOL_ERROR),
        ([(BINARY, False, False), (BINARY, True, False)], CloseCode.PROTOCOL_ERROR),
        ([(BINARY, False, True), (CONTINUATION, True, True)], CloseCode.PROTOCOL_ERROR),
        ([(BINARY, True, True)], CloseCode.PROTOCOL_ERROR),  # no deflate agreed
    ],
)
def test_fragmentation_rules(frames, code):
    r = Reassembler(100, compression=False)
    with pytest.raises(Refused) as refused:
        for opcode, fin, compressed in frames:
            r.feed(opcode, fin, b"x", compressed)
    assert refused.value.closing.code == code
    assert not r.pending


def test_a_compressed_message_is_marked_on_its_first_frame_only():
    r = Reassembler(100, compression=True)
    assert r.feed(BINARY, False, b"ab", True) is None
    assert r.feed(CONTINUATION, True, b"cd") == Assembled(False, b"abcd", True)


def test_the_size_bound_counts_every_fragment():
    r = Reassembler(10)
    with pytest.raises(Refused) as whole:
        r.feed(BINARY, True, b"x" * 11)
    assert whole.value.closing == Closing(1009, "message longer than 10 bytes", "FRAME_TOO_LARGE")
    r.feed(BINARY, False, b"x" * 6)
    with pytest.raises(Refused) as parts:
        r.feed(CONTINUATION, False, b"x" * 5)
    assert parts.value.closing.code == CloseCode.MESSAGE_TOO_BIG
    assert not r.pending


def test_the_budget_is_shared_and_given_back():
    budget = PartialBudget(10)
    a, b = Reassembler(100, budget), Reassembler(100, budget)
    a.feed(BINARY, False, b"x" * 6)
    b.feed(BINARY, False, b"x" * 3)
    assert budget.held == 9
    with pytest.raises(Refused) as over:
        b.feed(CONTINUATION, False, b"x" * 2)
    assert over.value.closing.code == CloseCode.TRY_AGAIN_LATER
    assert over.value.closing.counted == "PARTIAL_BUDGET"
    assert budget.held == 6 and budget.refused == 1  # b's parts went back
    # A last fragment is not held: it completes the message, which frees the rest.
    assert a.feed(CONTINUATION, True, b"y" * 50) is not None
    assert budget.held == 0
    # Whole messages never count, whatever their size.
    assert a.feed(BINARY, True, b"z" * 90) is not None and budget.held == 0
    a.feed(TEXT, False, b"abc")
    a.abandon()
    assert budget.held == 0


LIMITS = InflowLimits(frame_timeout_s=10.0, message_timeout_s=30.0)


def test_a_quiet_connection_is_probed_then_closed():
    inflow = Inflow(LIMITS, Reassembler(100), now=0.0)
    assert inflow.check(4.9, frames=0) is None
    assert inflow.check(5.0, frames=0) is PROBE  # half the deadline without a frame
    assert inflow.check(9.9, frames=0) is None  # the probe is out
    closing = inflow.check(10.0, frames=0)
    assert isinstance(closing, Closing) and closing.code == CloseCode.POLICY_VIOLATION
    assert closing.counted == "FRAME_TIMEOUT"


def test_a_peer_answering_the_probe_is_never_disturbed():
    inflow = Inflow(LIMITS, Reassembler(100), now=0.0)
    frames = 0
    for t in range(0, 120):
        verdict = inflow.check(float(t), frames)
        if verdict is PROBE:
            frames += 1  # its pong arrives before the next check
        assert not isinstance(verdict, Closing), t


def test_frames_reset_the_clock_and_back_pressure_stops_it():
    inflow = Inflow(LIMITS, Reassembler(100), now=0.0)
    assert inflow.check(4.0, frames=3) is None
    assert inflow.check(8.0, frames=3) is None
    assert inflow.check(9.0, frames=3) is PROBE
    # The server stopped reading (its peer does not read replies): no deadline runs.
    for t in (20.0, 40.0, 60.0):
        assert inflow.check(t, frames=3, paused=True) is None
    assert inflow.check(61.0, frames=3) is None
    assert inflow.check(66.0, frames=3) is PROBE


def test_a_fragmented_message_must_be_whole_in_time():
    assembler = Reassembler(100)
    inflow = Inflow(LIMITS, assembler, now=0.0)
    assembler.feed(BINARY, False, b"x", now=1.0)
    frames = 1
    for t in range(2, 31):  # control frames keep arriving: the frame deadline is met
        frames += 1
        assert inflow.check(float(t), frames) is None, t
    closing = inflow.check(31.5, frames + 1)
    assert isinstance(closing, Closing) and closing.counted == "MESSAGE_TIMEOUT"
    assert not assembler.pending


def test_time_paused_by_back_pressure_is_not_counted_against_a_message():
    assembler = Reassembler(100)
    inflow = Inflow(LIMITS, assembler, now=0.0)
    assembler.feed(BINARY, False, b"x", now=0.0)
    assert inflow.check(20.0, 1) is None
    assert inflow.check(45.0, 1, paused=True) is None  # 25 s the server did not read
    assert inflow.check(54.0, 2) is None
    assert isinstance(inflow.check(56.0, 3), Closing)


def test_no_deadlines_no_sweep():
    assert InflowLimits(None, None).tick is None
    assert InflowLimits(None, 60.0).tick == 5.0
    assert InflowLimits(30.0, 60.0).tick == 3.75
    assert InflowLimits(0.1, None).tick == 0.05
    inflow = Inflow(InflowLimits(None, None), Reassembler(10), now=0.0)
    assert inflow.check(1e9, 0) is None
