"""Episode files: writing, reading, damaged ends, segments, strictness."""

from __future__ import annotations

import gzip
import io
import logging
import threading
from pathlib import Path

import pytest

from corral.episodes import (
    EnvInfo,
    EpisodeEnd,
    EpisodeFormatError,
    EpisodeRecorder,
    EpisodeWriter,
    Header,
    StepRecord,
    dump_line,
    iter_episodes,
    read,
)

HEADER = Header(env=EnvInfo(name="toy", contract_version="1.0.0", fingerprint="sha256:0"))


def play(recorder: EpisodeRecorder, session: str, seed: int, steps: int) -> str:
    """A toy episode: reward 1 per step, terminated after ``steps`` steps."""
    episode = recorder.reset(session, seed=seed, observation={"n": 0, "done": False}, t=1.0)
    for i in range(1, steps + 1):
        recorder.step(
            session,
            action={"move": i},
            observation={"n": i, "reward": 1.0, "done": i == steps},
            t=1.0 + i,
            latency_s=0.01,
        )
    return episode


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "episodes.jsonl"
    with EpisodeWriter(path, HEADER) as out:
        recorder = EpisodeRecorder(out)
        a = play(recorder, "s1", seed=1, steps=3)
        b = play(recorder, "s2", seed=2, steps=1)
    episodes = read(path)
    assert [e.id for e in episodes] == [a, b]
    first = episodes[0]
    assert first.header == HEADER and first.complete and first.seed == 1
    assert first.actions == [{"move": 1}, {"move": 2}, {"move": 3}]
    assert first.rewards == [1.0, 1.0, 1.0]
    assert first.summary.total_reward == 3.0 and first.summary.length == 3
    assert first.summary.outcome == "terminated" and first.summary.success is True
    assert first.summary.duration_s == pytest.approx(3.01)
    assert [r.index for r in first.records] == [0, 1, 2, 3]


@pytest.mark.parametrize("form", ["bytes", "lines", "file", "text lines"])
def test_readers_take_bytes_files_and_lines(form: str) -> None:
    buffer = io.BytesIO()
    with EpisodeWriter(buffer, HEADER) as out:
        play(EpisodeRecorder(out), "s", seed=5, steps=2)
    data = buffer.getvalue()
    source: object = {
        "bytes": data,
        "lines": data.splitlines(),
        "file": io.BytesIO(data),
        "text lines": data.decode().replace("\n", "\r\n").splitlines(keepends=True),
    }[form]
    (episode,) = read(source)  # type: ignore[arg-type]
    assert episode.seed == 5 and episode.summary.length == 2


def test_gzip_files(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl.gz"
    with EpisodeWriter(path, HEADER) as out:
        play(EpisodeRecorder(out), "s", seed=5, steps=2)
    assert gzip.decompress(path.read_bytes()).startswith(b'{"kind":"header"')
    (episode,) = read(path)
    assert episode.summary.length == 2
    (again,) = read(path.read_bytes())
    assert again.id == episode.id


def test_a_killed_writer_loses_at_most_its_partial_line(tmp_path: Path, caplog) -> None:
    path = tmp_path / "episodes.jsonl"
    with EpisodeWriter(path, HEADER) as out:
        done = play(EpisodeRecorder(out), "s", seed=1, steps=2)
        recorder = EpisodeRecorder(out)
        recorder.reset("t", seed=9, observation={"n": 0}, t=5.0)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind":"step","episode":"zz","ind')  # killed mid-line
    with caplog.at_level(logging.WARNING, logger="corral.episodes"):
        episodes = read(path)
    assert "partial last line" in caplog.text
    assert [e.complete for e in episodes] == [True, False]
    assert episodes[0].id == done
    unfinished = episodes[1]
    assert unfinished.summary.outcome == "incomplete" and unfinished.seed == 9

    # Appending cuts the partial line off, then starts a new segment.
    with EpisodeWriter(path, HEADER, append=True) as out:
        play(EpisodeRecorder(out, new_id=lambda: done), "s", seed=3, steps=1)
    assert path.read_bytes().startswith(whole)
    episodes = read(path)
    assert [(e.id, e.seed) for e in episodes] == [(done, 1), (unfinished.id, 9), (done, 3)]
    assert episodes[2].header is not episodes[0].header


def test_append_without_header_continues_the_segment(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path, HEADER) as out:
        play(EpisodeRecorder(out), "s", seed=1, steps=1)
    with EpisodeWriter(path, append=True) as out:
        play(EpisodeRecorder(out), "s", seed=2, steps=1)
    assert path.read_bytes().count(b'"kind":"header"') == 1
    assert [e.seed for e in read(path)] == [1, 2]


def test_a_new_file_needs_a_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="header"):
        EpisodeWriter(tmp_path / "e.jsonl")
    with pytest.raises(ValueError, match="header"):
        EpisodeWriter(tmp_path / "missing.jsonl", append=True)
    assert not (tmp_path / "e.jsonl").exists() or (tmp_path / "e.jsonl").read_bytes() == b""


def test_a_closed_writer_refuses_lines(tmp_path: Path) -> None:
    out = EpisodeWriter(tmp_path / "e.jsonl", HEADER)
    out.close()
    out.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        out.write(HEADER)


def test_end_lines_reach_the_file_before_close(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    out = EpisodeWriter(path, HEADER)
    recorder = EpisodeRecorder(out)
    play(recorder, "s", seed=1, steps=2)
    (episode,) = read(path)  # another reader, while the writer is open
    assert episode.complete
    out.close()


def test_writers_shared_between_threads_keep_lines_whole(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path, HEADER) as out:

        def worker(k: int) -> None:
            recorder = EpisodeRecorder(out)
            for j in range(20):
                play(recorder, f"s{k}", seed=k * 100 + j, steps=3)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    episodes = read(path)
    assert len(episodes) == 80 and all(e.complete and e.summary.length == 3 for e in episodes)


def _lines(*lines: object) -> list[bytes]:
    return [dump_line(line) for line in lines]  # type: ignore[arg-type]


def test_strict_reading_names_the_bad_line() -> None:
    reset = StepRecord(episode="e", index=0, op="reset", observation={})
    bad = [*_lines(HEADER, reset), b'{"kind":"step","episode":"e","index":1,"op":"step"}\n']
    with pytest.raises(EpisodeFormatError, match="line 3") as info:
        read(b"".join(bad))
    assert info.value.line == 3
    with pytest.raises(EpisodeFormatError, match=r"line 1: .*header"):
        read(b"".join(_lines(reset)))
    with pytest.raises(EpisodeFormatError, match="line 2"):
        read(b"".join([_lines(HEADER)[0], b"not json\n", _lines(reset)[0]]))


def test_lenient_reading_skips_bad_lines(caplog) -> None:
    reset = StepRecord(episode="e", index=0, op="reset", observation={})
    data = b"".join([_lines(HEADER)[0], b"{oops\n", *_lines(reset)])
    with caplog.at_level(logging.WARNING, logger="corral.episodes"):
        (episode,) = read(data, strict=False)
    assert episode.first == reset and "line 2" in caplog.text


def test_structure_errors() -> None:
    reset = StepRecord(episode="e", index=0, op="reset", observation={})
    end = EpisodeEnd(episode="e", outcome="abandoned")
    after = StepRecord(episode="e", index=1, op="step", action={}, observation={})
    with pytest.raises(EpisodeFormatError, match="line 4: episode 'e' already ended"):
        read(b"".join(_lines(HEADER, reset, end, after)))
    skipped = StepRecord(episode="e", index=2, op="step", action={}, observation={})
    with pytest.raises(EpisodeFormatError, match="index 2 follows 0"):
        read(b"".join(_lines(HEADER, reset, skipped)))
    lenient = read(b"".join(_lines(HEADER, reset, end, after)), strict=False)
    assert [len(e.records) for e in lenient] == [1, 1]


def test_streaming_yields_episodes_as_they_end() -> None:
    buffer = io.BytesIO()
    with EpisodeWriter(buffer, HEADER) as out:
        recorder = EpisodeRecorder(out)
        recorder.reset("a", seed=1, observation={}, t=0)
        play(recorder, "b", seed=2, steps=1)  # starts later, ends first
        recorder.step("a", action={}, observation={"done": True}, t=1)
    assert [e.seed for e in iter_episodes(buffer.getvalue())] == [2, 1]
    assert [e.seed for e in read(buffer.getvalue())] == [1, 2]


def test_a_damaged_gzip_file_is_read_up_to_the_damage_but_not_appended(
    tmp_path: Path, caplog
) -> None:
    path = tmp_path / "e.jsonl.gz"
    with EpisodeWriter(path, HEADER) as out:
        play(EpisodeRecorder(out), "s", seed=1, steps=1)
    path.write_bytes(path.read_bytes()[:-6])  # the trailer cut short
    with pytest.raises(ValueError, match="damaged"):
        EpisodeWriter(path, HEADER, append=True)
    with caplog.at_level(logging.WARNING, logger="corral.episodes"):
        (episode,) = read(path)
    assert episode.complete and "ends early" in caplog.text
