"""Server-side reading of frames, sans I/O: size limit, decoding, validation, gating.

:meth:`FrameReader.read` turns one frame into a typed request or raises the
:class:`~corral.errors.ProtocolError` to answer with; the error carries the request's id
(and session) whenever they could be read, so even a bad request gets a matched reply.
"""

from __future__ import annotations

from corral.errors import CorralError, FrameTooLarge, HandshakeRequired
from corral.protocol.codecs import Codec, Frame
from corral.protocol.messages import Hello, Request, parse_request, peek_id, peek_session


class FrameReader:
    """Reads the frames of one connection; the first request must be ``hello``."""

    def __init__(self, codec: Codec, max_frame_bytes: int) -> None:
        self.codec = codec
        self.max_frame_bytes = max_frame_bytes
        self.greeted = False
        self.session_hint: str | None = None
        """Session id of the last frame read, even if it failed to parse."""

    def read(self, frame: Frame) -> Request:
        """Parse one frame.

        Raises:
            CorralError: with a stable code, ``request_id`` set when it was readable.
        """
        self.session_hint = None
        size = len(frame)
        if size > self.max_frame_bytes:
            raise FrameTooLarge(
                f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes}",
                details={"size": size, "limit": self.max_frame_bytes},
            )
        message = self.codec.decode(frame)
        self.session_hint = peek_session(message)
        try:
            request = parse_request(message)
        except CorralError as exc:
            exc.request_id = peek_id(message)
            raise
        if not self.greeted and not isinstance(request, Hello):
            raise HandshakeRequired(
                "send 'hello' first", details={"type": request.type}, request_id=request.id
            )
        if isinstance(request, Hello):
            self.greeted = True
        return request
