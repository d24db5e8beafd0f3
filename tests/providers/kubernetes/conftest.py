"""Fixtures of the Kubernetes tests: an emulated cluster with a kubelet (tests/support/kube.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("kubernetes_asyncio", reason="needs the kubernetes extra")
pytest.importorskip("kmock", reason="needs kmock (the test extra)")

from tests.support.kube import Cluster, cluster


@pytest.fixture
async def kube() -> AsyncIterator[Cluster]:
    """A fresh emulated cluster whose kubelet runs Pods as local processes."""
    async with cluster() as running:
        yield running


@pytest.fixture
def crashing_env(tmp_path: Path) -> Path:
    """An environment whose entry point does not import: its server exits at start."""
    env = tmp_path / "crashing"
    env.mkdir()
    (env / "corral.yaml").write_text(
        "name: crashing\nentry_point: corral.envs.no_such_module:Env\n"
        "resources:\n  cpu: 0.5\n  memory: 256Mi\n"
    )
    return env
