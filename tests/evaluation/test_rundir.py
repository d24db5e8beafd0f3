"""Issue 30.14: a run directory's files, as ``corral eval`` resumes and writes them.

Against a real server on 127.0.0.1 (a FragileEnv on seeds that never break): a run whose
episode file has a newer format is refused with one sentence (no traceback, exit 1 from
the command), and files that are symbolic links are refused, never followed out of the
directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.cli import corral_here
from tests.support.flaky import FragileEnv
from tests.support.servers import running

from corral.evaluation import EvalError, evaluate
from corral.evaluation.rundir import plan, recorded, run_file, write_run_file


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running(FragileEnv, max_sessions=16) as srv:
        yield srv.url


def newer(path: Path) -> None:
    """Make ``path``'s header say a format from a later corral."""
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"format":"corral-episodes/1"', b'"format":"corral-episodes/7"'))


async def test_resuming_a_file_of_a_newer_format_is_refused(tmp_path: Path, url: str) -> None:
    out = tmp_path / "run"
    await evaluate(url, out=out, episodes=2, seed=6, concurrency=2)
    newer(out / "episodes.jsonl")
    with pytest.raises(EvalError, match=r"cannot resume .*newer corral.*upgrade corral"):
        await evaluate(url, out=out, episodes=3, seed=6, concurrency=2)
    done = corral_here("eval", url, "--out", str(out), "--episodes", "3", "--seed", "6")
    assert done.returncode != 0
    assert "newer corral" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr + done.stdout


async def test_links_in_the_run_directory_are_not_followed(tmp_path: Path, url: str) -> None:
    out = tmp_path / "run"
    await evaluate(url, out=out, episodes=2, seed=6, concurrency=2)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_bytes((out / "episodes.jsonl").read_bytes())
    kept = outside.read_bytes()
    (out / "episodes.jsonl").unlink()
    (out / "episodes.jsonl").symlink_to(outside)
    with pytest.raises(EvalError, match="is a symbolic link"):
        await evaluate(url, out=out, episodes=4, seed=6, concurrency=2)
    assert outside.read_bytes() == kept  # nothing appended outside the run
    with pytest.raises(EvalError, match="is a symbolic link"):
        recorded(out / "episodes.jsonl")


def test_run_files_are_written_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "target.json"
    outside.write_text("{}")
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").symlink_to(outside)
    with pytest.raises(EvalError, match="is a symbolic link"):
        write_run_file(out, "summary.json", '{"x": 1}')
    assert outside.read_text() == "{}"
    (out / "run.json").mkdir()
    with pytest.raises(EvalError, match="not a regular file"):
        run_file(out, "run.json")
    write_run_file(out, "fresh.json", "ok\n")
    assert (out / "fresh.json").read_text() == "ok\n"


def test_an_empty_episode_file_plays_everything(tmp_path: Path) -> None:
    (tmp_path / "episodes.jsonl").touch()
    todo = plan(recorded(tmp_path / "episodes.jsonl"), 3, 0)
    assert todo.queue == [(0, 0), (1, 0), (2, 0)] and todo.finished == 0
