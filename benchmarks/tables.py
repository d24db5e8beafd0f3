"""The suite's tables: rendered to the terminal (rich) and to Markdown, and their numbers."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def fmt(value: float | None, digits: int = 0) -> str:
    """``value`` with thousands separators and ``digits`` decimals; a dash for None."""
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    """``a / b`` as ``1.23x``; a dash when either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}x"


class Report:
    """Tables rendered both to the terminal (rich) and to Markdown."""

    def __init__(self) -> None:
        self.sections: list[tuple[str, list[str], list[list[str]], list[str]]] = []

    def add(self, title: str, header: list[str], rows: list[list[str]], notes: list[str]) -> None:
        self.sections.append((title, header, rows, notes))

    def print(self, console: Console) -> None:
        for title, header, rows, notes in self.sections:
            table = Table(title=title, title_justify="left")
            for i, column in enumerate(header):
                table.add_column(column, justify="left" if i == 0 else "right")
            for row in rows:
                table.add_row(*row)
            console.print(table)
            for note in notes:
                console.print(f"  {note}")
            console.print()

    def markdown(self) -> str:
        out = []
        for title, header, rows, notes in self.sections:
            out.append(f"## {title}\n")
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
            out.extend("| " + " | ".join(row) + " |" for row in rows)
            out.append("")
            out.extend(f"{note}  " for note in notes)
            out.append("")
        return "\n".join(out)
