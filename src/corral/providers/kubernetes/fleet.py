"""The URLs of a fleet's Pods, for an ``EnvPool`` running in the same cluster.

``corral deploy k8s`` renders a headless Service (``<name>-pods``) next to the fleet's
Service: its DNS name resolves to the IP of every ready Pod. A trainer in the cluster
spreads its sessions over the Pods directly, one pool "server" per Pod::

    urls = fleet_urls("corral-echo-pods.rl.svc.cluster.local", 8000)
    async with EnvPool(1000, urls, env=EchoEnv) as pool:
        ...

(Through the fleet's ordinary Service or an Ingress, one URL reaches any Pod: fine for
single clients, but a pool's connections would land on Pods at random and a reconnect
could not find its sessions again.)
"""

from __future__ import annotations

import socket


def fleet_urls(host: str, port: int, *, scheme: str = "http") -> list[str]:
    """``scheme://IP:port`` for every address ``host`` resolves to, sorted.

    Raises:
        OSError: the name does not resolve (no ready Pod, or not in the cluster).
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = sorted({str(info[4][0]) for info in infos})
    return [f"{scheme}://[{a}]:{port}" if ":" in a else f"{scheme}://{a}:{port}" for a in addresses]
