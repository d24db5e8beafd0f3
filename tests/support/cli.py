"""Running the ``corral`` command in a child process, from the repository's root."""

from __future__ import annotations

import os
import signal
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


def foreground_sigint() -> None:
    """``preexec_fn`` of a child the test sends Ctrl-C: SIGINT back to its default
    disposition, as a terminal's foreground job has it.

    A non-interactive shell starts a background job (``make pytest > log &``) with SIGINT
    ignored, and every process the suite starts inherits that; Python then installs no
    KeyboardInterrupt handler, nor ``asyncio.run`` its own, so the child's SIGINT would be
    ignored and it would run to its end (an ``EXIT 0`` where the test expects 130).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
