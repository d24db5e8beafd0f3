"""Time "today's suite" of issue 17: the tests that descend from those present when it was filed.

    python -m benchmarks.old_suite              # run the selection as `make pytest` runs tests
    python -m benchmarks.old_suite --list       # print the selected node ids, run nothing
    python -m benchmarks.old_suite --coverage   # the same run under coverage, with its total

Issue 17 asks for "today's suite under 4 minutes"; the suite has since grown (browser, Ray,
OpenEnv peers, the redesign's own tests), so the figure is taken on a fixed selection: the
tests of this checkout that descend from a test of commit :data:`FILED` (the issue's filing).
A test descends from an old one when its function name matches and its file is the old
test's file, a file git sees as renamed or copied from it, or any file when the old file
no longer holds a test of that name (the test moved). Every parametrization of a matched
test is kept, and no test is left out for being slow.

The run is ``python -m pytest -q -n 4 --dist loadgroup`` over the node ids (the Makefile's
command), and the table gives the outcome, the wall time, the CPU time of every process it
waited for (pytest, its workers, and the servers they start and reap) and the 1-minute load
average before and after: a figure taken at a load above 2 is not a quiet machine's.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILED = "d6ad61a"
"""The commit on main when issue 17 was filed: its tests are "today's suite"."""
WORKERS = 4


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout


def _is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.startswith("tests/") and name.startswith("test_") and name.endswith(".py")


def names_of_tests(source: str) -> set[str]:
    """The test functions a pytest module defines: ``test*`` at module level or in a
    ``Test*`` class (the class is not part of the key: tests move in and out of classes)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.update(
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name.startswith("test")
            )
    return names


def _tests_at(commit: str) -> dict[str, set[str]]:
    files = [
        f for f in _git("ls-tree", "-r", "--name-only", commit, "tests").split() if _is_test_file(f)
    ]
    return {f: names_of_tests(_git("show", f"{commit}:{f}")) for f in files}


def _moves(commit: str) -> dict[str, set[str]]:
    """Old test file -> the files of this checkout git sees as renamed or copied from it."""
    moves: dict[str, set[str]] = defaultdict(set)
    diff = _git("diff", "-M", "-C", "--name-status", commit, "HEAD", "--", "tests")
    for line in diff.splitlines():
        status, *paths = line.split("\t")
        if status[0] in "RC" and len(paths) == 2:
            moves[paths[0]].add(paths[1])
    return moves


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """``tests/a/test_b.py::TestC::test_d[x-1]`` -> (``tests/a/test_b.py``, ``test_d``)."""
    path, _, rest = nodeid.partition("::")
    return path, rest.rsplit("::", 1)[-1].split("[", 1)[0]


def descendants(
    old: dict[str, set[str]],
    new: dict[str, set[str]],
    moves: dict[str, set[str]],
    nodeids: Iterable[str],
) -> list[str]:
    """The node ids (of this checkout's collection) that descend from a test in ``old``.

    ``old`` and ``new`` map test files to their test names at the filing and now; ``moves``
    maps an old file to the files git sees as its renames or copies.
    """
    homes: dict[str, set[str]] = defaultdict(set)  # name -> the files it may be in now
    moved: set[str] = set()  # names that left an old file: in any file now
    for path, names in old.items():
        for name in names:
            if name in new.get(path, set()):
                homes[name].update({path, *moves.get(path, ())})
            else:
                moved.add(name)
    chosen = []
    for nodeid in nodeids:
        path, name = split_nodeid(nodeid)
        if name in moved or path in homes.get(name, ()):
            chosen.append(nodeid)
    return chosen


def collect(python: str) -> list[str]:
    """Every node id of this checkout's suite, as ``pytest --collect-only`` lists them."""
    run = subprocess.run(
        [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    ids = [line for line in run.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if run.returncode != 0 or not ids:
        sys.exit(f"collection failed ({run.returncode}):\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    return ids


def selection(python: str) -> tuple[list[str], int]:
    """The selected node ids and the size of the whole suite."""
    everything = collect(python)
    current = {
        f: names_of_tests((REPO / f).read_text())
        for f in _git("ls-files", "tests").split()
        if _is_test_file(f) and (REPO / f).exists()
    }
    return descendants(_tests_at(FILED), current, _moves(FILED), everything), len(everything)


def _outcome(text: str) -> dict[str, int]:
    summary = text.strip().splitlines()[-1] if text.strip() else ""
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}


def run(python: str, ids: list[str], coverage: bool) -> int:
    with tempfile.NamedTemporaryFile("w", suffix=".args", delete=False) as args:
        args.write("\n".join(ids))
    pytest = ["-m", "pytest", "-q", "-n", str(WORKERS), "--dist", "loadgroup", f"@{args.name}"]
    command = [python, "-m", "coverage", "run", *pytest] if coverage else [python, *pytest]
    if coverage:
        for stale in REPO.glob(".coverage*"):
            stale.unlink()
    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()[0]
    os.unlink(args.name)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    sys.stdout.write(done.stdout[-4000:] + done.stderr[-2000:])
    outcome = _outcome(done.stdout)
    rows = [
        ("tests selected", str(len(ids))),
        ("outcome", ", ".join(f"{n} {word}" for word, n in outcome.items()) or "unknown"),
        ("wall (s)", f"{wall:.0f}"),
        ("CPU, user+sys of children (s)", f"{cpu:.0f}"),
        ("load average (1 min) before -> after", f"{load_before:.1f} -> {load_after:.1f}"),
    ]
    if coverage:
        subprocess.run([python, "-m", "coverage", "combine", "-q"], cwd=REPO, check=True)
        report = subprocess.run(
            [python, "-m", "coverage", "report", "--format=total", "--precision=2"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(("line coverage of corral (%)", report.stdout.strip()))
        rows[2] = ("wall under coverage (s)", rows[2][1])
    width = max(len(label) for label, _ in rows)
    print()
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to test with")
    parser.add_argument("--list", action="store_true", help="print the node ids and exit")
    parser.add_argument("--coverage", action="store_true", help="run under coverage and report")
    options = parser.parse_args(argv)
    ids, total = selection(options.python)
    if options.list:
        print("\n".join(ids))
        print(f"{len(ids)} of {total} tests descend from {FILED}'s", file=sys.stderr)
        return 0
    print(f"{len(ids)} of {total} tests descend from {FILED}'s; running them", flush=True)
    return run(options.python, ids, options.coverage)


if __name__ == "__main__":
    sys.exit(main())
