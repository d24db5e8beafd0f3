"""EndpointSliceFleet: a fleet's ready Pods followed through its EndpointSlices (issue 29).

Against the emulated API (no API server runs here): the test plays the EndpointSlice
controller, writing slices as the control plane does when Pods turn ready, terminate or
go; the membership follows by its watch, under the ``fleet`` Role.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.providers.kubernetes.test_k8s_rbac import TRAINER, bind, granted, refusals
from tests.support.kube import Cluster, cluster

from corral.providers.kubernetes.membership import (
    ENDPOINT_SLICES,
    SERVICE_LABEL,
    EndpointSliceFleet,
    slice_urls,
)

SERVICE = "corral-echo-pods"


def endpoint_slice(name: str, *endpoints: tuple[str, bool | None, bool]) -> dict[str, Any]:
    """A slice of ``SERVICE`` with ``(address, ready, terminating)`` endpoints."""
    conditions = [
        {k: v for k, v in (("ready", ready), ("terminating", terminating)) if v is not None}
        for _, ready, terminating in endpoints
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {SERVICE_LABEL: SERVICE}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [address], "conditions": condition}
            for (address, _, _), condition in zip(endpoints, conditions, strict=True)
        ],
    }


def test_slice_urls_take_ready_endpoints_of_the_named_port() -> None:
    found = endpoint_slice(
        "s", ("10.0.0.1", True, False), ("10.0.0.2", False, False), ("10.0.0.3", None, False),
        ("10.0.0.4", True, True),
    )  # fmt: skip
    # Absent "ready" is ready (the API's rule); terminating Pods are leaving.
    assert slice_urls(found, "http", "http") == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    assert slice_urls(found, 8000, "https")[0] == "https://10.0.0.1:8000"
    assert slice_urls({**found, "ports": [{"name": "metrics", "port": 9}, {"name": "x"}]},
                      "http", "http") == []  # fmt: skip
    v6 = {**found, "endpoints": [{"addresses": ["fd00::1"], "conditions": {"ready": True}}]}
    assert slice_urls(v6, "http", "http") == ["http://[fd00::1]:8000"]


@pytest.fixture
async def rbac_kube() -> AsyncIterator[Cluster]:
    async with cluster(rbac=True) as running:
        running.emulator.resources["discovery.k8s.io/v1/endpointslices"] = {}
        yield running


async def until(members: EndpointSliceFleet, expected: list[str]) -> None:
    """Wait (bounded, on the membership's change event) until ``urls()`` is ``expected``."""

    async def wait() -> None:
        while await members.urls() != expected:
            members.changed.clear()
            if await members.urls() == expected:
                return
            await members.changed.wait()

    await asyncio.wait_for(wait(), 60)


async def test_members_follow_readiness_scale_up_and_down(
    rbac_kube: Cluster, tmp_path: Path
) -> None:
    kube = rbac_kube
    config = await bind(kube, "fleet", tmp_path)
    api = kube.api
    await api.create(ENDPOINT_SLICES, endpoint_slice("a", ("10.0.0.1", True, False)))
    await api.create(ENDPOINT_SLICES, {**endpoint_slice("other"), "metadata": {
        "name": "other", "labels": {SERVICE_LABEL: "another-service"}}})  # fmt: skip
    async with EndpointSliceFleet(SERVICE, kubeconfig=config) as members:
        assert await members.urls() == ["http://10.0.0.1:8000"]
        # Scale-up: a second Pod turns ready in a new slice.
        await api.create(ENDPOINT_SLICES, endpoint_slice("b", ("10.0.0.2", True, False)))
        await until(members, ["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
        # Scale-down: the first Pod drains (terminating), then its slice goes.
        await api.patch(ENDPOINT_SLICES, "a", endpoint_slice("a", ("10.0.0.1", False, True)))
        await until(members, ["http://10.0.0.2:8000"])
        await api.delete(ENDPOINT_SLICES, "a")
        await until(members, ["http://10.0.0.2:8000"])
        await api.patch(
            ENDPOINT_SLICES, "b",
            endpoint_slice("b", ("10.0.0.2", True, False), ("10.0.0.3", True, False)),
        )  # fmt: skip
        await until(members, ["http://10.0.0.2:8000", "http://10.0.0.3:8000"])
    assert refusals(kube.authorizer) == []
    assert kube.authorizer.needed(TRAINER) == granted("fleet")


async def test_a_refused_watch_is_raised(rbac_kube: Cluster, tmp_path: Path) -> None:
    config = await bind(rbac_kube, "pods", tmp_path)  # no endpointslices in this Role
    members = EndpointSliceFleet(SERVICE, kubeconfig=config)
    try:
        with pytest.raises(Exception, match="403"):
            await members.urls()
    finally:
        await members.close()
