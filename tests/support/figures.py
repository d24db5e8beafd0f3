"""The fault and fuzz suites' figures: what each scenario did and lost, for the run's report.

A plugin of the whole suite (``tests/conftest.py`` loads it), so that the process that
prints the summary has it: under pytest-xdist that is the controller, which collects no
test module. A test fills the ``figures`` fixture; its teardown report carries them to
the controller (``user_properties``), which prints the totals at the end of the run and,
with ``--fault-report PATH``, writes them there as JSON (docs/reliability.md quotes them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_FIGURES: dict[str, dict[str, Any]] = {}
_REPORT_KEY = "corral_fault_figures"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corral faults")
    group.addoption(
        "--fault-report", default=None, help="write the suites' figures to this JSON file"
    )


class Figures:
    """What one scenario did and lost, for the run's report."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.data: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def add(self, key: str, value: int) -> None:
        """Add ``value`` to a counter."""
        self.data[key] = self.data.get(key, 0) + value


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    """The figures of the running test, keyed by its name."""
    figures = Figures(request.node.name)
    yield figures
    if figures.data:
        request.node.user_properties.append((_REPORT_KEY, (figures.name, figures.data)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for key, value in report.user_properties:
        if key == _REPORT_KEY:
            name, data = value
            _FIGURES.setdefault(name, {}).update(data)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("corral fault and fuzz figures")
    for name, data in sorted(_FIGURES.items()):
        shown = ", ".join(f"{k}={v}" for k, v in data.items())
        terminalreporter.write_line(f"{name}: {shown}")
    path = config.getoption("--fault-report")
    if path:
        Path(path).write_text(json.dumps(_FIGURES, indent=2, sort_keys=True) + "\n")
