"""The pages name only what exists: every ``corral <command> --flag`` and ``corral.x.y``
name in the code of README.md and docs/*.md.

test_readme.py runs the code blocks; this reads all of them, skipped blocks included, and
the inline code spans of the prose, where stale names hide:

* a command line (in a shell block or a span: ``corral serve X --mcp``) must name a
  registered command (and subcommand, for groups such as ``corral schema lock``), and each
  of its ``--flags`` must be one of that command's options;
* a dotted name (``corral.adapters.mcp.mount_mcp``, ``corral.envs.wordle:WordleEnv``) and
  each name a Python block imports from corral must be defined in the source: a module,
  then a name its code defines or imports, then an attribute of that class. The source
  is read, not imported (nothing heavy is loaded; a module's code never runs).
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^([ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^[ \t]*```", re.S | re.M)
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_NAME = re.compile(r"(?<![\w./-])corral(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_][\w.]*)?(?![\w/-])")
_SHELL_SPLIT = re.compile(r"&&|\|\||[|;&]|\$\(|\)")
_COMMAND_WORD = re.compile(r"^[a-z][a-z0-9-]*$")
_FILE_PARTS = frozenset({"yaml", "yml", "json", "jsonl", "toml", "md", "txt", "lock", "py", "sh"})
_WIRE_NAME = re.compile(r"^corral\.v\d+\.")  # subprotocols: corral.v1.msgpack, corral.v1.json
_OUTPUT = frozenset({"text", "output"})
"""Block languages that show what a program printed (log lines name loggers, not code)."""

KNOWN: dict[str, str] = {
    "corral.trajectories.read": "docs/episodes.md names the issue's old name to say it moved",
}
"""Names a page mentions on purpose although they do not exist, with why."""


@dataclass(frozen=True)
class Code:
    """A piece of code on a page: a fenced block (with its language) or an inline span."""

    page: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_of(page: Path, text: str) -> list[Code]:
    """The fenced blocks and the inline spans of a page (spans outside blocks only)."""
    found: list[Code] = []
    prose = text
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start("code")) + 1
        found.append(Code(page, line, match.group("lang") or "text", match.group("code")))
        blank = re.sub(r"[^\n]", " ", match.group(0))  # keep line numbers of what follows
        prose = prose[: match.start()] + blank + prose[match.end() :]
    for match in _SPAN.finditer(prose):
        line = prose.count("\n", 0, match.start()) + 1
        found.append(Code(page, line, "span", match.group(1)))
    return found


# -- the command line ---------------------------------------------------------------


@cache
def command_tree() -> dict[str, Any]:
    """``{command: {"options": set, "commands": {sub: {...}}}}`` of the corral CLI."""
    from corral.cli.main import COMMANDS

    def describe(command: Any) -> dict[str, Any]:
        options = {"--help"}
        for param in command.params:
            options.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
        subcommands = getattr(command, "commands", {}) or {}
        return {
            "options": options,
            "commands": {name: describe(sub) for name, sub in subcommands.items()},
        }

    return {name: describe(lazy.load()) for name, lazy in COMMANDS.items()}


def command_lines(code: Code) -> list[list[str]]:
    """The argument lists after each ``corral`` word of a piece of shell or prose code."""
    if code.lang in ("python", "py", "pycon", "yaml", "json", "toml", "dockerfile", *_OUTPUT):
        return []
    text = re.sub(r"\\\n", " ", code.text)
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0]
        for part in _SHELL_SPLIT.split(line):
            try:
                words = shlex.split(part)
            except ValueError:
                words = part.split()
            for index, word in enumerate(words):
                if word == "corral" or word.endswith("/corral"):
                    out.append(words[index + 1 :])
                    break
    return out


def cli_problems(code: Code) -> list[str]:
    """What a piece of code names of the CLI that does not exist."""
    problems: list[str] = []
    tree = command_tree()
    for args in command_lines(code):
        node: dict[str, Any] | None = None
        path: list[str] = []
        for word in args:
            if word.startswith("--"):
                known = node["options"] if node is not None else {"--help", "--version"}
                for flag in word.split("=", 1)[0].split("/"):  # `--ping-interval/--ping-timeout`
                    if flag not in ("--", "") and flag not in known:
                        shown = " ".join(["corral", *path])
                        problems.append(f"{code.where}: `{shown}` has no option {flag}")
                continue
            if word.startswith("-") or not _COMMAND_WORD.match(word):
                if node is None:
                    break  # `corral <COMMAND>`, `corral[sb3]`...: not a command line
                continue
            children = tree if node is None else node["commands"]
            if node is not None and not children:
                continue  # an argument of a leaf command
            if word not in children:
                if node is None or children:
                    shown = " ".join(["corral", *path, word])
                    problems.append(f"{code.where}: `{shown}` is not a command")
                break
            node = children[word]
            path.append(word)
    return problems


# -- Python names ---------------------------------------------------------------------


def module_file(dotted: str) -> Path | None:
    """The source file of a corral module or package, if there is one."""
    base = SRC.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def top_level(module: str) -> dict[str, ast.AST]:
    """What a module's code defines at its top level (through ``if``/``try`` blocks):
    functions, classes, assignments and imports (as their ``ImportFrom``/``Import``)."""
    path = module_file(module)
    assert path is not None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
                exported = any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                if exported and isinstance(node.value, (ast.List, ast.Tuple)):
                    for item in node.value.elts:  # lazy names (a module __getattr__)
                        if isinstance(item, ast.Constant) and isinstance(item.value, str):
                            names.setdefault(item.value, node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names[node.target.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)

    visit(tree.body)
    return names


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from ... import`` in ``module`` reads."""
    if not node.level:
        return node.module or ""
    path = module_file(module)
    parts = module.split(".")
    package = parts if path is not None and path.name == "__init__.py" else parts[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def resolves(module: str, attributes: list[str], depth: int = 0) -> bool:
    """True when ``module`` defines ``attributes[0]`` (and the class it names defines
    ``attributes[1]``...): the name exists in the source."""
    if not attributes:
        return True
    if depth > 20:
        return False
    first, rest = attributes[0], attributes[1:]
    if module_file(f"{module}.{first}") is not None:
        return resolves(f"{module}.{first}", rest, depth + 1)
    node = top_level(module).get(first)
    if node is None:
        return False
    if isinstance(node, ast.ImportFrom):
        source = _absolute(module, node)
        original = next(a.name for a in node.names if (a.asname or a.name) == first)
        if not source.startswith("corral"):
            return True  # a third-party name re-exported: it exists if the import works
        return resolves(source, [original, *rest], depth + 1)
    if isinstance(node, ast.ClassDef) and rest:
        return class_defines(module, node, rest[0], depth)
    return True  # a function, a constant or a lazy name: deeper attributes are its own


def class_defines(module: str, node: ast.ClassDef, name: str, depth: int) -> bool:
    """The class (or a corral base of it) defines ``name``; a class with a base from
    outside corral may inherit it (pydantic's ``model_dump``...): accepted."""
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if item.name == name:
                return True
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if item.target.id == name:
                return True
        elif isinstance(item, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in item.targets
        ):
            return True
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else None
        if isinstance(base, ast.Subscript) and isinstance(base.value, ast.Name):
            base_name = base.value.id
        if base_name is None:
            return True
        found = top_level(module).get(base_name)
        if isinstance(found, ast.ClassDef):
            if class_defines(module, found, name, depth + 1):
                return True
        elif isinstance(found, ast.ImportFrom) and _absolute(module, found).startswith("corral"):
            source = _absolute(module, found)
            if resolves(source, [base_name, name], depth + 1):
                return True
        else:
            return True  # a base from outside corral
    return False


def name_exists(dotted: str) -> bool:
    """A ``corral.x.y`` or ``corral.x:Y.z`` name exists in the source."""
    path, _, attribute = dotted.partition(":")
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module_file(module) is not None:
            rest = parts[cut:] + (attribute.split(".") if attribute else [])
            return resolves(module, rest)
    return False


def names_of(code: Code) -> list[str]:
    """The corral names a piece of code mentions (and imports, for Python blocks)."""
    if code.lang in _OUTPUT:
        return []
    names = [
        match.group(0)
        for match in _NAME.finditer(code.text)
        if not _FILE_PARTS & set(match.group(0).replace(":", ".").split(".")[1:])
        and not _WIRE_NAME.match(match.group(0))
    ]
    if code.lang in ("python", "py"):
        try:
            tree = ast.parse(code.text)
        except SyntaxError:
            return names
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("corral"):
                names += [f"{node.module}:{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names += [a.name for a in node.names if a.name.startswith("corral.")]
    return names


@cache
def validate_checks() -> frozenset[str]:
    """The ids of ``corral validate``'s checks (``corral.snapshot``, ``runtime.action``):
    a page names them as dotted words too. Read from the source: each string literal a
    ``check(...)`` or ``Check(...)`` call in ``corral/cli/validate`` takes first."""
    ids: set[str] = set()
    for path in (SRC / "corral" / "cli" / "validate").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in ("check", "Check") and isinstance(first, ast.Constant):
                ids.add(str(first.value))
    return frozenset(ids)


def name_problems(code: Code) -> list[str]:
    return [
        f"{code.where}: `{name}` does not exist in src/corral"
        for name in dict.fromkeys(names_of(code))
        if name not in KNOWN and name not in validate_checks() and not name_exists(name)
    ]


# -- the tests ------------------------------------------------------------------------


def all_code() -> list[Code]:
    return [code for page in PAGES for code in code_of(page, page.read_text(encoding="utf-8"))]


def test_every_command_and_flag_the_pages_name_exists() -> None:
    problems = [problem for code in all_code() for problem in cli_problems(code)]
    assert not problems, "\n".join(problems)


def test_every_corral_name_the_pages_name_exists() -> None:
    problems = [problem for code in all_code() for problem in name_problems(code)]
    assert not problems, "\n".join(problems)


def test_the_pages_are_read_at_all() -> None:
    found = all_code()
    lines = [args for code in found for args in command_lines(code)]
    names = [name for code in found for name in names_of(code)]
    assert len(lines) > 30 and len(names) > 30, (len(lines), len(names))


PAGE = """\
Run `corral serve . --mcp` or `corral serve . --no-such-flag`, then `corral lint .`.

```bash
corral schema lock --lock x.json && corral schema nope --help && corral schema lock --check
corral eval X --policy llm \\
    --llm-url http://h/v1 --modle m
pip install 'corral[sb3]'   # not a command line
```

```python
from corral.adapters.mcp import mount_mcp, mount_everything
from corral.contract import Environment
import corral.adapters.gone
```

Names: `corral.adapters.sb3.RemoteVecEnv.from_url`, `corral.adapters.mcp.McpSessions.to_moon`,
`corral.envs.wordle:WordleEnv`, `corral.envs.wordle:Nope`, `corral.yaml`; the checks
`corral.snapshot` and `corral.snapshots`.
"""


@pytest.mark.parametrize(
    ("problem", "found"),
    [
        ("`corral serve` has no option --no-such-flag", True),
        ("`corral serve` has no option --mcp", False),
        ("`corral lint` is not a command", True),
        ("`corral schema nope` is not a command", True),
        ("`corral schema lock` has no option --check", True),
        ("`corral schema lock` has no option --lock", False),
        ("`corral eval` has no option --modle", True),
        ("`corral eval` has no option --llm-url", False),
        ("`corral.adapters.mcp:mount_everything` does not exist", True),
        ("`corral.adapters.mcp:mount_mcp` does not exist", False),
        ("`corral.contract:Environment` does not exist", False),
        ("`corral.adapters.gone` does not exist", True),
        ("`corral.adapters.mcp.McpSessions.to_moon` does not exist", True),
        ("`corral.adapters.sb3.RemoteVecEnv.from_url` does not exist", False),
        ("`corral.envs.wordle:Nope` does not exist", True),
        ("`corral.envs.wordle:WordleEnv` does not exist", False),
        ("corral.yaml", False),
        ("`corral.snapshot` does not exist", False),  # a check of corral validate
        ("`corral.snapshots` does not exist", True),
    ],
)
def test_the_checker_finds_what_is_missing(problem: str, found: bool) -> None:
    page = ROOT / "docs" / "example.md"
    problems = [
        text for code in code_of(page, PAGE) for text in (*cli_problems(code), *name_problems(code))
    ]
    assert any(problem in text for text in problems) is found, problems
