"""Issue 30.14: what a reader refuses, and how it says so.

A header must name its format, with a version this corral reads (1 up to
``FORMAT_VERSION``): a missing one, ``/0``, a newer one or a 5,000-digit one is refused
with one short sentence, also by a lenient reader (the lines after a header cannot be
read without it). An empty file is no episode file. A writer that must stay in its
directory refuses a symbolic link as it opens the file.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import orjson
import pytest

from corral.episodes import (
    FORMAT,
    EpisodeFormatError,
    EpisodeWriter,
    Header,
    StepRecord,
    dump_line,
    iter_lines,
    read,
)
from corral.episodes.format import format_version

STEP = dump_line(StepRecord(episode="a", index=0, op="reset", observation={"n": 0}))


def header_with(**fields: object) -> bytes:
    data = orjson.loads(dump_line(Header()))
    data.update(fields)
    data = {k: v for k, v in data.items() if v is not None}
    return orjson.dumps(data) + b"\n"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, "must name its format"),
        ("corral-episodes/0", "versions are numbered from 1"),
        ("corral-episodes/01", "versions are numbered from 1"),
        ("corral-episodes/", "is not 'corral-episodes/1'"),
        ("episodes/1", "is not 'corral-episodes/1'"),
        ("corral-episodes/2", "newer corral"),
        ("corral-episodes/" + "9" * 5000, "newer corral"),
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_a_header_without_a_readable_version_is_refused(
    value: str | None, says: str, strict: bool
) -> None:
    data = header_with(format=value) + STEP
    with pytest.raises(EpisodeFormatError, match=says) as caught:
        read(data, strict=strict)
    message = str(caught.value)
    assert message.startswith("line 1: ") and len(message) < 300, message
    assert "Exceeds the limit" not in message  # Python's int-size error never shows


def test_format_versions() -> None:
    assert format_version(FORMAT) == 1
    with pytest.raises(ValueError, match="newer corral"):
        format_version("corral-episodes/" + "1" * 10)


def test_an_empty_file_is_not_an_episode_file(tmp_path: Path) -> None:
    for data in (b"", b"\n\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_bytes(data)
        with pytest.raises(EpisodeFormatError, match="it is empty"):
            read(path)
        with pytest.raises(EpisodeFormatError, match="it is empty"):
            read(path, strict=False)
    # A header and nothing else is a file with no episodes, not an error.
    assert read(header_with()) == []


def test_reading_streams_a_long_file(tmp_path: Path) -> None:
    """Lines are parsed one at a time: the reader never holds the file's text."""
    path = tmp_path / "long.jsonl"
    with open(path, "wb") as out:
        out.write(header_with())
        for k in range(2000):
            out.write(STEP.replace(b'"episode":"a"', b'"episode":"e%d"' % k))
    lines = iter_lines(path)
    number, header = next(lines)
    assert number == 1 and isinstance(header, Header)
    assert sum(1 for _ in lines) == 2000


def test_a_writer_that_must_not_follow_links_refuses_one(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"kept\n")
    inside = tmp_path / "run"
    inside.mkdir()
    link = inside / "episodes.jsonl"
    link.symlink_to(outside)
    for append in (True, False):
        with pytest.raises(OSError) as caught:
            EpisodeWriter(link, Header(), append=append, follow_symlinks=False)
        assert caught.value.errno == 40  # ELOOP
    assert outside.read_bytes() == b"kept\n"
    # The default follows links (a user may point a recording anywhere).
    with EpisodeWriter(link, Header(), append=True):
        pass
    assert outside.read_bytes().startswith(b"kept\n{")


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_append_without_following_links_repairs_and_continues(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with EpisodeWriter(path, Header(), follow_symlinks=False) as out:
        out.write(StepRecord(episode="a", index=0, op="reset", observation={"n": 0}))
    if name.endswith(".jsonl"):
        with open(path, "ab") as raw:
            raw.write(b'{"kind":"step","epis')  # a killed writer's partial line
    with EpisodeWriter(path, append=True, follow_symlinks=False) as out:
        out.write(StepRecord(episode="a", index=1, op="step", action={}, observation={"n": 1}))
    (episode,) = read(path)
    assert [r.index for r in episode.records] == [0, 1]
    if name.endswith(".gz"):
        with gzip.open(path) as unzipped:
            assert unzipped.read().count(b"\n") == 3
    assert not os.path.islink(path)
