"""Workspaces: a live one is never swept, a dead process's one is (tmpfs included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.sandbox import SandboxUnavailable, Workspace, resolve_profile
from corral.sandbox.workspace import sweep_stale

SWEEP = (
    "import sys\n"
    "from corral.sandbox.workspace import sweep_stale\n"
    "print(sweep_stale(sys.argv[1]))\n"
)
ABANDON = (
    "import os, sys\n"
    "from corral.sandbox import Workspace, resolve_profile\n"
    "w = Workspace(resolve_profile('auto'), (), sys.argv[1], max_disk_bytes=2**20)\n"
    "(w.host_workdir / 'kept').write_text('x')\n"
    "print(w.root, w.quota.kind, flush=True)\n"
    "os._exit(0)\n"
)


def test_a_live_workspace_is_not_swept_and_a_dead_one_is(tmp_path: Path) -> None:
    try:
        profile = resolve_profile("auto")
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    with Workspace(profile, (), str(tmp_path), max_disk_bytes=2**20) as live:
        # Another process's sweep: the owner holds the lock, so the workspace stays.
        other = subprocess.run(
            [sys.executable, "-c", SWEEP, str(tmp_path)], capture_output=True, text=True
        )
        assert other.stdout.strip() == "0", other.stderr
        assert (live.root / "work").is_dir()
        # A process that dies without closing its workspace leaves it (and its tmpfs).
        dead = subprocess.run(
            [sys.executable, "-c", ABANDON, str(tmp_path)], capture_output=True, text=True
        )
        root, kind = dead.stdout.split()
        assert (Path(root) / "work" / "kept").read_text() == "x"
        assert live.quota is not None and kind == live.quota.kind
        # This process swept tmp_path once already (with its first workspace there): sweep
        # again past the once-per-process cache, as the next server process would.
        assert sweep_stale.__wrapped__(str(tmp_path)) == 1
        assert not Path(root).exists() and live.root.exists()
        assert root not in Path("/proc/self/mounts").read_text()
    assert not live.root.exists()
