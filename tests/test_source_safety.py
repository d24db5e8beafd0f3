"""corral never deserializes code: no pickle, marshal, eval or unsafe YAML anywhere in src/.

A frame from the network is decoded by msgpack or JSON into plain data and validated by
pydantic; nothing a peer sends can make the server (or the client) run code. This test
reads every module of the package and fails on any use of a module or call that could.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "corral"

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                  "jsonpickle", "joblib", "copyreg"}  # fmt: skip
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__"}
UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"}
UNSAFE_LOADERS = {"Loader", "UnsafeLoader", "FullLoader"}

# Running code is the point of these files; nothing here deserializes anything.
RUNS_AGENT_CODE = {
    # The sandbox worker: it execs the agent's action inside the sandbox
    # process (started as ``python -c``), never in the server.
    "corral/sandbox/_worker.py": {"compile()", "exec()"},
}


def findings(path: Path, root: Path) -> list[str]:
    """Every unsafe use in one source file, as ``file:line: what`` (relative to ``root``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    where = path.relative_to(root)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UNSAFE_MODULES:
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in UNSAFE_MODULES:
                found.append(f"{where}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in UNSAFE_BUILTINS:
                found.append(f"{where}:{node.lineno}: {func.id}()")
            elif isinstance(func, ast.Attribute):
                owner = func.value.id if isinstance(func.value, ast.Name) else ""
                if owner == "yaml" and func.attr in UNSAFE_YAML:
                    found.append(f"{where}:{node.lineno}: yaml.{func.attr}() (use safe_load)")
                if owner in {"np", "numpy"} and func.attr == "load":
                    for kw in node.keywords:
                        if kw.arg == "allow_pickle" and not (
                            isinstance(kw.value, ast.Constant) and kw.value.value is False
                        ):
                            found.append(f"{where}:{node.lineno}: numpy.load(allow_pickle=...)")
                if owner == "torch" and func.attr == "load":
                    found.append(f"{where}:{node.lineno}: torch.load() unpickles")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "yaml"
            and node.attr in UNSAFE_LOADERS
        ):
            found.append(f"{where}:{node.lineno}: yaml.{node.attr} (use SafeLoader)")
    return found


def test_scanner_catches_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom marshal import loads\nimport yaml\n"
        "eval('1')\nyaml.load(s, Loader=yaml.Loader)\nyaml.safe_load(s)\n"
        "import numpy as np\nnp.load(f, allow_pickle=True)\nnp.load(f)\n"
    )
    found = findings(bad, tmp_path)
    assert len(found) == 6, found  # safe_load and a plain np.load are fine


def test_no_unsafe_deserialization_in_src():
    sources = sorted(SRC.rglob("*.py"))
    assert len(sources) > 20
    problems = [
        line
        for path in sources
        for line in findings(path, SRC.parent)
        if line.split(": ", 1)[1] not in RUNS_AGENT_CODE.get(line.split(":", 1)[0], set())
    ]
    assert problems == [], "unsafe deserialization or code evaluation:\n" + "\n".join(problems)
