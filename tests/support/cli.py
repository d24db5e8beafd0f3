"""Running the ``corral`` command in a child process, from the repository's root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def corral(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``corral ARGS...`` (this interpreter), its output captured; ``env`` adds variables."""
    return subprocess.run(
        [sys.executable, "-m", "corral.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
