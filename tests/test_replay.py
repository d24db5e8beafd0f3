"""Replay: recorded episodes re-run against real servers, divergences found and reported."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli import corral, corral_here
from tests.support.flaky import FlakyEnv, Move, SlowEnv
from tests.support.recording import play
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.envs.wordle import SimplePolicy, WordleAction, WordleEnv
from corral.episodes import (
    EnvInfo,
    EpisodeRecorder,
    EpisodeWriter,
    ErrorInfo,
    Header,
    StepRecord,
    read,
)
from corral.replay import replay


def header_of(client: AsyncEnvClient, url: str) -> Header:
    return Header(env=EnvInfo.model_validate(client.server_info["env"]), source="test", url=url)


async def record_wordle(path: Path, url: str) -> None:
    async with AsyncEnvClient(url, env=WordleEnv) as client:
        with EpisodeWriter(path, header_of(client, url)) as out:
            recorder = EpisodeRecorder(out)
            for seed in range(3):
                await play(client, recorder, seed, policy=SimplePolicy(seed=seed).act)
            await play(
                client,
                recorder,
                None,
                options={"split": "test", "index": 4},
                actions=[{"guess": "toolong"}, WordleAction(guess="crane")],
            )
            recorder.close()


async def record_flaky(path: Path, url: str, episodes: int = 2) -> None:
    async with AsyncEnvClient(url, env=FlakyEnv) as client:
        with EpisodeWriter(path, header_of(client, url)) as out:
            recorder = EpisodeRecorder(out)
            for seed in range(episodes):
                await play(client, recorder, seed, actions=[Move(n=i) for i in range(5)])


async def test_a_deterministic_environment_replays_identically(tmp_path: Path) -> None:
    path = tmp_path / "wordle.jsonl"
    with running(WordleEnv, max_sessions=8) as srv:
        await record_wordle(path, srv.url)
        report = await replay(path, srv.url, concurrency=2, out=tmp_path / "again.jsonl")
    assert report.ok and report.counts() == {
        "identical": 4,
        "diverged": 0,
        "skipped": 0,
        "failed": 0,
    }
    recorded = read(path)
    assert [r.episode.id for r in report.results] == [e.id for e in recorded]
    assert all(r.compared == r.recorded for r in report.results)
    assert not report.contract_changed and report.served_fingerprint
    again = read(tmp_path / "again.jsonl")
    assert [e.id for e in again] == [e.id for e in recorded]
    assert again[0].header.source == "replay"
    assert [e.observations for e in again] == [e.observations for e in recorded]


async def test_a_non_deterministic_environment_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "flaky.jsonl"
    with running(FlakyEnv, max_sessions=4) as srv:
        await record_flaky(path, srv.url)
        report = await replay(path, srv.url)
        assert not report.ok and len(report.diverged) == 2
        first = report.diverged[0].divergence
        assert first is not None and (first.index, first.op) == (1, "step")
        assert first.path == "observation.metadata.calls"
        assert "step 1 differs at observation.metadata.calls" in str(first)

        report = await replay(path, srv.url, ignore=["metadata.calls"])
        found = report.diverged[0].divergence
        assert found is not None and (found.index, found.path) == (2, "observation.noise")
        assert report.diverged[0].compared == 2

        report = await replay(path, srv.url, ignore=["metadata", "noise"], episodes=[found.episode])
        assert report.ok and len(report.results) == 1


async def test_what_cannot_be_replayed_is_said(tmp_path: Path) -> None:
    header = Header(env=EnvInfo(name="flaky", fingerprint="sha256:old"))
    reset = StepRecord(episode="a", index=0, op="reset", seed=1, observation={"n": 0})
    lost = StepRecord(
        episode="a", index=1, op="step", action={"n": 1}, error=ErrorInfo(code="SESSION_LOST")
    )
    middle = StepRecord(episode="b", index=3, op="step", action={"n": 1}, observation={"n": 0})
    path = tmp_path / "odd.jsonl"
    with EpisodeWriter(path, header) as out:
        for line in (reset, lost, middle):
            out.write(line)
    with running(FlakyEnv) as srv:
        report = await replay(path, srv.url)
    a, b = report.results
    assert a.status == "diverged"  # the recorded reset observation was made up
    assert b.status == "skipped" and "mid-episode" in b.note
    assert report.contract_changed and report.recorded_fingerprint == "sha256:old"


async def test_stops_at_a_recorded_session_loss_and_fails_on_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "flaky.jsonl"
    with running(FlakyEnv) as srv:
        await record_flaky(path, srv.url, episodes=1)
    (episode,) = read(path)
    lines = [episode.header, *episode.records[:2]]
    lines.append(
        episode.records[2].model_copy(
            update={"observation": None, "error": ErrorInfo(code="CONNECTION_LOST")}
        )
    )
    cut = tmp_path / "cut.jsonl"
    with EpisodeWriter(cut, lines[0]) as out:
        for line in lines[1:]:
            out.write(line)
    with running(FlakyEnv) as srv:
        report = await replay(cut, srv.url, ignore=["metadata"])
    (result,) = report.results
    assert result.status == "identical" and result.compared == 2
    assert "recorded CONNECTION_LOST" in result.note

    with running(SlowEnv, step_timeout_s=0.1) as srv:
        report = await replay(path, srv.url, ignore=["metadata"])
    (result,) = report.results
    assert result.status == "failed" and "STEP_TIMEOUT" in result.note and not report.ok


async def test_the_command(tmp_path: Path) -> None:
    path = tmp_path / "flaky.jsonl"
    with running(FlakyEnv, max_sessions=4) as srv:
        await record_flaky(path, srv.url)
        url = srv.url
        diverged = corral("replay", str(path), "--url", url)
        assert diverged.returncode == 1, diverged.stderr
        assert "diverged" in diverged.stdout and "metadata.calls" in diverged.stdout
        # The one run in a child process of its own; what the rest say, in this one.
        clean = corral_here(
            "replay", str(path), "--url", url, "--ignore", "metadata", "--ignore", "noise", "--json"
        )
        assert clean.returncode == 0, clean.stderr
        data = json.loads(clean.stdout)
        assert data["ok"] and data["counts"]["identical"] == 2
    local = corral_here("replay", str(path), "--env", "tests.support.flaky:FlakyEnv", "--json")
    assert local.returncode == 1, local.stderr
    assert json.loads(local.stdout)["counts"]["diverged"] == 2

    (tmp_path / "bad.jsonl").write_text("not json\n")
    bad = corral_here("replay", str(tmp_path / "bad.jsonl"), "--url", "http://127.0.0.1:9")
    assert bad.returncode == 2 and "line 1" in bad.stderr
    both = corral_here("replay", str(path))
    assert both.returncode == 2 and "exactly one of --url and --env" in both.stderr


@pytest.mark.parametrize("concurrency", [0, -1])
async def test_concurrency_is_checked(concurrency: int) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        await replay([], "http://127.0.0.1:9", concurrency=concurrency)


async def test_corral_validates_determinism_with_the_same_comparison() -> None:
    from corral.providers.local import LocalProcessProvider
    from corral.providers.validation import smoke_test

    async with LocalProcessProvider() as provider:
        findings = await smoke_test(
            provider, "tests.support.flaky:FlakyEnv", {"n": 1}, env=FlakyEnv, steps=3
        )
    (determinism,) = [f for f in findings if f.id == "determinism"]
    assert determinism.ok is False
    assert "episode with seed 0: step 1 differs at observation.metadata.calls" in determinism.detail
    assert "derive all randomness" in determinism.detail


def run_pytest(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    # The generated module needs no plugin: without loading this venv's many (hypothesis,
    # schemathesis, anyio, ...) a run takes ~0.4 s of CPU instead of ~3.6.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        text=True,
        cwd=path.parent,
        timeout=300,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})},
    )


async def test_an_episode_file_becomes_a_passing_regression_test(tmp_path: Path) -> None:
    path = tmp_path / "wordle.jsonl"
    with running(WordleEnv, max_sessions=4) as srv:
        await record_wordle(path, srv.url)
    test = tmp_path / "gen" / "test_wordle_regression.py"
    made = corral_here(
        "replay", str(path), "--pytest", str(test), "--env", "corral.envs.wordle:WordleEnv"
    )
    assert made.returncode == 0 and "4 test(s)" in made.stdout, made.stderr
    source = test.read_text()
    assert "4 recorded episode(s) of wordle" in source and "EPISODES = read([" in source
    passed = run_pytest(test)  # starts its own server from ENV
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "4 passed" in passed.stdout


async def test_a_regression_test_fails_with_the_divergence(tmp_path: Path) -> None:
    path = tmp_path / "flaky.jsonl"
    with running(FlakyEnv, max_sessions=4) as srv:
        await record_flaky(path, srv.url)
        test = tmp_path / "test_flaky_regression.py"
        made = corral_here("replay", str(path), "--pytest", str(test), "--ignore", "metadata")
        assert made.returncode == 0, made.stderr
        failed = run_pytest(test, {"CORRAL_URL": srv.url})
    assert failed.returncode == 1
    assert "2 failed" in failed.stdout
    assert "step 2 differs at observation.noise" in failed.stdout
    skipped = run_pytest(test)  # no server given at all
    assert skipped.returncode == 0 and "2 skipped" in skipped.stdout, skipped.stdout


def test_pytest_modules_need_episodes_and_a_proper_target() -> None:
    from corral.regression import pytest_module

    with pytest.raises(ValueError, match="no episodes"):
        pytest_module([])
    episode = read(
        [
            Header().model_dump_json(),
            StepRecord(episode="a", index=0, op="reset", observation={}).model_dump_json(),
        ]
    )
    with pytest.raises(ValueError, match="module:Class"):
        pytest_module(episode, env="os.system('x')")


async def test_an_empty_file_cannot_be_used(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    with running(FlakyEnv) as srv:
        done = corral_here("replay", str(empty), "--url", srv.url)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "empty" in done.stderr and "Traceback" not in done.stderr


class CountingEnv(FlakyEnv):
    """FlakyEnv (deterministic once ``metadata`` is ignored) that, at each reset, counts
    the step lines alive in this process: what the replay beside it holds."""

    peak = 0
    resets = 0

    def reset(self, seed: int | None = None, **options: Any) -> Any:
        CountingEnv.resets += 1
        if CountingEnv.resets % 10 == 0:  # a look every 10 episodes, garbage collected
            gc.collect()
            alive = sum(1 for o in gc.get_objects() if type(o) is StepRecord and o.observation)
            CountingEnv.peak = max(CountingEnv.peak, alive)
        return super().reset(seed, **options)


async def test_a_long_file_is_streamed(tmp_path: Path) -> None:
    """Issue 30.14: replay holds the episodes in flight, not the file (a 40 MB file of
    200k lines took 1.6 GB): of 300 episodes' lines, those of a few episodes are alive
    at any time (in flight, and finished ones waiting for an earlier one to be written);
    the report keeps an outline of each, without its observations."""
    one = tmp_path / "one.jsonl"
    with running(FlakyEnv) as srv:
        await record_flaky(one, srv.url, episodes=1)
    header, *lines = one.read_bytes().splitlines(keepends=True)
    path = tmp_path / "long.jsonl"
    episodes = 300
    with open(path, "wb") as out:
        out.write(header)
        for k in range(episodes):
            out.writelines(line.replace(b'"episode":"', b'"episode":"%d-' % k) for line in lines)
    CountingEnv.peak = CountingEnv.resets = 0
    # Everything alive before the replay is set aside (gc.freeze): each look then collects
    # and walks only what was made since, not the whole worker's heap (~0.4 s a look).
    gc.collect()
    gc.freeze()
    try:
        with running(CountingEnv, max_sessions=8) as srv:
            report = await replay(
                path,
                srv.url,
                ignore=["metadata", "noise"],
                concurrency=2,
                out=tmp_path / "out.jsonl",
            )
    finally:
        gc.unfreeze()
    assert report.counts()["identical"] == episodes, report.counts()
    assert all(len(r.episode.records) == 1 and not r.lines for r in report.results)
    total = episodes * len(lines)
    assert CountingEnv.peak < total / 10, (CountingEnv.peak, total)
    again = read(tmp_path / "out.jsonl")
    assert [e.id for e in again] == [r.episode.id for r in report.results]
