"""The layer rule, read from the project's one layer table (docs/architecture.md).

The table's rows, top to bottom (a module imports only from rows below its own or its
own row), the pairs that never import each other and the modules nothing imports are
parsed from the page, so the page is the truth and this test holds the code to it. The
page's tables of the modules inside ``protocol``, ``contract``, ``client`` and ``server``
are held the same way, one level down (imports that run, there). Also: no import
circles, no I/O in ``corral.protocol``, no two classes sharing a name.
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


def read_layers(name: str = "layers") -> list[set[str]]:
    """The rows of a layer table (``layers``, or ``inside <package>``): the backticked
    names of each row's second column."""
    rows = []
    for line in section(name).splitlines():
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

SHARED_CLASS_NAMES: dict[str, str] = {}
"""Public class names defined twice, each with the work that renames one (none left); a name
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


INSIDE = ("protocol", "contract", "client", "server")
"""The packages whose modules the page ranks too (``inside <package>`` tables)."""


def units(package: str) -> dict[str, list[Path]]:
    """The modules of ``package`` by their first name under it (a sub-package is one
    unit: ``client/dialers/``), the package's own ``__init__`` aside."""
    found: dict[str, list[Path]] = defaultdict(list)
    for path in (SRC / package).rglob("*.py"):
        parts = path.relative_to(SRC / package).with_suffix("").parts
        if parts != ("__init__",):
            found[parts[0]].append(path)
    return found


def runtime_imports(path: Path) -> set[str]:
    """The corral modules ``path`` imports when it runs: everything but the imports
    under ``if TYPE_CHECKING:`` (annotations only)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in out if name.startswith("corral.")}


def test_inside_the_packages_imports_point_downward():
    for package in INSIDE:
        rows = read_layers(f"inside {package}")
        ranked = {name: index for index, names in enumerate(rows) for name in names}
        found = units(package)
        assert set(found) - set(ranked) == set(), (
            f"modules of corral.{package} in no row of its table in docs/architecture.md"
        )
        assert set(ranked) - set(found) == set(), f"corral.{package}'s table names modules gone"
        upward = []
        prefix = f"corral.{package}."
        for unit, paths in found.items():
            for path in paths:
                for target in runtime_imports(path):
                    theirs = target.removeprefix(prefix).split(".")[0]
                    inside = target.startswith(prefix) and theirs in ranked and theirs != unit
                    if inside and ranked[theirs] < ranked[unit]:
                        upward.append((f"{package}.{unit}", f"{package}.{theirs}"))
        assert upward == [], upward


def test_an_upward_import_inside_a_package_is_found(tmp_path: Path) -> None:
    """The reader of imports that run: an annotation-only import is left out, any other
    (a module's top, a function's body) is in."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from corral.protocol.codecs import JsonCodec\n"
        "if TYPE_CHECKING:\n"
        "    from corral.protocol.messages import Reply\n"
        "def later():\n"
        "    import corral.protocol.server\n"
    )
    found = runtime_imports(module)
    assert "corral.protocol.codecs.JsonCodec" in found and "corral.protocol.server" in found
    assert not any("messages" in name for name in found)


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
