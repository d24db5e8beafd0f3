"""The private asyncio and signal hooks: one module, checked on every Python found here.

``corral.asyncio_compat`` names each interpreter internal corral uses once; nothing else
in ``src/`` touches one. Its ``self_check`` runs in this interpreter and, as a script
that imports nothing of corral, under every other supported CPython on the machine
(``python3.11`` ... ``python3.14`` on PATH): a Python that moved a hook fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corral import asyncio_compat

SRC = Path(__file__).resolve().parents[1] / "src" / "corral"
MODULE = SRC / "asyncio_compat.py"
SUPPORTED = ["3.11", "3.12", "3.13", "3.14"]
PYENV = Path.home() / ".pyenv" / "versions"
PRIVATE = re.compile(
    r"asyncio\._(?!_)\w+|from asyncio[.\w]* import .*\b_[a-z]|asyncio\.tasks\._|"
    r"\bimport _signal\b|\b_signal\.|_asyncio_future_blocking"
)
"""A private asyncio name (not a dunder such as ``__file__``), ``_signal``, the future
protocol's flag (a private name imported from an asyncio module counts)."""


def test_the_hooks_work_here() -> None:
    assert asyncio_compat.self_check() == [
        "running loop: read and set",
        "future protocol: a yielded future taken",
        "current task: entered and left",
        "SIGINT handler: read, set, called, restored",
    ]


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` on this machine that runs: this one, one on PATH,
    or one pyenv installed (its shims on PATH may point elsewhere)."""
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(p) for p in PYENV.glob(f"{version}.*/bin/python{version}"))
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_hooks_work_on_every_supported_python(version: str) -> None:
    python = find_python(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    done = subprocess.run(
        [python, "-I", str(MODULE)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "running loop: read and set",
        "future protocol: a yielded future taken",
        "current task: entered and left",
        "SIGINT handler: read, set, called, restored",
    ]


def test_no_other_module_touches_a_private_hook() -> None:
    found = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in SRC.rglob("*.py")
        if path != MODULE
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert found == [], "go through corral.asyncio_compat:\n" + "\n".join(found)
