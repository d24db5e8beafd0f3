"""Progress of long work: one live line on a terminal, a one-line summary, raw output on request.

    with Activity("building corral-demo_env:0.1.0", verbose=verbose) as activity:
        built = build_image(env_dir, progress=activity)   # every output line goes through it
        activity.done(f"built {built.tag} in {built.seconds:.1f} s")

An :class:`Activity` is a :data:`~corral.providers.dockerfile.Progress` callback: it takes
the raw output lines of the work (pip, ``docker build``, corral's own step lines) and turns
them into a live line (a spinner, the current phase, a bar once the size of the phase is
known, the elapsed time), which disappears when the work ends and leaves the one-line
summary given to :meth:`Activity.done`. Raw lines are printed only with ``verbose``, and
then long commands are shortened (pip's ~35 ``--platform`` flags become one).

On a console that is not a terminal (CI logs, a file) nothing animates: the title is printed
when the work starts and the summary when it ends, so that a long step is never silent.

Phases are recognised from the output (:data:`PHASES`): corral's step lines (``building``,
``resolving``, ``downloading 28 wheels`` ...) start a phase; ``docker build``'s
``Step 5/18`` lines drive a bar.
"""

from __future__ import annotations

import re
import threading
import time
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

PHASES = (
    "building ",
    "resolving ",
    "downloading ",
    "fetching ",
    "creating ",
    "installing ",
    "reusing ",
    "base image ",
    "staging ",
    "uploading ",
)
"""How the step lines of corral's build functions start; each starts a new phase."""

_DOCKER_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_REPEATED_FLAG = re.compile(r"((--[\w-]+) \S+)(?: \2 \S+){3,}")


def compact_command(line: str) -> str:
    """``line`` with an option repeated many times shortened to its first value and a count."""

    def shorten(match: re.Match[str]) -> str:
        count = match.group(0).count(match.group(2) + " ")
        return f"{match.group(1)} … ({count} times {match.group(2)})"

    return _REPEATED_FLAG.sub(shorten, line)


class Activity:
    """The progress display of one long piece of work (see the module docstring).

    Args:
        title: what is being done (``"building corral-demo_env:0.1.0"``).
        console: where to draw (default: stderr).
        verbose: also print every raw line.
        total: the work's size when it is counted in units (see :meth:`advance`).
    """

    def __init__(
        self,
        title: str,
        *,
        console: Console | None = None,
        verbose: bool = False,
        total: int | None = None,
    ) -> None:
        self.title = title
        self.console = console or Console(stderr=True, highlight=False)
        self.verbose = verbose
        self.lines = 0
        self.phase = title
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._live = self.console.is_terminal
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("[dim]{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self._live,
        )
        self._task: TaskID = self._progress.add_task(
            escape(title), total=total, start=True, detail=""
        )

    @property
    def seconds(self) -> float:
        """Seconds since the work started."""
        return time.monotonic() - self.started

    def __enter__(self) -> Self:
        if self._live:
            self._progress.start()
        else:
            self.console.print(f"{escape(self.title)} …")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def __call__(self, line: str) -> None:
        """Take one raw line of output."""
        with self._lock:
            self.lines += 1
            if self.verbose:
                shown = compact_command(line) if line.startswith("$ ") else line
                self._progress.console.print(escape(shown), style="dim", soft_wrap=True)
            if line.startswith("$ "):
                return
            step = _DOCKER_STEP.match(line)
            if step is not None:
                done, total = int(step.group(1)), int(step.group(2))
                self._set(f"docker build: {step.group(3)}", completed=done - 1, total=total)
            elif line.startswith(PHASES):
                self._set(line, completed=0, total=None)
            else:
                self._progress.update(self._task, detail=escape(_clip(line, 60)))

    def set_phase(self, description: str, total: int | None = None) -> None:
        """Start a phase of the work (``total`` units, if it is counted)."""
        with self._lock:
            self._set(description, completed=0, total=total)

    def advance(self, units: int = 1) -> None:
        """Count ``units`` of the current phase as done."""
        self._progress.advance(self._task, units)

    def update(self, completed: int) -> None:
        """Set how many units of the current phase are done."""
        self._progress.update(self._task, completed=completed)

    def done(self, summary: str, *, style: str = "green") -> None:
        """End the live line and print ``summary`` (rich markup is not interpreted)."""
        self._progress.stop()
        self.console.print(f"[{style}]{escape(summary)}[/]", soft_wrap=True)

    def _set(self, description: str, *, completed: int, total: int | None) -> None:
        self.phase = description
        self._progress.update(
            self._task,
            description=escape(_clip(description, 70)),
            completed=completed,
            total=total,
            detail="",
        )


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["PHASES", "Activity", "compact_command"]
