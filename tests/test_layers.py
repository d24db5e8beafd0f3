"""The layer rule of DESIGN.md §1, read from the source: imports point downward, no circles.

Top to bottom (a module imports only from rows below its own; client and server never
import each other; providers never import envs; nothing imports cli or testing):
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "corral"

LAYERS = [
    {"cli", "demo", "__main__"},
    {"testing"},
    {"evaluation", "replay"},
    {"adapters"},
    {"providers"},
    {"client"},
    {"server"},
    {"envs"},
    {"episodes", "regression"},
    {"protocol"},
    {"contract"},
    {"sandbox"},
    {"blocking", "errors", "auth", "runtime", "progress"},
]
SIDEWAYS = {frozenset({"client", "server"}), frozenset({"providers", "envs"})}
"""Pairs that may not import each other in either direction, rows aside."""

KNOWN: set[tuple[str, str]] = set()
"""Exceptions to the rules above, each with the work that removes it (none left)."""


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
    raise AssertionError(f"{module} is in no layer; add it to LAYERS (and DESIGN.md §1)")


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
