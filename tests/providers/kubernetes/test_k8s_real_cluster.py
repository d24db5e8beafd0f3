"""Against a real cluster: skipped unless ``$KUBECONFIG`` and ``$CORRAL_K8S_IMAGE`` are set.

``CORRAL_K8S_IMAGE`` is an image the cluster can pull that has corral installed (e.g.
``corral build`` of an environment, pushed); the test serves corral's echo env in it::

    KUBECONFIG=~/.kube/config CORRAL_K8S_IMAGE=registry.example.com/corral-echo:0.1.0 \\
        python -m pytest -m k8s tests/providers/kubernetes
"""

from __future__ import annotations

import os

import pytest
from tests.providers.kubernetes.test_k8s_provider import echo_once

from corral.providers.kubernetes import KubernetesProvider

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(
        not (os.environ.get("KUBECONFIG") and os.environ.get("CORRAL_K8S_IMAGE")),
        reason="needs a real cluster: set KUBECONFIG and CORRAL_K8S_IMAGE",
    ),
]


async def test_a_real_pod_serves_echo() -> None:
    provider = KubernetesProvider(
        image=os.environ["CORRAL_K8S_IMAGE"],
        namespace=os.environ.get("CORRAL_K8S_NAMESPACE"),
        startup_timeout=600,
    )
    async with provider:
        endpoint = await provider.start("corral.envs.echo:EchoEnv")
        assert await echo_once(endpoint.url) == "hi"
        assert await provider.alive(endpoint)
