"""The progress bar of ``corral eval``: episodes done of planned, and success so far."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ProgressBar:
    """A rich progress bar on ``console``, or nothing when not ``enabled``."""

    def __init__(self, enabled: bool, console: Console, total: int, done: int, label: str) -> None:
        self.progress = (
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[success]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
            )
            if enabled
            else None
        )
        self.task: TaskID | None = (
            self.progress.add_task(label, total=total, completed=done, success="")
            if self.progress is not None
            else None
        )

    def __enter__(self) -> ProgressBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def advance(self, done: int, successes: int) -> None:
        """Show ``done`` episodes finished, ``successes`` of them successful."""
        if self.progress is not None and self.task is not None:
            rate = f"success {successes / done:.0%}" if done else ""
            self.progress.update(self.task, completed=done, success=rate)
