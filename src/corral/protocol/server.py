"""Server-side reading of frames, sans I/O: size limit, decoding, validation.

:meth:`FrameReader.read` turns one frame into a typed request or raises the
:class:`~corral.errors.ProtocolError` to answer with; the error carries the request's id
(and session) whenever they could be read, so even a bad request gets a matched reply.
"""

from __future__ import annotations

import contextlib

from corral.errors import CorralError, FrameTooLarge
from corral.protocol.codecs import Codec, Frame
from corral.protocol.fields import peek_id, peek_session
from corral.protocol.messages import Request, parse_request


class FrameReader:
    """Reads the frames of one connection into typed requests."""

    def __init__(self, codec: Codec, max_frame_bytes: int) -> None:
        self.codec = codec
        self.max_frame_bytes = max_frame_bytes
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
            # The transport caps frames at twice the limit, so decoding one to find its
            # id is bounded; the reply then matches the request instead of leaving the
            # client waiting.
            error = FrameTooLarge(
                f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes}",
                details={"size": size, "limit": self.max_frame_bytes},
            )
            with contextlib.suppress(CorralError):
                message = self.codec.decode(frame)
                error.request_id = peek_id(message)
                self.session_hint = peek_session(message)
            raise error
        message = self.codec.decode(frame)
        self.session_hint = peek_session(message)
        try:
            request = parse_request(message)
        except CorralError as exc:
            exc.request_id = peek_id(message)
            raise
        return request
