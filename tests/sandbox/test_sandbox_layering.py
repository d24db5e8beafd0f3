"""Where the sandbox sits (DESIGN.md §1): at the bottom, used by envs and providers alike.

``corral.sandbox`` imports nothing of corral but itself and ``corral.errors`` (the one
module below it: its errors are ``PlatformError``s, so ``except CorralError`` catches
them), and no provider imports an example environment (the local provider once reached
into the coding env for it).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"


def corral_imports(path: Path) -> set[str]:
    """The ``corral...`` modules one source file imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "corral")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("corral"):
            found.add(str(node.module))
    return found


def test_the_sandbox_imports_only_itself() -> None:
    files = sorted((SRC / "sandbox").glob("*.py"))
    assert files
    outside = {
        f"{path.name}: {module}"
        for path in files
        for module in corral_imports(path)
        if module not in ("corral.sandbox", "corral.errors")
        and not module.startswith("corral.sandbox.")
    }
    assert outside == set()


def test_no_provider_imports_an_environment() -> None:
    found = {
        f"{path.relative_to(SRC)}: {module}"
        for path in sorted((SRC / "providers").rglob("*.py"))
        for module in corral_imports(path)
        if module == "corral.envs" or module.startswith("corral.envs.")
    }
    assert found == set()
