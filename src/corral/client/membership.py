"""Who is in the fleet now: the servers a running pool may use, read again and again.

A pool built on a fixed list of URLs never learns that a server left (scale-down, a
rollout) or joined (scale-up). A *membership* answers one question, whenever the fleet
asks (:meth:`~corral.client.fleet.Fleet.refresh`, and at each health check)::

    async def urls(self) -> list[str]

Sources here: :class:`StaticMembership` (a list the caller changes: ``refresh()`` after
editing it) and :class:`DnsMembership` (a headless Service's DNS name, re-resolved: one
A/AAAA record per ready Pod). The Kubernetes provider adds an EndpointSlice watch with
the same method (:mod:`corral.providers.kubernetes`). Anything with that one coroutine
method fits.

What the fleet does with the answer: a new URL becomes a server that takes new and
re-homed sessions; a URL gone from the answer is a server *leaving*: its sessions move
at once (by snapshot or replay, see :mod:`corral.protocol.recovery`), never waiting for
it to time out.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit


@runtime_checkable
class Membership(Protocol):
    """A source of the fleet's server URLs (see the module docstring)."""

    async def urls(self) -> list[str]:
        """The URLs of the servers in the fleet now (an empty list is "unknown, keep
        what you have", never "every server left")."""
        ...


class StaticMembership:
    """A list of URLs, changed by the caller (then ``await fleet.refresh()``)."""

    def __init__(self, urls: Iterable[str]) -> None:
        self.members = list(urls)

    async def urls(self) -> list[str]:
        """The list as it is now."""
        return list(self.members)


class DnsMembership:
    """A headless Service (or any DNS name with one record per server), re-resolved.

    Args:
        url: ``http://name:port`` (``ws``/``https`` too): the name to resolve, the port
            and scheme every member shares.
        resolve: the resolver (``host, port`` → addresses); the loop's ``getaddrinfo``
            by default (tests give their own).
    """

    def __init__(
        self,
        url: str,
        resolve: _Resolver | None = None,
    ) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"DnsMembership needs scheme://name:port, got {url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self._resolve = resolve or _getaddrinfo

    async def urls(self) -> list[str]:
        """One URL per address the name resolves to now (sorted; empty when it does not
        resolve: the fleet keeps its servers rather than dropping them all)."""
        try:
            addresses = await self._resolve(self.host, self.port)
        except OSError:
            return []
        unique = sorted(set(addresses))
        return [f"{self.scheme}://{f'[{a}]' if ':' in a else a}:{self.port}" for a in unique]


class _Resolver(Protocol):
    async def __call__(self, host: str, port: int) -> list[str]: ...


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


__all__ = ["DnsMembership", "Membership", "StaticMembership"]
