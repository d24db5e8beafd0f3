"""The client's dialers: one interface (:class:`Dialer`), chosen once per connection.

A connection asks its dialer for sockets and never which kind it got
(:mod:`corral.client.dialers.base`). The dialers:

* ``picows`` (:mod:`~corral.client.dialers.picows_socket`): the native transport, frames
  parsed in Cython and handed over from the loop's read callback;
* ``asyncio`` (:mod:`~corral.client.dialers.asyncio_socket`): corral's own RFC 6455 client
  (:mod:`~corral.client.dialers.wsframes`, sans-I/O) on asyncio's transports, for a loop
  that moves between threads (the blocking twins');
* ``websockets`` (:mod:`~corral.client.dialers.websockets_socket`): the library's client;
* ``auto`` (:class:`AutoDialer`, the default): picows when it is importable and the
  running loop stays on one thread, else asyncio;
* :mod:`corral.testing`'s in-process network: servers in this process, no socket.

:func:`dialer_for` turns a ``transport=`` name into its dialer (the httpx
``_transport_for_url`` school: choose once, then call through the interface).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from corral.blocking import moves_between_threads
from corral.client.dialers.asyncio_socket import asyncio_dialer
from corral.client.dialers.base import (
    Dialer,
    Inbox,
    OnClosed,
    OnFrame,
    Socket,
    SocketClosed,
    keep_alive,
)
from corral.client.dialers.websockets_socket import websockets_dialer

TRANSPORTS = ("auto", "picows", "asyncio", "websockets")
"""The client transports by name: ``auto`` is ``picows`` when it is importable and the
loop stays on one thread, else ``asyncio``."""


def picows_available() -> bool:
    """True when the native transport (``picows``) can be imported."""
    try:
        import picows  # noqa: F401
    except ImportError:
        return False
    return True


def _picows() -> Dialer:
    """The native dialer (imported on first use: picows is a compiled extension)."""
    from corral.client.dialers.picows_socket import picows_dialer

    return picows_dialer


class AutoDialer(Dialer):
    """The native dialer on a loop that stays on one thread, else the asyncio one.

    The choice waits for the loop (a client is often built before it runs, and a blocking
    twin's loop moves between threads), and is this dialer's alone.
    """

    name = "auto"

    async def open(
        self,
        url: str,
        subprotocol: str | None,
        headers: Mapping[str, str],
        timeout: float,
        max_size: int,
    ) -> Socket:
        """A socket to ``url`` on the dialer this loop takes (see :meth:`Dialer.open`)."""
        one_thread = not moves_between_threads(asyncio.get_running_loop())
        dialer = _picows() if one_thread and picows_available() else asyncio_dialer
        return await dialer.open(url, subprotocol, headers, timeout, max_size)


auto_dialer = AutoDialer()
"""The default dialer (``transport="auto"``)."""


def dialer_for(transport: str = "auto") -> Dialer:
    """The dialer of ``transport`` (one of :data:`TRANSPORTS`).

    Raises:
        ValueError: an unknown transport, or ``picows`` asked for but not installed.
    """
    if transport == "auto":
        return auto_dialer
    if transport == "asyncio":
        return asyncio_dialer
    if transport == "websockets":
        return websockets_dialer
    if transport == "picows":
        try:
            return _picows()
        except ImportError as exc:
            raise ValueError(
                "transport='picows' needs the picows package: pip install picows"
            ) from exc
    raise ValueError(f"unknown transport {transport!r}; use one of {', '.join(TRANSPORTS)}")


__all__ = [
    "TRANSPORTS",
    "AutoDialer",
    "Dialer",
    "Inbox",
    "OnClosed",
    "OnFrame",
    "Socket",
    "SocketClosed",
    "auto_dialer",
    "dialer_for",
    "keep_alive",
    "picows_available",
]
