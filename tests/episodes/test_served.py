"""The format on real data: Wordle episodes played on a real server, recorded, read back,
re-run from their seeds and actions, and compared."""

from __future__ import annotations

from pathlib import Path

from tests.support.recording import play
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.envs.wordle import SimplePolicy, WordleAction, WordleEnv, WordleObservation
from corral.episodes import (
    EnvInfo,
    EpisodeRecorder,
    EpisodeWriter,
    Header,
    collect,
    compare,
    read,
)


async def test_recorded_wordle_episodes_read_back_and_re_run(tmp_path: Path) -> None:
    path = tmp_path / "wordle.jsonl"
    with running(WordleEnv) as srv:
        async with AsyncEnvClient(srv.url, env=WordleEnv, codec="json") as client:
            header = Header(
                env=EnvInfo.model_validate(
                    {**client.server_info["env"], "schemas": WordleEnv.contract().schemas}
                ),
                source="test",
                url=srv.url,
            )
            with EpisodeWriter(path, header) as out:
                recorder = EpisodeRecorder(out)
                await play(client, recorder, 3, policy=SimplePolicy(seed=3).act, states=True)
                # A word that is not in the list: a turn used, no guess; then a failure.
                await play(
                    client, recorder, 4, actions=[{"guess": "qqqqq"}, WordleAction(guess="crane")]
                )
                raw = {"guess": "toolong"}
                await play(client, recorder, 5, actions=[raw, WordleAction(guess="slate")])
                recorder.close()

        episodes = read(path)
        assert [e.seed for e in episodes] == [3, 4, 5]
        won, rejected, failed = episodes
        assert won.header.env.fingerprint == WordleEnv.contract().fingerprint
        assert won.header.env.schemas == WordleEnv.contract().schemas
        assert won.complete and won.summary.outcome in ("terminated", "truncated")
        assert won.records[0].state is not None and won.records[0].state["seed"] == 3
        typed = [r.observation_as(WordleObservation) for r in won.records]
        assert typed[-1].done and typed[-1].secret
        assert won.summary.total_reward == sum(r.reward or 0 for r in won.records)
        assert rejected.summary.outcome == "abandoned" and rejected.summary.length == 2
        assert rejected.records[1].observation["accepted"] is False
        assert failed.records[1].error is not None
        assert failed.records[1].error.code == "INVALID_ACTION"
        assert all(r.latency_s is not None for r in won.records)

        # Re-running each episode's seed and actions gives the same episode...
        async with AsyncEnvClient(srv.url, env=WordleEnv) as client:
            again = []
            for episode in episodes:
                lines: list = []
                await play(
                    client, EpisodeRecorder(lines.append), episode.seed, actions=episode.actions
                )
                again.append(collect(lines, Header()))
            for recorded, (replayed,) in zip(episodes, again, strict=True):
                assert compare(recorded, replayed, ignore=["metadata"]) is None

            # ... and another seed does not.
            lines = []
            await play(client, EpisodeRecorder(lines.append), 99, actions=won.actions)
            (other,) = collect(lines, Header())
            found = compare(won, other)
            assert found is not None and found.index >= 1 and found.path.startswith("observation.")
