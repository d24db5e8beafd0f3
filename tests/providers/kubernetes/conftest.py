"""Fixtures of the Kubernetes tests: an emulated cluster with a kubelet (tests/support/kube.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("kubernetes_asyncio", reason="needs the kubernetes extra")
pytest.importorskip("kmock", reason="needs kmock (the test extra)")

from tests.support.kube import Cluster, cluster


@pytest.fixture
async def kube() -> AsyncIterator[Cluster]:
    """A fresh emulated cluster whose kubelet runs Pods as local processes."""
    async with cluster() as running:
        yield running
