"""Recording at the client and the pool (``record="dir/"``), and tasks on corral/1,
through real servers on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.client import AsyncEnvClient, EnvPool
from corral.contract.tasks import TaskRef
from corral.envs.echo import EchoAction, EchoEnv
from corral.envs.wordle import SimplePolicy, WordleEnv
from corral.episodes import read
from corral.errors import InvalidAction, InvalidArgument
from corral.replay import replay
from corral.testing import InProcessServer


def only_file(directory: Path) -> Path:
    (path,) = directory.glob("*.jsonl")
    return path


async def test_a_recorded_client_session_reads_back_and_replays(tmp_path: Path) -> None:
    async with InProcessServer(WordleEnv) as srv:
        client: AsyncEnvClient = AsyncEnvClient(
            srv.url, dialer=srv.dialer, env=WordleEnv, record=tmp_path
        )
        async with client:
            policy = SimplePolicy(seed=1)
            result = await client.reset(seed=3, task=("test", 2))
            steps = 0
            while not result.done:
                result = await client.step(policy.act(result.observation))
                steps += 1
            await client.reset(seed=4, split="train", index=0)
            await client.step({"guess": "crane"})
            with pytest.raises(InvalidAction):
                await client.step({"guess": "toolong"})
        path = only_file(tmp_path)
        assert client.recording is not None and client.recording.path == path
        first, second = read(path)
        assert first.header.source == "client" and first.header.url == srv.url
        assert first.header.env.fingerprint == WordleEnv.contract().fingerprint
        assert first.header.env.schemas is not None
        assert first.header.env.schemas["action"] == WordleEnv.contract().schemas["action"]
        assert first.seed == 3 and first.task == TaskRef(split="test", index=2)
        assert first.complete and first.summary.length == steps
        assert first.records[-1].observation["secret"] == WordleEnv().task("test", 2).word
        assert second.task == TaskRef(split="train", index=0)
        assert second.summary.outcome == "abandoned"  # closed mid-episode
        assert second.records[-1].error is not None
        assert second.records[-1].error.code == "INVALID_ACTION"
        report = await replay(path, srv.url, dialer=srv.dialer, env=WordleEnv)
        assert report.ok, [(r.status, r.divergence) for r in report.results]


async def test_a_recorded_pool_writes_one_episode_per_session(tmp_path: Path) -> None:
    async with InProcessServer(EchoEnv) as srv:
        pool: EnvPool = EnvPool(
            4, srv.url, dialer=srv.dialer, env=EchoEnv, record=tmp_path, progress=False
        )
        async with pool:
            await pool.reset(seed=10)
            for k in range(3):
                await pool.step([EchoAction(message="x" * (k + i + 1)) for i in range(4)])
        episodes = read(only_file(tmp_path))
        assert sorted(e.seed for e in episodes) == [10, 11, 12, 13]
        assert {e.header.source for e in episodes} == {"pool"}
        for episode in episodes:
            assert [r.op for r in episode.records] == ["reset", "step", "step", "step"]
            assert episode.summary.outcome == "abandoned"
            assert all(r.latency_s is not None for r in episode.records)
        session = {e.records[0].session: e for e in episodes}["pool-2"]
        assert [r.action for r in session.records[1:]] == [
            {"message": "xxx"},
            {"message": "xxxx"},
            {"message": "xxxxx"},
        ]
        report = await replay(only_file(tmp_path), srv.url, env=EchoEnv, dialer=srv.dialer)
        assert report.ok, report.results


async def test_the_server_checks_a_task_against_the_tasks_face() -> None:
    async with InProcessServer(WordleEnv) as srv, InProcessServer(EchoEnv) as echo:
        async with AsyncEnvClient(srv.url, dialer=srv.dialer, env=WordleEnv) as client:
            count = WordleEnv().num_tasks("test")
            result = await client.reset(task=TaskRef(split="test", index=count - 1))
            assert not result.done
            with pytest.raises(InvalidArgument) as unknown:
                await client.reset(task=("nope", 0))
            assert unknown.value.details["reason"] == "unknown_split"
            with pytest.raises(InvalidArgument) as beyond:
                await client.reset(task=("test", count))
            assert beyond.value.details["reason"] == "index_out_of_range"
            with pytest.raises(InvalidArgument):  # two different tasks named
                await client.reset(task=("test", 0), split="test", index=1)
        async with AsyncEnvClient(echo.url, dialer=echo.dialer, env=EchoEnv) as plain:
            with pytest.raises(InvalidArgument) as none:
                await plain.reset(task=("train", 0))
            assert none.value.details["reason"] == "no_tasks"


async def test_the_pool_spreads_tasks_over_its_sessions(tmp_path: Path) -> None:
    words = WordleEnv()
    async with InProcessServer(WordleEnv) as srv:
        pool: EnvPool = EnvPool(
            3,
            srv.url,
            dialer=srv.dialer,
            env=WordleEnv,
            record=tmp_path,
            on_error="return",
            progress=False,
        )
        async with pool:
            await pool.reset(tasks="test")
            await pool.reset(tasks="test")  # the next three
            batch = await pool.reset(tasks=[("train", 5), TaskRef(split="test", index=1)])
            assert not batch.errors
            last = words.num_tasks("test") - 1
            bad = await pool.reset(tasks=[("test", 0), ("test", last + 1), ("zzz", 0)])
            assert sorted(bad.errors) == [1, 2]
            assert all(isinstance(e, InvalidArgument) for e in bad.errors.values())
        tasks = [e.task for e in read(only_file(tmp_path)) if e.records[0].error is None]
        assert [str(t) for t in tasks[:6]] == [
            "test[0]",
            "test[1]",
            "test[2]",
            "test[3]",
            "test[4]",
            "test[5]",
        ]
        assert [str(t) for t in tasks[6:9]] == ["train[5]", "test[1]", "train[5]"]
