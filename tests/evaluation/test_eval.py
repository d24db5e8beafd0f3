"""corral eval: through EnvPool (the command on real local servers, the API on in-process
ones), recorded, resumed, summarized."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.support.cli import REPO, corral, corral_here, foreground_sigint
from tests.support.flaky import FragileEnv
from tests.support.llm_standin import standin_app
from tests.support.peers import AppThread
from tests.support.servers import running

from corral.envs.wordle import WordleEnv
from corral.episodes import read
from corral.evaluation import EvalError, evaluate
from corral.evaluation.report import final_attempts, parse_episode_id
from corral.testing import InProcessServer

WORDLE = "corral.envs.wordle:WordleEnv"
FRAGILE = "tests.support.flaky:FragileEnv"


@pytest.fixture
async def fragile() -> AsyncIterator[InProcessServer]:
    """A FragileEnv server for tests that avoid its once-breaking seeds (which it
    remembers process-wide)."""
    async with InProcessServer(FragileEnv, max_sessions=64) as srv:
        yield srv


@pytest.fixture
async def wordle() -> AsyncIterator[InProcessServer]:
    async with InProcessServer(WordleEnv, max_sessions=64) as srv:
        yield srv


def test_wordle_scripted_on_the_test_split(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = corral(
        "eval",
        WORDLE,
        "--policy",
        "scripted",
        "--split",
        "test",
        "--episodes",
        "24",
        "--concurrency",
        "6",
        "--out",
        str(out),
        "--parquet",
        "--dataset",
    )
    assert done.returncode == 0, done.stderr
    assert "success rate" in done.stdout and "100.0%" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 24 and summary["success_rate"] == 1.0
    assert summary["outcomes"] == {"terminated": 24} and summary["errors"] == {}
    assert set(summary["components"]) == {"solve", "new_greens", "new_letters"}
    assert summary["steps_per_s"] > 0 and summary["env"] == "wordle"
    episodes = read(out / "episodes.jsonl")
    assert len(episodes) == 24 and all(e.complete for e in episodes)
    words = {e.task.index: e.records[-1].observation["secret"] for e in episodes}
    env = WordleEnv()
    assert words == {i: env.task("test", i).word for i in range(24)}
    assert {e.seed for e in episodes} == set(range(24))
    assert episodes[0].header.source == "eval" and episodes[0].header.env.fingerprint
    settings = json.loads((out / "run.json").read_text())
    assert settings["policy"] == "scripted" and settings["split"] == "test"

    import datasets
    import pyarrow.parquet as pq

    steps = sum(len(e.records) for e in episodes)
    assert pq.read_table(out / "episodes.parquet").num_rows == steps
    loaded = datasets.load_from_disk(str(out / "dataset"))
    assert len(loaded) == steps and set(loaded.unique("outcome")) == {"terminated"}


def test_failed_episodes_are_retried_and_counted(tmp_path: Path) -> None:
    out = tmp_path / "run"
    import asyncio

    summary = asyncio.run(
        evaluate(FRAGILE, out=out, policy="random", episodes=14, concurrency=4, retries=2)
    )
    # Seeds 3 and 10 always break (3 attempts each); seeds 5 and 12 break once.
    assert summary.episodes == 14 and summary.outcomes == {"terminated": 12, "failed": 2}
    assert summary.errors == {"ENV_ERROR": 2 * 3 + 2}
    assert summary.attempts == 12 + 2 + 2 * 3 and summary.retried == 4
    assert summary.success_rate == pytest.approx(12 / 14)
    runs = final_attempts(read(out / "episodes.jsonl"))
    assert [a.summary.outcome for a in runs[3]] == ["failed"] * 3
    assert [a.summary.outcome for a in runs[5]] == ["failed", "terminated"]
    assert runs[5][0].summary.error.code == "ENV_ERROR"


def test_a_killed_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "eval",
        FRAGILE,
        "--episodes",
        "30",
        "--concurrency",
        "2",
        "--out",
        str(out),
        "--retries",
        "0",
        "--policy",
        "random",
    ]
    slow = {**os.environ, "FRAGILE_DELAY": "0.05"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", *args],
        cwd=REPO,
        env=slow,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    path = out / "episodes.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # bounded: wait for some finished episodes
        if path.exists() and path.read_bytes().count(b'"kind":"end"') >= 6:
            break
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the eval and its servers, mid-run
    proc.wait(30)
    before = {e.id: e for e in read(path, strict=False)}
    finished_before = {parse_episode_id(i)[0] for i, e in before.items() if e.complete}
    assert 6 <= len(finished_before) < 30

    again = corral(*args, env={"FRAGILE_DELAY": "0"})
    assert again.returncode == 0, again.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 30 and summary["planned"] == 30
    runs = final_attempts(read(path))
    assert sorted(runs) == list(range(30))
    for k in finished_before:  # kept, not played again
        assert [a.id for a in runs[k] if a.complete] == [f"ep{k:06d}-a0"]
    # Without retries, seeds 7k+3 (always) and 7k+5 (first time) fail; the rest end.
    failing = [k for k in range(30) if k % 7 in (3, 5)]
    assert summary["outcomes"] == {"terminated": 30 - len(failing), "failed": len(failing)}
    assert sorted(k for k, a in runs.items() if a[-1].summary.outcome == "failed") == failing


def test_an_llm_policy_against_a_stand_in_endpoint(tmp_path: Path) -> None:
    app, seen = standin_app()
    with AppThread(app) as llm_url, running(WordleEnv, max_sessions=8) as srv:
        out = tmp_path / "run"
        done = corral_here(
            "eval",
            srv.url,
            "--policy",
            "llm",
            "--llm-url",
            f"{llm_url}/v1",
            "--model",
            "standin",
            "--split",
            "test",
            "--episodes",
            "6",
            "--concurrency",
            "3",
            "--out",
            str(out),
            "--env",
            WORDLE,
        )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "llm:standin" and summary["episodes"] == 6
    assert summary["success_rate"] == 1.0
    assert summary["errors"] == {"INVALID_ACTION": 6}  # each conversation's first answer
    assert all(body["model"] == "standin" for body in seen)
    assert all(body["tool_choice"]["function"]["name"] == "act" for body in seen)
    told = [
        b for b in seen if any("That action failed" in str(m.get("content")) for m in b["messages"])
    ]
    assert told, "the model was never told about its invalid action"
    episode = read(out / "episodes.jsonl")[0]
    assert episode.records[1].error.code == "INVALID_ACTION"
    assert episode.records[1].action == {"guess": "toolong"}


def test_a_child_to_interrupt_gets_ctrl_c_even_when_the_suite_ignores_it() -> None:
    # The suite run as a shell's background job ignores SIGINT, and so did every child it
    # started: the Ctrl-C test below then saw its signal ignored (30 of 30 episodes played,
    # exit 0). Here the suite's side is played by a parent that ignores SIGINT.
    child = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    parent = (
        "import signal, subprocess, sys\n"
        "from tests.support.cli import foreground_sigint\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "for preexec in (None, foreground_sigint):\n"
        f"    print(subprocess.run([sys.executable, '-c', {child!r}], preexec_fn=preexec,\n"
        "        capture_output=True, text=True, check=True).stdout.strip())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", parent], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_ctrl_c_says_what_was_kept_and_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["eval", FRAGILE, "--episodes", "30", "--concurrency", "2", "--retries", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", *args, "--out", str(out)],
        cwd=REPO,
        # 0.2 s a step: the 26 or so episodes left after the first 4 take several seconds
        # (at 0.05 s a loaded machine could leave the poll below asleep until the run ended)
        env={**os.environ, "FRAGILE_DELAY": "0.2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=foreground_sigint,  # as from a terminal, even if the suite ignores SIGINT
    )
    path = out / "episodes.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # bounded: wait for some finished episodes
        if path.exists() and path.read_bytes().count(b'"kind":"end"') >= 4:
            break
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    stdout, stderr = proc.communicate(timeout=120)
    ended = path.read_bytes().count(b'"kind":"end"')
    assert proc.returncode == 130, f"{ended} episodes ended; stdout: {stdout}; stderr: {stderr}"
    kept = {e.id for e in read(path, strict=False) if e.complete}
    said = f"interrupted: {len(kept)} of 30 episodes are finished and kept in {path}"
    assert said in stderr
    resume = stderr.split("resume with: ", 1)[1].strip()
    assert resume.startswith(f"corral eval {FRAGILE} --episodes 30") and str(out) in resume

    again = corral(*resume.split()[1:])  # the printed command, as the user runs it
    assert again.returncode == 0, again.stderr
    assert f"resuming the run in {out}" in again.stderr
    runs = final_attempts(read(path))
    assert sorted(runs) == list(range(30))
    for name in kept:  # kept, not played again
        k, _ = parse_episode_id(name) or (-1, -1)
        assert [a.id for a in runs[k] if a.complete] == [name]


async def test_resuming_a_finished_run_starts_no_server(tmp_path: Path) -> None:
    from rich.console import Console

    out = tmp_path / "run"
    with running(FragileEnv, max_sessions=8) as srv:  # seeds 6..9 break nothing
        first = await evaluate(srv.url, out=out, episodes=4, seed=6, concurrency=2)
        url = srv.url
    # The server is gone: a resume that needed one would fail to connect.
    console = Console(record=True, width=200)
    again = await evaluate(url, out=out, seed=6, console=console)
    said = console.export_text()
    assert "nothing left to play: 4 of 4 episodes are finished" in said
    assert again.model_dump(exclude={"duration_s", "steps", "steps_per_s", "episodes_per_s"}) == (
        first.model_dump(exclude={"duration_s", "steps", "steps_per_s", "episodes_per_s"})
    )
    with pytest.raises(EvalError, match="seed: 6 before, 7 now"):  # still checked first
        await evaluate(url, out=out, seed=7, console=console)


async def test_policies_from_files_and_modules(tmp_path: Path, fragile: InProcessServer) -> None:
    agents = tmp_path / "agents.py"
    agents.write_text(
        "class Counting:\n"
        "    def __init__(self, seed=None):\n"
        "        self.n = seed or 0\n"
        "    def act(self, observation):\n"
        "        self.n += 1\n"
        "        return {'n': self.n}\n"
        "async def broken(observation):\n"
        "    raise ValueError('no idea')\n"
    )
    out = tmp_path / "counting"
    await evaluate(
        fragile.url,
        dialer=fragile.dialer,
        out=out,
        policy=f"{agents}:Counting",
        episodes=3,
        concurrency=3,
    )
    first = read(out / "episodes.jsonl")[0]
    assert [r.action for r in first.steps] == [{"n": 1}, {"n": 2}, {"n": 3}]

    out = tmp_path / "broken"
    summary = await evaluate(
        fragile.url,
        dialer=fragile.dialer,
        out=out,
        policy=f"{agents}:broken",
        episodes=2,
        retries=1,
    )
    assert summary.outcomes == {"failed": 2} and summary.errors == {"POLICY_ERROR": 4}
    error = read(out / "episodes.jsonl")[0].end.error
    assert error.code == "POLICY_ERROR" and "ValueError: no idea" in error.message

    with pytest.raises(EvalError, match="no scripted policy"):
        await evaluate(
            fragile.url,
            dialer=fragile.dialer,
            out=tmp_path / "y",
            policy="scripted",
            env=FragileEnv,
        )
    # A policy that cannot be loaded fails before any server is started.
    bad = corral_here("eval", FRAGILE, "--policy", "nowhere:nothing", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "cannot load policy" in bad.stderr
    assert not (tmp_path / "x").exists()


async def test_resuming_with_other_settings_is_refused(
    tmp_path: Path, fragile: InProcessServer
) -> None:
    out = tmp_path / "run"  # seeds 6..9: none of FragileEnv's breaking ones
    await evaluate(fragile.url, dialer=fragile.dialer, out=out, episodes=2, seed=6)
    with pytest.raises(EvalError, match="seed: 6 before, 7 now"):
        await evaluate(fragile.url, dialer=fragile.dialer, out=out, episodes=2, seed=7)
    with pytest.raises(EvalError, match="already holds a run"):
        await evaluate(
            fragile.url, dialer=fragile.dialer, out=out, episodes=2, seed=6, resume=False
        )
    more = await evaluate(
        fragile.url, dialer=fragile.dialer, out=out, episodes=4, seed=6
    )  # extends the run
    assert more.episodes == 4 and more.steps == 2 * 3


async def test_bad_splits_and_options_are_clear(
    tmp_path: Path, wordle: InProcessServer, fragile: InProcessServer
) -> None:
    with pytest.raises(EvalError, match="unknown split 'dev'"):
        await evaluate(wordle.url, dialer=wordle.dialer, out=tmp_path / "a", split="dev")
    with pytest.raises(EvalError, match="publishes no tasks"):
        await evaluate(fragile.url, dialer=fragile.dialer, out=tmp_path / "b", split="test")
    with pytest.raises(EvalError, match="refused the reset options"):
        await evaluate(
            wordle.url, dialer=wordle.dialer, out=tmp_path / "c", episodes=1, options={"colour": 1}
        )


def test_the_bandit_of_the_grpo_example_through_an_llm_policy(tmp_path: Path) -> None:
    """The loop of examples/bandit/train_grpo.py, played by an OpenAI-compatible endpoint
    through ``corral eval --policy llm`` (docs/integrations.md: vLLM plugs in here)."""
    from examples.bandit.bandit import BanditEnv, LeverAction
    from tests.support.llm_standin import bandit_player

    app, seen = standin_app(LeverAction, bandit_player)
    with AppThread(app) as llm_url, running(BanditEnv, max_sessions=4) as srv:
        out = tmp_path / "run"
        done = corral_here(
            "eval",
            srv.url,
            "--policy",
            "llm",
            "--llm-url",
            f"{llm_url}/v1",
            "--model",
            "standin",
            "--episodes",
            "4",
            "--concurrency",
            "2",
            "--out",
            str(out),
            "--env",
            "examples.bandit.bandit:BanditEnv",
        )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["errors"] == {}
    # Levers 5 and 6 pay nothing, 7 pays: each episode's three pulls return 1.
    assert summary["mean_return"] == 1.0
    episodes = read(out / "episodes.jsonl")
    assert [r.action for r in episodes[0].records[1:]] == [{"lever": 5}, {"lever": 6}, {"lever": 7}]
    # The model read each observation as JSON: the pull's payout and the pulls left.
    last = seen[-1]["messages"]
    assert last[1]["content"] == '{"payout":0.0,"pulls_left":3}'
    assert last[-1]["role"] == "tool" and last[-1]["content"].startswith('{"payout":0.0,')
