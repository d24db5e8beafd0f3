"""EpisodeRecorder: live outcomes in, lines out, every episode ended exactly once."""

from __future__ import annotations

import io

from hypothesis import given
from tests.strategies import CONTRACT_SETTINGS, models_and_instances

from corral.contract import Action, Observation
from corral.episodes import (
    EnvInfo,
    EpisodeEnd,
    EpisodeRecorder,
    EpisodeWriter,
    ErrorInfo,
    Header,
    StepRecord,
    TaskRef,
    dump_line,
    read,
)
from corral.errors import EnvError, InvalidAction, SessionLost

HEADER = Header(env=EnvInfo(name="toy"))


class Recorded:
    """A recorder writing into a list, with helpers to look at what it wrote."""

    def __init__(self, **kwargs: object) -> None:
        self.lines: list[object] = []
        self.recorder = EpisodeRecorder(self.lines.append, **kwargs)  # type: ignore[arg-type]

    def ends(self) -> list[EpisodeEnd]:
        return [line for line in self.lines if isinstance(line, EpisodeEnd)]

    def steps(self) -> list[StepRecord]:
        return [line for line in self.lines if isinstance(line, StepRecord)]


def test_an_episode_to_its_end() -> None:
    rec = Recorded()
    r = rec.recorder
    episode = r.reset(
        "s",
        seed=4,
        options={"split": "test", "index": 2, "hard": True},
        t=10.0,
        observation={"done": False},
        latency_s=0.5,
    )
    assert r.episode_of("s") == episode
    r.step(
        "s",
        action={"a": 1},
        t=11.0,
        latency_s=0.25,
        observation={"reward": 0.5, "reward_components": {"fmt": 0.5}},
    )
    r.step(
        "s",
        action={"a": 2},
        t=12.0,
        latency_s=0.5,
        observation={
            "reward": 2.0,
            "reward_components": {"fmt": 0.5, "win": 1.5},
            "done": True,
            "metadata": {"success": False},
        },
    )
    assert r.episode_of("s") is None
    (end,) = rec.ends()
    assert end.episode == episode and end.outcome == "terminated"
    assert end.task == TaskRef(split="test", index=2) and end.seed == 4
    assert end.length == 2 and end.total_reward == 2.5
    assert end.reward_components == {"fmt": 1.0, "win": 1.5}
    assert end.success is False  # the environment's word wins over the reward
    assert end.duration_s == 2.5
    reset, *steps = rec.steps()
    assert reset.options == {"split": "test", "index": 2, "hard": True}
    assert all(s.task == reset.task and s.seed == 4 and s.options is None for s in steps)
    assert [s.index for s in rec.steps()] == [0, 1, 2]


def test_truncation() -> None:
    rec = Recorded()
    rec.recorder.reset("s", observation={}, t=0)
    rec.recorder.step("s", action={}, observation={"done": True, "truncated": True, "reward": 1})
    (end,) = rec.ends()
    assert end.outcome == "truncated" and end.success is False
    assert rec.steps()[-1].truncated and not rec.steps()[-1].terminated


def test_a_new_reset_abandons_the_running_episode() -> None:
    rec = Recorded()
    first = rec.recorder.reset("s", seed=1, observation={}, t=0)
    rec.recorder.step("s", action={}, observation={"reward": 1.0})
    second = rec.recorder.reset("s", seed=2, observation={}, t=0)
    (end,) = rec.ends()
    assert end.episode == first and end.outcome == "abandoned" and end.success is None
    assert end.total_reward == 1.0 and first != second


def test_errors_that_keep_the_session_continue_the_episode() -> None:
    rec = Recorded()
    rec.recorder.reset("s", observation={}, t=0)
    rec.recorder.step("s", action={"guess": "x"}, error=InvalidAction("too short"))
    rec.recorder.step("s", action={"guess": "y"}, error=EnvError("boom"))
    rec.recorder.step("s", action={"guess": "z"}, observation={"done": True, "reward": 1.0})
    (end,) = rec.ends()
    assert end.outcome == "terminated" and end.length == 3 and end.error is None
    codes = [s.error.code if s.error else None for s in rec.steps()]
    assert codes == [None, "INVALID_ACTION", "ENV_ERROR", None]


def test_an_error_that_ends_the_session_fails_the_episode() -> None:
    rec = Recorded()
    rec.recorder.reset("s", observation={}, t=0)
    rec.recorder.step("s", action={}, error=SessionLost("reaped"))
    (end,) = rec.ends()
    assert end.outcome == "failed" and end.error is not None
    assert end.error.code == "SESSION_LOST" and end.error.message == "reaped"
    assert rec.recorder.episode_of("s") is None


def test_a_failed_reset_is_an_episode_that_failed() -> None:
    rec = Recorded()
    rec.recorder.reset("s", seed=1, error=ErrorInfo(code="FACTORY_ERROR", message="no"), t=0)
    (end,) = rec.ends()
    assert end.outcome == "failed" and end.length == 0


def test_steps_outside_an_episode_are_kept() -> None:
    rec = Recorded()
    rec.recorder.step("s", action={"a": 1}, error=ErrorInfo(code="RESET_REQUIRED"))
    (line,) = rec.steps()
    assert line.op == "step" and line.index == 0 and rec.recorder.episode_of("s") == line.episode
    rec.recorder.reset("s", observation={}, t=0)
    assert [e.outcome for e in rec.ends()] == ["abandoned"]


def test_after_the_end_a_step_is_its_own_episode_unless_the_env_auto_resets() -> None:
    plain = Recorded()
    plain.recorder.reset("s", observation={}, t=0)
    plain.recorder.step("s", action={}, observation={"done": True})
    plain.recorder.step("s", action={"a": 1}, error=ErrorInfo(code="EPISODE_ENDED"))
    stray = plain.steps()[-1]
    assert stray.op == "step" and stray.episode != plain.steps()[0].episode

    auto = Recorded(auto_reset=True)
    auto.recorder.reset("s", observation={}, t=0)
    auto.recorder.step("s", action={}, observation={"done": True})
    auto.recorder.step("s", action={"a": 1}, observation={"n": 0})
    fresh = auto.steps()[-1]
    assert fresh.op == "reset" and fresh.index == 0 and fresh.action == {"a": 1}
    assert auto.recorder.episode_of("s") == fresh.episode


def test_close_ends_every_open_episode() -> None:
    rec = Recorded()
    for session in ("a", "b"):
        rec.recorder.reset(session, observation={}, t=0)
    rec.recorder.close()
    assert sorted((e.session, e.outcome) for e in rec.ends()) == [
        ("a", "abandoned"),
        ("b", "abandoned"),
    ]
    rec.recorder.close()
    assert len(rec.ends()) == 2


def test_episode_ids_come_from_the_given_maker() -> None:
    ids = iter(["ep-0", "ep-1"])
    rec = Recorded(new_id=lambda: next(ids))
    assert rec.recorder.reset("s", observation={}, t=0) == "ep-0"
    assert rec.recorder.reset("s", observation={}, t=0, episode="mine") == "mine"
    assert rec.recorder.reset("s", observation={}, t=0) == "ep-1"


def test_bool_and_out_of_range_task_options_are_not_task_refs() -> None:
    rec = Recorded()
    rec.recorder.reset("s", options={"split": "test", "index": True}, observation={}, t=0)
    rec.recorder.reset("s", options={"split": "test", "index": -1}, observation={}, t=0)
    assert [s.task for s in rec.steps()] == [None, None]


@CONTRACT_SETTINGS
@given(models_and_instances(base=Observation), models_and_instances(base=Action))
def test_any_contract_round_trips_through_a_file(
    obs_pair: tuple[type[Observation], Observation], act_pair: tuple[type[Action], Action]
) -> None:
    obs_cls, obs = obs_pair
    act_cls, action = act_pair
    buffer = io.BytesIO()
    with EpisodeWriter(buffer, HEADER) as out:
        recorder = EpisodeRecorder(out)
        recorder.reset("s", seed=0, observation=obs, t=0)
        recorder.step("s", action=action, observation=obs, t=1)
        recorder.close()
    # An observation drawn with done=True ends the episode at the reset, and the step
    # is then an episode of its own: both lines are there either way.
    reset, step = [r for e in read(buffer.getvalue()) for r in e.records]
    assert reset.observation_as(obs_cls) == obs
    assert step.action_as(act_cls) == action
    assert step.observation_as(obs_cls) == obs


def test_the_writers_fast_path_writes_what_the_models_would() -> None:
    """Step lines go to a writer without a model; the bytes must be dump_line's."""

    def scenario(recorder: EpisodeRecorder) -> None:
        recorder.reset(
            "s",
            seed=3,
            options={"split": "test", "index": 1, "x": [1, 2]},
            t=1.5,
            observation={"text": "héllo", "reward": None},
            latency_s=0.25,
            state={"step_count": 0},
        )
        recorder.step(
            "s",
            action={"a": 1},
            observation={"reward": 1, "reward_components": {"w": 1}, "metadata": {"k": None}},
            t=2.0,
        )
        recorder.step("s", action={"a": 2}, error=InvalidAction("bad", details={"loc": ("a",)}))
        recorder.step("s", action={"a": 3}, observation={"reward": float("nan")})
        recorder.step("s", action={"a": 4}, observation={"done": True, "truncated": True})
        recorder.reset("t", observation={}, t=0)
        recorder.step("t", action={"a": 5}, error=SessionLost("gone"))

    buffer = io.BytesIO()
    with EpisodeWriter(buffer, HEADER) as out:
        scenario(EpisodeRecorder(out, new_id=iter(["e1", "e2"]).__next__))
    models = Recorded(new_id=iter(["e1", "e2"]).__next__)
    scenario(models.recorder)
    fast = buffer.getvalue().splitlines(keepends=True)[1:]  # the header aside
    assert fast == [dump_line(line) for line in models.lines]  # type: ignore[arg-type]
    assert len(fast) == 9  # 6 lines of s (5 requests, its end), 3 of t
