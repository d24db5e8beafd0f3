"""Running the ``corral`` command: in a child process, from the repository's root, or in
this process (:func:`corral_here`)."""

from __future__ import annotations

import concurrent.futures
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


def corral_here(*args: str) -> subprocess.CompletedProcess[str]:
    """``corral ARGS...`` run by typer's test runner in this process, as :func:`corral`
    answers: for a test of what a command says and exits with, not of its process (a
    child costs ~1.3 CPU-s to start and import; issue 32). An exception the command does
    not turn into its own message is raised here, not taken for an exit status. On a
    thread of its own: a command may run its own event loop, and the test may be in one.
    """
    from typer.testing import CliRunner

    from corral.cli.main import app

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        result = thread.submit(CliRunner().invoke, app, list(args), catch_exceptions=False)
        done = result.result()
    return subprocess.CompletedProcess(["corral", *args], done.exit_code, done.stdout, done.stderr)


def foreground_sigint() -> None:
    """``preexec_fn`` of a child the test sends Ctrl-C: SIGINT back to its default
    disposition, as a terminal's foreground job has it.

    A non-interactive shell starts a background job (``make pytest > log &``) with SIGINT
    ignored, and every process the suite starts inherits that; Python then installs no
    KeyboardInterrupt handler, nor ``asyncio.run`` its own, so the child's SIGINT would be
    ignored and it would run to its end (an ``EXIT 0`` where the test expects 130).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
