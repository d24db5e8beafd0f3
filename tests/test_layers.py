"""The layer rule, read from the project's one layer table (docs/architecture.md).

The table's rows, top to bottom (a module imports only from rows below its own or its
own row), the pairs that never import each other and the modules nothing imports are
parsed from the page, so the page is the truth and this test holds the code to it. Also:
no import circles, no I/O in ``corral.protocol``, no two classes sharing a name.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "corral"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def section(name: str) -> str:
    """The text between ``<!-- name...-->`` and ``<!-- /name -->`` on the page."""
    text = ARCHITECTURE.read_text()
    match = re.search(rf"<!-- {name}\b[^>]*-->(.*?)<!-- /{name} -->", text, re.S)
    assert match is not None, f"docs/architecture.md has no {name} section"
    return match.group(1)


def read_layers() -> list[set[str]]:
    """The rows of the layer table: the backticked names of each row's second column."""
    rows = []
    for line in section("layers").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            rows.append(set(re.findall(r"`([\w.]+)`", cells[1])))
    return rows


def read_pairs(name: str) -> list[list[str]]:
    """The backticked names of each list item of a section."""
    return [
        re.findall(r"`([\w.]+)`", item)
        for item in re.split(r"^- ", section(name), flags=re.M)
        if item.strip()
    ]


LAYERS = read_layers()
SIDEWAYS = {frozenset(names[:2]) for names in read_pairs("sideways")}
"""Pairs that may not import each other in either direction, rows aside."""
UNIMPORTED = {"testing": set(), "cli": {"__main__"}}
"""Modules nothing imports, but the importers named (docs/architecture.md says so too)."""

KNOWN: set[tuple[str, str]] = set()
"""Exceptions to the rules above, each with the work that removes it (none left)."""

SHARED_CLASS_NAMES = {
    "CloseSession": "protocol/openenv.py and protocol/server.py (issue 32.2's OpenEnv folder)",
    "ErrorReply": "server/openenv_http.py and protocol/messages.py (issue 32.2)",
    "Session": "server/sessions.py and adapters/trl.py (the TRL adapter's owner)",
    "Target": "providers/dockerfile.py and cli/validate/target.py (issue 31.6's one target rule)",
    "Worker": "sandbox/_worker.py and server/workers.py (the sandbox's owner)",
}
"""Public class names still defined twice, each with the work that renames one; a name
not listed here must be unique (style rule 6)."""


def test_the_table_is_read_from_the_page():
    assert len(LAYERS) >= 10 and all(LAYERS)
    assert {"cli", "protocol", "errors", "asyncio_compat"} <= set().union(*LAYERS)
    assert frozenset({"client", "server"}) in SIDEWAYS
    assert frozenset({"providers", "envs"}) in SIDEWAYS
    assert read_pairs("unimported") == [["testing", "__main__", "cli"]]


def modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(("corral", *path.relative_to(SRC).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every corral module ``path`` imports, anywhere in it (type-checking ones too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        out.update(name for name in names if name in known)
    return out


def row(module: str) -> tuple[int, str] | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package itself: its top-level API re-exports from any row
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index, parts[1]
    raise AssertionError(f"{module} is in no layer; give it a row in docs/architecture.md")


def test_imports_point_downward():
    known = modules()
    upward = []
    for module, path in known.items():
        mine = row(module)
        for target in imports(path, known):
            theirs = row(target)
            if mine is None or theirs is None or mine[1] == theirs[1]:
                continue
            if theirs[0] < mine[0] or frozenset({mine[1], theirs[1]}) in SIDEWAYS:
                upward.append((module, target))
    assert set(upward) - KNOWN == set()


def test_no_import_circles():
    known = modules()
    # A package importing its own submodules (or a module its package) is no circle.
    graph = {
        module: {
            t
            for t in imports(path, known)
            if t != module and not module.startswith(t + ".") and not t.startswith(module + ".")
        }
        for module, path in known.items()
    }
    circles = set()
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.add(trail)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*trail, nxt)))
    pairs = {(c[0], c[1]) for c in circles if len(c) == 2}
    assert {c for c in circles if len(c) != 2 or (c[0], c[1]) not in KNOWN} == set(), pairs


def test_the_protocol_core_does_no_io():
    """DESIGN.md §1: no sockets, no asyncio, no web framework under ``corral.protocol``."""
    io = {"asyncio", "socket", "selectors", "starlette", "fastapi", "uvicorn", "websockets"}
    for path in (SRC / "protocol").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & io, f"{path.name} imports {names}"


def test_nothing_imports_testing_or_cli():
    known = modules()
    found = []
    for module, path in known.items():
        mine = module.split(".")[1] if "." in module else ""
        for target in imports(path, known):
            theirs = target.split(".")[1] if "." in target else ""
            if theirs in UNIMPORTED and mine != theirs and mine not in UNIMPORTED[theirs]:
                found.append((module, target))
    assert found == []


def test_no_two_classes_share_a_name():
    defined: dict[str, list[str]] = defaultdict(list)
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined[node.name].append(str(path.relative_to(SRC)))
    shared = {name for name, paths in defined.items() if len(paths) > 1}
    assert shared - set(SHARED_CLASS_NAMES) == set(), {n: defined[n] for n in shared}
    assert set(SHARED_CLASS_NAMES) - shared == set(), "renamed: take it off SHARED_CLASS_NAMES"
    assert len(defined["Episode"]) == 1  # issue 32.6: corral.episodes.Episode only
