"""``corral k8s gc``'s sweep: dead owners' objects go, live owners' stay."""

from __future__ import annotations

import time

from tests.support.kube import Cluster

from corral.providers.kubernetes.api import LEASES, PODS, SECRETS
from corral.providers.kubernetes.gc import lease_expired, lease_name, sweep
from corral.providers.kubernetes.owner import micro_time
from corral.providers.kubernetes.pods import MANAGED_BY, OWNER_LABEL, ROLE_LABEL


def lease(owner: str, renewed: float) -> dict[str, object]:
    return {
        "metadata": {
            "name": lease_name(owner),
            "labels": {MANAGED_BY: "corral", OWNER_LABEL: owner, ROLE_LABEL: "owner"},
        },
        "spec": {"leaseDurationSeconds": 60, "renewTime": micro_time(renewed)},
    }


def pod(name: str, owner: str) -> dict[str, object]:
    # An image the fake kubelet never runs: this test is about the objects only.
    return {
        "metadata": {"name": name, "labels": {MANAGED_BY: "corral", OWNER_LABEL: owner}},
        "spec": {"containers": [{"name": "server", "image": "unschedulable/x"}]},
    }


def names(kube: Cluster, plural: str) -> set[str]:
    return {o["metadata"]["name"] for o in kube.objects(plural)}


def test_lease_expiry() -> None:
    now = time.time()
    assert not lease_expired(lease("a", now), now)
    assert not lease_expired(lease("a", now - 80), now)  # within duration + skew
    assert lease_expired(lease("a", now - 100), now)
    assert lease_expired({"spec": {}}, now)


async def test_sweep_deletes_only_what_dead_owners_left(kube: Cluster) -> None:
    api = kube.api
    now = time.time()
    await api.create(LEASES, lease("dead", now - 3600))
    await api.create(LEASES, lease("live", now))
    for name, owner in [("p-dead", "dead"), ("p-live", "live"), ("p-orphan", "gone")]:
        await api.create(PODS, pod(name, owner))
    await api.create(
        SECRETS,
        {"metadata": {"name": "s-dead", "labels": {MANAGED_BY: "corral", OWNER_LABEL: "dead"}}},
    )
    # A dry run lists and deletes nothing.
    planned = await sweep(api, dry_run=True)
    assert set(planned.objects["pods"]) == {"p-dead", "p-orphan"}
    assert planned.objects["secrets"] == ["s-dead"]
    assert planned.objects["leases"] == [lease_name("dead")]
    assert planned.owners == ["dead", "gone"]
    assert names(kube, "pods") == {"p-dead", "p-live", "p-orphan"}

    swept = await sweep(api)
    assert swept.total == planned.total == 4
    assert names(kube, "pods") == {"p-live"}
    assert names(kube, "secrets") == set()
    assert names(kube, "leases") == {lease_name("live")}

    # One owner's sweep takes it even while its Lease is live (a provider's close).
    await sweep(api, owner="live")
    assert names(kube, "pods") == set() and names(kube, "leases") == set()
