"""permessage-deflate (RFC 7692) for the native transport, with the inflated size bounded.

Sans-I/O (zlib only), here because the upgrade decision
(:func:`corral.protocol.upgrade.admit_upgrade`) negotiates it. picows exposes a frame's
``rsv1`` bit but does no compression, so corral negotiates the extension and compresses
itself with :mod:`zlib`. A compressed message is never inflated
past a bound chosen *before* inflating (``zlib``'s ``max_length``): a 16 KiB frame that
would inflate to gigabytes stops at the bound and is refused (issue 11.4).

The server accepts a client's offer with ``server_no_context_takeover``: each reply is
compressed on its own, so a connection holds no compressor between replies (a zlib
compressor holds ~256 KiB). Messages from the client may use context takeover (the
client's choice); the connection then keeps one decompressor (~44 KiB).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

EXTENSION = "permessage-deflate"
_TAIL = b"\x00\x00\xff\xff"


class InflateTooLarge(Exception):
    """A compressed message inflates past the bound (or is not valid deflate data)."""


@dataclass(frozen=True, slots=True)
class DeflateParams:
    """The agreed parameters of one connection's permessage-deflate."""

    client_no_context_takeover: bool = False
    server_max_window_bits: int = 15
    client_max_window_bits: int = 15

    def response(self) -> str:
        """The ``Sec-WebSocket-Extensions`` value of the server's answer."""
        parts = [EXTENSION, "server_no_context_takeover"]
        if self.client_no_context_takeover:
            parts.append("client_no_context_takeover")
        if self.server_max_window_bits != 15:
            parts.append(f"server_max_window_bits={self.server_max_window_bits}")
        if self.client_max_window_bits != 15:
            parts.append(f"client_max_window_bits={self.client_max_window_bits}")
        return "; ".join(parts)


def negotiate(offers: list[str]) -> DeflateParams | None:
    """The parameters to accept from ``Sec-WebSocket-Extensions`` header values, or None.

    Takes the first ``permessage-deflate`` offer whose parameters the server supports;
    an offer with unknown or malformed parameters is declined (RFC 7692 §5).
    """
    for header in offers:
        for offer in header.split(","):
            params = _parse(offer)
            if params is not None:
                return params
    return None


def _parse(offer: str) -> DeflateParams | None:
    name, *raw = (part.strip() for part in offer.split(";"))
    if name.lower() != EXTENSION:
        return None
    no_takeover = False
    server_bits = client_bits = 15
    seen: set[str] = set()
    for item in raw:
        key, _, value = item.partition("=")
        key, value = key.strip().lower(), value.strip().strip('"')
        if key in seen:
            return None
        seen.add(key)
        if key == "server_no_context_takeover" and not value:
            continue  # what the server does anyway
        if key == "client_no_context_takeover" and not value:
            no_takeover = True
        elif key == "server_max_window_bits":
            bits = _bits(value)
            if bits is None:
                return None
            server_bits = bits
        elif key == "client_max_window_bits":
            # Without a value the client only says it could honour a limit; none is set.
            if value:
                bits = _bits(value)
                if bits is None:
                    return None
                client_bits = bits
        else:
            return None
    return DeflateParams(no_takeover, server_bits, client_bits)


def _bits(value: str) -> int | None:
    # zlib cannot compress raw deflate with an 8-bit window: decline such offers.
    if not value.isdigit() or not 9 <= int(value) <= 15:
        return None
    return int(value)


class Deflater:
    """Compresses replies and inflates requests of one connection.

    Args:
        params: what the handshake agreed.
        max_size: the inflated size past which a message is refused.
        min_size: replies shorter than this are sent uncompressed (a per-message choice
            the extension allows); compressing a 100-byte reply costs more than it saves.
    """

    def __init__(self, params: DeflateParams, max_size: int, min_size: int = 1024) -> None:
        self.params = params
        self.max_size = max_size
        self.min_size = min_size
        self._inflater = zlib.decompressobj(-params.client_max_window_bits)

    def inflate(self, data: bytes) -> bytes:
        """The message ``data`` (the compressed payload of one message) carries.

        Raises:
            InflateTooLarge: the message inflates past :attr:`max_size`, or is not deflate
                data. The connection's decompressor is then unusable: close it.
        """
        try:
            out = self._inflater.decompress(data + _TAIL, self.max_size + 1)
        except zlib.error as exc:
            raise InflateTooLarge(f"invalid deflate data: {exc}") from None
        if len(out) > self.max_size or self._inflater.unconsumed_tail:
            raise InflateTooLarge(f"message inflates past {self.max_size} bytes")
        if self.params.client_no_context_takeover:
            self._inflater = zlib.decompressobj(-self.params.client_max_window_bits)
        return out

    def deflate(self, data: bytes) -> bytes | None:
        """``data`` compressed as one message, or None to send it as it is."""
        if len(data) < self.min_size:
            return None
        compressor = zlib.compressobj(6, zlib.DEFLATED, -self.params.server_max_window_bits)
        out = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
        return out[:-4] if out.endswith(_TAIL) else out
