"""What a sandboxed worker reports back: the outcome of running code, and of test cases."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

KilledReason = Literal[
    "wall_clock",
    "cpu_time",
    "memory",
    "output_limit",
    "disk",
    "signal",
    "exited",
    "protocol",
    "closed",
]
"""Why a sandboxed process ended before answering (stable names: environments report them)."""


@dataclasses.dataclass
class ExecOutcome:
    """What one ``exec`` of the agent's code produced.

    ``exit_code`` is None when the process ended before answering; ``killed_reason``
    then says why and ``error`` says it in words.
    """

    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: int | None = None
    error: str | None = None
    killed_reason: KilledReason | None = None
    wall_time: float = 0.0
    cpu_time: float | None = None


@dataclasses.dataclass
class CaseOutcome:
    """The worker's report of one hidden test case (``value`` in canonical form)."""

    index: int
    ok: bool
    value: Any = None
    error: str | None = None


@dataclasses.dataclass
class TestsOutcome:
    """The reports of a test run; the cases after a kill are missing from ``cases``."""

    cases: list[CaseOutcome]
    killed_reason: KilledReason | None = None
