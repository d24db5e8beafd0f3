"""The report of ``corral validate``: one :class:`Check` per check, printed or as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """The outcome of one check."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass
class Check:
    """One check's outcome: ``protocol`` is ``http``, ``openenv``, ``corral`` or ``static``."""

    id: str
    protocol: str
    title: str
    status: Status
    detail: str = ""


@dataclass
class Report:
    """All checks of one validation run."""

    target: str
    protocols: dict[str, bool] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No check failed (skipped checks do not count)."""
        return all(check.status is not Status.FAIL for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        """The failed checks."""
        return [check for check in self.checks if check.status is Status.FAIL]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-compatible dict."""
        counts = {s.value: sum(c.status is s for c in self.checks) for s in Status}
        return {
            "target": self.target,
            "protocols": self.protocols,
            "passed": self.passed,
            "summary": counts,
            "checks": [
                {
                    "id": c.id,
                    "protocol": c.protocol,
                    "title": c.title,
                    "status": c.status.value,
                    "detail": c.detail,
                }
                for c in self.checks
            ],
        }


_MARKS = {
    Status.PASS: "[green]PASS[/]",
    Status.FAIL: "[bold red]FAIL[/]",
    Status.SKIP: "[dim]skip[/]",
}


def print_report(report: Report) -> None:
    """Print ``report`` as a table with a verdict line."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    found = [name for name, ok in report.protocols.items() if ok]
    table = Table(title=f"corral validate {report.target}", title_justify="left")
    table.add_column("", no_wrap=True, min_width=4)
    table.add_column("protocol", style="cyan", no_wrap=True, min_width=7)
    table.add_column("check", overflow="fold", ratio=2)
    table.add_column("detail", overflow="fold", ratio=3)
    for check in report.checks:
        table.add_row(
            _MARKS[check.status], check.protocol, f"{check.id}: {check.title}", check.detail
        )
    console.print(table)
    console.print(f"protocols: {', '.join(found) if found else 'none detected'}")
    if report.passed:
        console.print("[green]passed[/]")
    for check in report.failures:
        console.print(f"[bold red]FAILED[/] {check.id}: {check.detail}")
