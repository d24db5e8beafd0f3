"""The recovery decision and the episode log (corral.protocol.recovery), without sockets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from corral.protocol.recovery import (
    REMEDIES,
    Cause,
    EpisodeLog,
    Means,
    Remedy,
    allows,
    digest,
    remedy,
)


def test_every_cause_ends_in_a_remedy_always_allowed() -> None:
    for cause, remedies in REMEDIES.items():
        assert remedies[-1] is Remedy.TRUNCATE, cause
    assert set(REMEDIES) == set(Cause)


@pytest.mark.parametrize(
    ("episode", "snapshot", "source_answers", "replayable"),
    list(itertools.product([False, True], repeat=4)),
)
@pytest.mark.parametrize("cause", list(Cause))
def test_every_row_of_the_table(
    cause: Cause, episode: bool, snapshot: bool, source_answers: bool, replayable: bool
) -> None:
    means = Means(episode, snapshot, source_answers, replayable)
    chosen = remedy(cause, means)
    if not episode:
        assert chosen is Remedy.REOPEN
        return
    moving = cause in (Cause.GOING_AWAY, Cause.LEAVING)
    if moving and snapshot and source_answers:
        expected = Remedy.SNAPSHOT
    elif replayable:
        expected = Remedy.REPLAY
    elif moving and source_answers:
        expected = Remedy.STAY
    else:
        expected = Remedy.TRUNCATE
    assert chosen is expected
    assert allows(chosen, means)


def test_a_lost_session_is_never_snapshotted() -> None:
    means = Means(episode=True, snapshot=True, source_answers=True, replayable=False)
    assert remedy(Cause.LOST, means) is Remedy.TRUNCATE
    assert remedy(Cause.UNREACHABLE, means) is Remedy.TRUNCATE


def test_a_failed_remedy_falls_to_the_next() -> None:
    means = Means(episode=True, snapshot=True, source_answers=True, replayable=True)
    assert remedy(Cause.GOING_AWAY, means) is Remedy.SNAPSHOT
    refused = Means(episode=True, snapshot=False, source_answers=True, replayable=True)
    assert remedy(Cause.GOING_AWAY, refused) is Remedy.REPLAY
    diverged = Means(episode=True, snapshot=False, source_answers=True, replayable=False)
    assert remedy(Cause.GOING_AWAY, diverged) is Remedy.STAY


def test_the_log_replays_a_seeded_episode_and_checks_each_observation() -> None:
    log = EpisodeLog()
    assert not log.replayable and log.why_not == "no episode has started"
    log.reset(7, {"level": 2}, None, {"board": [0, 0], "done": False})
    assert log.replayable and (log.seed, log.options) == (7, {"level": 2})
    log.step({"move": 1}, {"board": [1, 0], "done": False})
    log.step({"move": 2}, {"board": [1, 2], "done": True, "reward": 1.0})
    assert log.steps == 2 and log.actions == [{"move": 1}, {"move": 2}]
    assert log.check_reset({"board": [0, 0], "done": False}) is None
    assert log.check_step(0, {"board": [1, 0], "done": False}) is None
    assert "step 2" in (log.check_step(1, {"board": [1, 2], "done": True, "reward": 0.0}) or "")
    assert log.check_reset({"board": [9, 9], "done": False}) is not None


def test_arrays_are_digested_by_their_bytes() -> None:
    a = np.arange(12, dtype=np.int8).reshape(3, 4)
    assert digest({"x": a}) == digest({"x": a.copy()})
    b = a.copy()
    b[2, 3] = 0
    assert digest({"x": a}) != digest({"x": b})


def test_an_unseeded_episode_is_not_replayable() -> None:
    log = EpisodeLog()
    log.reset(None, None, None, {})
    log.step({"m": 1}, {})
    assert not log.replayable and "without a seed" in (log.why_not or "")
    assert log.steps == 0 and log.digests == []
    assert log.reset_digest == 0  # no replay will check it: not computed


def test_bounds_end_replayability_until_the_next_reset() -> None:
    log = EpisodeLog(max_steps=3)
    log.reset(1, None, None, {})
    for i in range(4):
        log.step({"i": i}, {"i": i})
    assert not log.replayable and "longer than 3 steps" in (log.why_not or "")
    assert log.actions == []  # nothing held for an episode it cannot replay
    log.reset(2, None, None, {})
    assert log.replayable
    small = EpisodeLog(max_bytes=64)
    small.reset(1, None, None, {})
    small.step({"text": "x" * 100}, {})
    assert not small.replayable and "exceed 64 bytes" in (small.why_not or "")


def test_an_action_the_codec_cannot_carry_ends_replayability() -> None:
    log = EpisodeLog()
    log.reset(1, None, None, {})
    log.step({"x": object()}, {})
    assert not log.replayable and "could not be encoded" in (log.why_not or "")


def test_clear_says_why() -> None:
    log = EpisodeLog()
    log.reset(1, None, None, {})
    log.clear("the replay diverged at step 3")
    assert not log.replayable and log.why_not == "the replay diverged at step 3"
    assert not log.started and log.seed is None
