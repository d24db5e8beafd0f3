"""``--cpu-report N``: the N tests (and files) that took the most CPU, children included.

The suite is CPU-bound on a loaded machine (issue 32): its wall time follows the CPU its
tests burn, in the worker and in the servers and interpreters they start, and pytest's
``--durations`` shows only the wall time, which the load inflates unevenly. Each phase of
a test (setup, call, teardown) is measured as the worker's own CPU (``RUSAGE_SELF``) plus
that of the children it reaped meanwhile (``RUSAGE_CHILDREN``: a child counts when it is
waited for, so a server started by a module's fixture lands on the test whose teardown
stops it; a warm server, forked by a template, counts when its template reports its exit:
``corral.client.warm_start.reaped_cpu_seconds``). A template's own CPU (its imports, about
a CPU-second per worker) is in no figure: it is never reaped before the worker exits.
A worker's last teardown ends its module's fixtures and its session's, whose children may
have lived the whole run (the web tests' Chromium: ~35 CPU-s of rendering,
reaped when the session ends): that teardown is listed as ``SESSION``, not under the test
it follows, and so is not in its file's figure either (the total has it; a run of one
file puts that file's module fixtures there).
The figures travel in the teardown report (``user_properties``) to the process that prints
the summary (the xdist controller); a plugin of the whole suite (``tests/conftest.py``
loads it). Off unless asked: two ``getrusage`` calls per phase.
"""

from __future__ import annotations

import resource
from collections.abc import Generator
from typing import Any

import pytest

from corral.client.warm_start import reaped_cpu_seconds

_KEY = "corral_cpu_s"
_SESSION_KEY = "corral_session_cpu_s"
SESSION = "(the last teardown of each worker: module and session fixtures)"
_OPTION = "--cpu-report"
_CPU: dict[str, tuple[float, float]] = {}
"""Node id to (own CPU-s, children's CPU-s), in the process that prints the summary."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        _OPTION,
        type=int,
        default=None,
        metavar="N",
        help="list the N tests that took the most CPU-s (the worker's and its children's)",
    )


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = children.ru_utime + children.ru_stime + reaped_cpu_seconds()
    return own.ru_utime + own.ru_stime, reaped


def _measured(item: pytest.Item, key: str = _KEY) -> Generator[None, Any, Any]:
    if item.config.getoption(_OPTION) is None:
        return (yield)
    own, children = _cpu()
    try:
        return (yield)
    finally:
        own_after, children_after = _cpu()
        item.user_properties.append((key, (own_after - own, children_after - children)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _measured(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _measured(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, Any]:
    return (yield from _measured(item, _KEY if nextitem is not None else _SESSION_KEY))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, key in ((report.nodeid, _KEY), (SESSION, _SESSION_KEY)):
        phases = [value for k, value in report.user_properties if k == key]
        if phases:
            before = _CPU.get(name, (0.0, 0.0))  # SESSION adds up every worker's
            _CPU[name] = (
                before[0] + sum(p[0] for p in phases),
                before[1] + sum(p[1] for p in phases),
            )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.getoption(_OPTION)
    if count is None or not _CPU:
        return
    ranked = sorted(_CPU.items(), key=lambda entry: -sum(entry[1]))
    own = sum(value[0] for value in _CPU.values())
    children = sum(value[1] for value in _CPU.values())
    terminalreporter.write_sep("=", f"{count} tests taking the most CPU (worker + children)")
    for nodeid, (test_own, test_children) in ranked[:count]:
        terminalreporter.write_line(
            f"{test_own + test_children:8.2f}s {test_own:8.2f} own {test_children:8.2f} "
            f"children  {nodeid}"
        )
    files: dict[str, float] = {}
    for nodeid, value in _CPU.items():
        path = nodeid.split("::", 1)[0]
        files[path] = files.get(path, 0.0) + sum(value)
    terminalreporter.write_sep("=", f"{count} test files taking the most CPU")
    for path, total in sorted(files.items(), key=lambda entry: -entry[1])[:count]:
        terminalreporter.write_line(f"{total:8.2f}s  {path}")
    terminalreporter.write_line(
        f"all {len(_CPU) - (SESSION in _CPU)} tests: {own + children:.1f} CPU-s "
        f"({own:.1f} in the workers, {children:.1f} in their children)"
    )
