"""The capacity benchmark at smoke sizes, so that it cannot rot (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_capacity_smoke_writes_both_tables(tmp_path: Path) -> None:
    output = tmp_path / "CAPACITY.md"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.capacity", "--smoke", "--providers", "local",
         "--markdown", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    text = output.read_text()
    envs = text.split("## Sessions per core", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in envs.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[1].strip() for row in rows] == ["echo", "wordle", "coding"]
    assert "| local | warm |" in text and "| local | cold, provider |" in text
