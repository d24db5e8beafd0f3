"""Fault-injection and bad-input suites: scale option, shared servers.

``pytest tests/faults`` runs every scenario at its default size (about a minute on two
cores); ``--long`` (an option of the whole suite, ``tests/conftest.py``) runs them
bigger. Each scenario records what it did and what was lost in the ``figures`` fixture
(``tests/support/figures.py``, which prints them and writes ``--fault-report PATH``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.client.local_server import LocalServer

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scale:
    """Sizes of the scenarios for this run."""

    long: bool
    steps: int
    sessions: int
    cut_every: int
    half_open: int
    fuzz_examples: int
    openapi_examples: int

    def pick(self, short: int, long: int) -> int:
        """``short`` normally, ``long`` under ``--long``."""
        return long if self.long else short


@pytest.fixture(scope="session")
def scale(request: pytest.FixtureRequest) -> Scale:
    """How big each scenario runs (``--long`` for the big version)."""
    if request.config.getoption("--long"):
        return Scale(True, 100_000, 200, 200, 2_000, 2_000, 200)
    return Scale(False, 10_000, 50, 200, 1_000, 250, 30)


def local_server(target: str, *args: str, env: dict[str, str] | None = None) -> LocalServer:
    """A ``corral serve`` child process for ``target``, able to import ``tests.faults``."""
    return LocalServer(
        target,
        server_args=list(args),
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), **(env or {})},
        startup_timeout=60,
    )


def started(server: LocalServer) -> LocalServer:
    """Start ``server`` from synchronous code (module-scoped fixtures)."""
    asyncio.run(server.start())
    return server


@pytest.fixture(scope="module")
def recording_server() -> Iterator[LocalServer]:
    """A server process for ``RecordingEnv`` with a short keepalive, shared by a module."""
    server = local_server(
        "tests.faults.envs:RecordingEnv",
        "--max-sessions",
        "4096",
        "--resume-window",
        "20",
        "--ping-interval",
        "1",
        "--ping-timeout",
        "1",
    )
    started(server)
    try:
        yield server
    finally:
        server.stop_now()


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
