"""The pod-deletion-cost keeper against the emulated API: real servers in the fake
kubelet's Pods, the keeper under its own Role (``deletion-cost``: list and patch of Pods)
reading each server's ``/ready`` (issue 29: scale-down prefers idle Pods)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.providers.kubernetes.test_k8s_provider import provider_for
from tests.providers.kubernetes.test_k8s_rbac import TRAINER, bind, granted, refusals
from tests.support.kube import Cluster, cluster

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoEnv
from corral.providers.kubernetes.deletion_cost import ANNOTATION, DeletionCostKeeper

SELECTOR = "app.kubernetes.io/name=corral-echo"


def costs(kube: Cluster) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(ANNOTATION)
        for p in kube.objects("pods")
    }


async def test_costs_follow_active_sessions(tmp_path: Path, echo_env_dir: Path) -> None:
    async with cluster(rbac=True) as kube, provider_for(kube) as provider:
        busy, idle = [await provider.start(echo_env_dir) for _ in range(2)]
        config = await bind(kube, "deletion-cost", tmp_path)
        keeper = DeletionCostKeeper(SELECTOR, kubeconfig=config)
        first = AsyncEnvClient(busy.url, env=EchoEnv)
        second = AsyncEnvClient(busy.url, env=EchoEnv)
        try:
            for client in (first, second):
                await client.connect()
                await client.reset()
            assert await keeper.sync_once() == {busy.pod: 2, idle.pod: 0}
            assert costs(kube) == {busy.pod: "2", idle.pod: "0"}
            # Nothing changed: no write.
            assert await keeper.sync_once() == {}
            await second.close()
            assert await keeper.sync_once() == {busy.pod: 1}
            assert costs(kube)[busy.pod] == "1"
            await first.close()
            # The command: one round, as the Role's user.
            command = [sys.executable, "-m", "corral", "k8s", "deletion-cost", "--once",
                       "--selector", SELECTOR, "--kubeconfig", config]  # fmt: skip
            done = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
            out = (await asyncio.wait_for(done.communicate(), 120))[0].decode()
            assert done.returncode == 0 and out.strip() == f"{busy.pod}: 0"
        finally:
            await first.close()
            await second.close()
            await keeper.close()
        assert refusals(kube.authorizer) == []
        assert kube.authorizer.needed(TRAINER) == granted("deletion-cost")
