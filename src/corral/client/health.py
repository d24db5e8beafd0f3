"""Probing a server over HTTP: ``/health`` (it is alive) and ``/ready`` (it takes sessions).

The one probe used by the pool's fleet, the providers and :class:`LocalServer
<corral.client.local_server.LocalServer>`: a GET that counts as a yes only with HTTP 200
in time; a refused connection, a timeout or any other status is a no, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

HEALTH = "/health"
READY = "/ready"


def probe_client(
    headers: Mapping[str, str] | None = None, timeout: float = 2.0
) -> httpx.AsyncClient:
    """An HTTP client for probes (reuse it across a loop's probes); no proxies from the env."""
    return httpx.AsyncClient(timeout=timeout, trust_env=False, headers=dict(headers or {}))


async def answers(
    url: str,
    path: str = HEALTH,
    *,
    http: httpx.AsyncClient | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 2.0,
) -> bool:
    """True when ``GET url + path`` answers 200 (with ``http``, or a client of its own)."""
    if http is None:
        async with probe_client(headers, timeout) as own:
            return await answers(url, path, http=own)
    try:
        return (await http.get(f"{url}{path}")).status_code == 200
    except httpx.HTTPError:
        return False
