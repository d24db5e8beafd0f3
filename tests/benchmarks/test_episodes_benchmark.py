"""The episodes benchmark at smoke sizes, so that it cannot rot (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_prints_both_tables() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.episodes", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "Recording overhead" in run.stdout and "corral eval throughput" in run.stdout
    for row in ("echo", "wordle", "random", "scripted"):
        assert row in run.stdout
