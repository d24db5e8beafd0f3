"""The stable error codes of corral and the exception raised for each.

Errors cross the wire as data: ``{"code", "message", "details", "request_id"}``. The
server builds them from :class:`ErrorCode`; the client turns each back into the
exception class registered for its code, so ``except StepTimeout:`` works the same
whether the step ran in-process or on a server across the world.

Codes are part of the protocol: once published, a code keeps its name and meaning.
New codes may be added; a client that meets a code it does not know raises the
plain :class:`CorralError` with that code.

The exceptions (each leaf has its own code; ``tests/test_errors.py`` holds this drawing
to the classes)::

    CorralError                   any corral failure: code, message, details, request_id
    ├── ProtocolError             the peer broke the protocol
    │   ├── BadFrame              BAD_FRAME
    │   ├── BadMessage            BAD_MESSAGE
    │   ├── UnknownType           UNKNOWN_TYPE
    │   ├── FrameTooLarge         FRAME_TOO_LARGE
    │   ├── BatchTooLarge         BATCH_TOO_LARGE
    │   ├── HandshakeRequired     HANDSHAKE_REQUIRED
    │   ├── UnsupportedProtocol   UNSUPPORTED_PROTOCOL
    │   └── RequestIdReused       REQUEST_ID_REUSED
    ├── ContractMismatch          CONTRACT_MISMATCH
    ├── Unauthorized              UNAUTHORIZED
    ├── Forbidden                 FORBIDDEN
    ├── SessionError              the session (or server) does not allow the request now
    │   ├── CapacityReached       CAPACITY_REACHED
    │   ├── NotReady              NOT_READY
    │   ├── TooManySessions       TOO_MANY_SESSIONS
    │   ├── TooManyConnections    TOO_MANY_CONNECTIONS
    │   ├── UnknownSession        UNKNOWN_SESSION
    │   ├── SessionLost           SESSION_LOST
    │   ├── SessionElsewhere      SESSION_ELSEWHERE
    │   ├── ResetRequired         RESET_REQUIRED
    │   ├── EpisodeEnded          EPISODE_ENDED
    │   └── SessionBusy           SESSION_BUSY
    ├── SnapshotError             a session's snapshot cannot be taken or restored
    │   ├── SnapshotUnsupported   SNAPSHOT_UNSUPPORTED
    │   ├── SnapshotTooLarge      SNAPSHOT_TOO_LARGE
    │   └── BadSnapshot           BAD_SNAPSHOT
    ├── EnvFailure                raised by or about the environment's own code
    │   ├── InvalidAction         INVALID_ACTION
    │   ├── InvalidArgument       INVALID_ARGUMENT (also a ValueError)
    │   ├── EnvError              ENV_ERROR
    │   ├── FactoryError          FACTORY_ERROR
    │   ├── BadObservation        BAD_OBSERVATION
    │   ├── ReplyTooLarge         REPLY_TOO_LARGE
    │   └── StepTimeout           STEP_TIMEOUT
    ├── InternalError             INTERNAL_ERROR
    ├── RequestTimeout            REQUEST_TIMEOUT (also a TimeoutError; client side)
    ├── ConnectionLost            CONNECTION_LOST (also a ConnectionError; client side)
    │   └── ServerStartError  a server did not start (CONNECTION_LOST; providers)
    ├── ClientClosed              CLIENT_CLOSED (client side)
    ├── UsageError                USAGE_ERROR (local: what corral was given cannot be used)
    └── PlatformError             PLATFORM_ERROR (local: what corral runs on failed)

The local families are raised where corral runs, never sent: their leaves live beside
the code that raises them and keep their Python-standard bases (``ManifestError`` is also a
``ValueError``, ``TargetError`` an ``ImportError``, ``HubUnreachable`` a ``ConnectionError``),
so ``except CorralError:`` catches everything corral raises. ``str()`` of a local error
is its message alone (what a person reads at a prompt); the code is ``exc.code``.

:func:`validation_errors` is the one way pydantic's validation errors go on the wire, and
:func:`validation_message` the one way they read in a message.
"""

from __future__ import annotations

import reprlib
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

if TYPE_CHECKING:
    from pydantic import ValidationError


class ErrorCode(StrEnum):
    """Every error code corral sends or raises, with what it means."""

    # The frame or message itself.
    BAD_FRAME = "BAD_FRAME"
    """The frame could not be decoded by the negotiated codec (not JSON / not msgpack);
    over HTTP, a body that is not strict JSON or not declared as JSON (400, 415)."""
    BAD_MESSAGE = "BAD_MESSAGE"
    """The frame decoded, but is not a valid message (missing or mistyped field)."""
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    """The message ``type`` is not one this protocol version knows (over HTTP: no route
    for this method and path, 404 or 405)."""
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    """The frame is larger than the server's ``max_frame_bytes``."""
    BATCH_TOO_LARGE = "BATCH_TOO_LARGE"
    """A batch message carries more items than the server's ``max_batch``."""
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    """A request re-uses the id of another request of the session (only a re-send of the
    same request, equal in kind and payload, is a replay of the remembered reply)."""

    # The connection and handshake.
    HANDSHAKE_REQUIRED = "HANDSHAKE_REQUIRED"
    """A request arrived before the ``hello`` handshake completed."""
    UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL"
    """The peer speaks a protocol version this side cannot."""
    CONTRACT_MISMATCH = "CONTRACT_MISMATCH"
    """Client and server models are incompatible (contract version or fingerprint)."""
    UNAUTHORIZED = "UNAUTHORIZED"
    """A bearer token is required and was missing or wrong."""
    FORBIDDEN = "FORBIDDEN"
    """The request came from a browser page of another origin, or names a host this
    server does not answer to (DNS rebinding); ``details["reason"]`` says which
    (``origin`` or ``host``) and ``details["fix"]`` how to allow it."""

    # Sessions and their lifecycle.
    CAPACITY_REACHED = "CAPACITY_REACHED"
    """The server holds its maximum number of sessions; retry later or elsewhere."""
    NOT_READY = "NOT_READY"
    """The server cannot serve new sessions now (``/ready`` says 503 with the reason, e.g.
    too many environment calls hung past the step timeout, or it drains: then
    ``details["draining"]`` is True); retry elsewhere."""
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
    """This client address holds the server's maximum of WebSocket connections."""
    TOO_MANY_SESSIONS = "TOO_MANY_SESSIONS"
    """This connection, or this client address (``details.scope`` is ``client``), holds
    its maximum number of sessions."""
    UNKNOWN_SESSION = "UNKNOWN_SESSION"
    """No session with that id exists on this connection."""
    SESSION_LOST = "SESSION_LOST"
    """The session existed but is gone (reaped, timed out, server restarted)."""
    SESSION_ELSEWHERE = "SESSION_ELSEWHERE"
    """The session lives on another server of the fleet: ``details["server"]`` is that
    server's id (reach it through the front door with the ``corral-server`` header, or at
    its own address) and attach there. Only said of a session id a server of the same
    fleet minted (see :mod:`corral.protocol.identity`); it reveals nothing of the session."""
    RESET_REQUIRED = "RESET_REQUIRED"
    """``step`` or ``state`` before the first ``reset`` of the session."""
    EPISODE_ENDED = "EPISODE_ENDED"
    """``step`` after the episode ended; call ``reset`` (or enable auto-reset)."""
    SESSION_BUSY = "SESSION_BUSY"
    """Another request of this session is still running (e.g. reset during a step)."""

    # Snapshots of sessions.
    SNAPSHOT_UNSUPPORTED = "SNAPSHOT_UNSUPPORTED"
    """The environment declares no snapshot (or the link carries none); the message says
    how to declare one."""
    SNAPSHOT_TOO_LARGE = "SNAPSHOT_TOO_LARGE"
    """The snapshot is larger than the server's ``max_snapshot_bytes``."""
    BAD_SNAPSHOT = "BAD_SNAPSHOT"
    """A snapshot to restore is malformed, of another environment, fails the snapshot
    model, or its signature is missing or wrong."""

    # The environment.
    INVALID_ACTION = "INVALID_ACTION"
    """The action failed validation against the environment's Action model."""
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    """A reset argument (seed, options) is invalid."""
    ENV_ERROR = "ENV_ERROR"
    """The environment raised while handling the request; the session stays usable."""
    FACTORY_ERROR = "FACTORY_ERROR"
    """The environment could not be created for a new session."""
    BAD_OBSERVATION = "BAD_OBSERVATION"
    """The environment returned something that is not its declared model, or a value
    the connection's codec cannot carry (a non-finite reward, an arbitrary object)."""
    REPLY_TOO_LARGE = "REPLY_TOO_LARGE"
    """The reply is larger than the frame limit the client announced in its ``hello``."""
    STEP_TIMEOUT = "STEP_TIMEOUT"
    """The environment overran the per-step timeout; the session is closed."""

    # Everything else.
    INTERNAL_ERROR = "INTERNAL_ERROR"
    """A bug in corral itself; the server stays up."""
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
    """Client side: no reply arrived within the request timeout."""
    CONNECTION_LOST = "CONNECTION_LOST"
    """Client side: the connection to the server failed or closed."""
    CLIENT_CLOSED = "CLIENT_CLOSED"
    """Client side: the client was used after ``close()``."""

    # Local errors: raised where corral runs, never sent.
    USAGE_ERROR = "USAGE_ERROR"
    """Local: what corral was given cannot be used (a target, a manifest, a schema lock,
    a model that is not wire-safe, an episode file, a run directory, a policy, a space)."""
    PLATFORM_ERROR = "PLATFORM_ERROR"
    """Local: what corral runs on failed or lacks a feature (an image build, a virtualenv,
    a sandbox, the Kubernetes API, a port-forward, the Hugging Face Hub)."""


class CorralError(Exception):
    """Base of every error corral raises; carries a stable ``code``.

    Attributes:
        code: the stable :class:`ErrorCode` value (a plain string if unknown).
        message: a human-readable explanation.
        details: structured extra data (validation errors, limits, ...).
        request_id: the request this error answers, when there is one.
    """

    code: ClassVar[str] = ErrorCode.INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        request_id: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}
        self.request_id = request_id
        if code is not None:
            self.code = code  # type: ignore[misc]  # an unknown code keeps its own name

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def to_wire(self) -> dict[str, Any]:
        """Return the error as the wire-level dict ``{code, message, details}``."""
        return {"code": str(self.code), "message": self.message, "details": self.details}


class ProtocolError(CorralError):
    """The peer sent something that breaks the protocol."""


class BadFrame(ProtocolError):
    code = ErrorCode.BAD_FRAME


class BadMessage(ProtocolError):
    code = ErrorCode.BAD_MESSAGE


class UnknownType(ProtocolError):
    code = ErrorCode.UNKNOWN_TYPE


class FrameTooLarge(ProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class BatchTooLarge(ProtocolError):
    code = ErrorCode.BATCH_TOO_LARGE


class HandshakeRequired(ProtocolError):
    code = ErrorCode.HANDSHAKE_REQUIRED


class UnsupportedProtocol(ProtocolError):
    code = ErrorCode.UNSUPPORTED_PROTOCOL


class RequestIdReused(ProtocolError):
    code = ErrorCode.REQUEST_ID_REUSED


class ContractMismatch(CorralError):
    code = ErrorCode.CONTRACT_MISMATCH


class Unauthorized(CorralError):
    code = ErrorCode.UNAUTHORIZED


class Forbidden(CorralError):
    code = ErrorCode.FORBIDDEN


class SessionError(CorralError):
    """A request that the session's lifecycle does not allow now."""


class CapacityReached(SessionError):
    code = ErrorCode.CAPACITY_REACHED


class NotReady(SessionError):
    code = ErrorCode.NOT_READY


class TooManySessions(SessionError):
    code = ErrorCode.TOO_MANY_SESSIONS


class TooManyConnections(SessionError):
    code = ErrorCode.TOO_MANY_CONNECTIONS


class UnknownSession(SessionError):
    code = ErrorCode.UNKNOWN_SESSION


class SessionLost(SessionError):
    code = ErrorCode.SESSION_LOST


class SessionElsewhere(SessionError):
    code = ErrorCode.SESSION_ELSEWHERE


class ResetRequired(SessionError):
    code = ErrorCode.RESET_REQUIRED


class EpisodeEnded(SessionError):
    code = ErrorCode.EPISODE_ENDED


class SessionBusy(SessionError):
    code = ErrorCode.SESSION_BUSY


class SnapshotError(CorralError):
    """A session's snapshot cannot be taken or restored."""


class SnapshotUnsupported(SnapshotError):
    code = ErrorCode.SNAPSHOT_UNSUPPORTED


class SnapshotTooLarge(SnapshotError):
    code = ErrorCode.SNAPSHOT_TOO_LARGE


class BadSnapshot(SnapshotError):
    code = ErrorCode.BAD_SNAPSHOT


class EnvFailure(CorralError):
    """Errors raised by or about the environment's own code.

    When the server runs with ``debug`` its ``details["traceback"]`` holds the
    environment's traceback (a list of lines), which ``str()`` shows after the message.
    """

    def __str__(self) -> str:
        remote = self.details.get("traceback")
        if isinstance(remote, list) and remote:
            lines = "\n".join(str(line) for line in remote)
            return f"{super().__str__()}\n\nRemote traceback (on the server):\n{lines}"
        return super().__str__()


class InvalidAction(EnvFailure):
    code = ErrorCode.INVALID_ACTION


class InvalidArgument(EnvFailure, ValueError):
    """Also a ``ValueError``: environments raise it for bad reset options."""

    code = ErrorCode.INVALID_ARGUMENT


class EnvError(EnvFailure):
    code = ErrorCode.ENV_ERROR


class FactoryError(EnvFailure):
    code = ErrorCode.FACTORY_ERROR


class BadObservation(EnvFailure):
    code = ErrorCode.BAD_OBSERVATION


class ReplyTooLarge(EnvFailure):
    code = ErrorCode.REPLY_TOO_LARGE


class StepTimeout(EnvFailure):
    code = ErrorCode.STEP_TIMEOUT


class InternalError(CorralError):
    code = ErrorCode.INTERNAL_ERROR


class RequestTimeout(CorralError, TimeoutError):
    code = ErrorCode.REQUEST_TIMEOUT


class ConnectionLost(CorralError, ConnectionError):
    code = ErrorCode.CONNECTION_LOST


class ClientClosed(CorralError):
    code = ErrorCode.CLIENT_CLOSED


class UsageError(CorralError):
    """What corral was given cannot be used; the message says what to change."""

    code = ErrorCode.USAGE_ERROR

    def __str__(self) -> str:
        return self.message  # a local error reads as its message (module docstring)


class PlatformError(CorralError):
    """What corral runs on failed or lacks a feature; the message says which."""

    code = ErrorCode.PLATFORM_ERROR

    def __str__(self) -> str:
        return self.message  # a local error reads as its message (module docstring)


class ServerStartError(ConnectionLost):
    """A server (process, container) exited or never became ready.

    ``details['output']`` holds its last output lines when they could be read.
    """


def _exception_classes() -> dict[str, type[CorralError]]:
    table: dict[str, type[CorralError]] = {}
    pending: list[type[CorralError]] = [CorralError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "code" in cls.__dict__:
            table[str(cls.code)] = cls
    return table


EXCEPTIONS: dict[str, type[CorralError]] = _exception_classes()
"""Map from error code to the exception class raised for it."""


def error_from_wire(payload: dict[str, Any], request_id: int | None = None) -> CorralError:
    """Build the exception for a wire-level error dict ``{code, message, details}``."""
    code = str(payload.get("code", ErrorCode.INTERNAL_ERROR))
    cls = EXCEPTIONS.get(code, CorralError)
    details = payload.get("details")
    return cls(
        str(payload.get("message", code)),
        details=details if isinstance(details, dict) else {},
        request_id=request_id,
        code=None if cls.__dict__.get("code") == code else code,
    )


INPUT_LIMIT = 200
"""Bytes of an offending input an error echoes (as JSON), or characters of its repr."""


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 4, 160, 160
    return short


_SHORT = _short_repr()
_PLAIN_JSON = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def bounded_input(value: Any) -> Any:
    """An offending input as an error echoes it: as it came when it is plain JSON of at
    most :data:`INPUT_LIMIT` bytes, else a repr of at most :data:`INPUT_LIMIT` characters
    (bytes included: they never reach a JSON encoder)."""
    try:
        if len(orjson.dumps(value, option=_PLAIN_JSON)) <= INPUT_LIMIT:
            return value
    except (TypeError, orjson.JSONEncodeError):
        pass  # not plain JSON (bytes, arrays, objects): shown as a repr
    return _SHORT.repr(value)[:INPUT_LIMIT]


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors as wire-safe data: ``type``, ``loc``, ``msg`` and ``input``.

    The one rule for every error that carries them (``INVALID_ACTION``, OpenEnv's
    ``VALIDATION_ERROR``, JSON-RPC ``INVALID_PARAMS``): the offending input is echoed as it
    came when it is plain JSON of at most :data:`INPUT_LIMIT` bytes, else as a repr of at
    most :data:`INPUT_LIMIT` characters; no ``ctx`` (a custom validator's exception would
    not serialize) and no URLs. So nesting or size can never blow up an error reply.
    """
    out = []
    for err in exc.errors(include_url=False, include_context=False):
        item: dict[str, Any] = {"type": err["type"], "loc": list(err["loc"]), "msg": err["msg"]}
        if "input" in err:
            item["input"] = bounded_input(err["input"])
        out.append(item)
    return out


MESSAGE_ERRORS = 3
"""Field errors a validation message names (the rest are counted)."""
MESSAGE_ERROR_CHARS = 160
"""Characters of each field error a validation message shows."""


def validation_message(what: str, exc: ValidationError) -> str:
    """``what`` and pydantic's field errors in one bounded line, for a message a person
    or a model reads: ``invalid Guess: guess: String should have at most 5 characters``.

    At most :data:`MESSAGE_ERRORS` errors are named, each ``path: message`` cut to
    :data:`MESSAGE_ERROR_CHARS` characters; the full list stays in ``details``
    (:func:`validation_errors`).
    """
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    shown = []
    for err in errors[:MESSAGE_ERRORS]:
        path = ".".join(str(part) for part in err["loc"])
        text = f"{path}: {err['msg']}" if path else str(err["msg"])
        if len(text) > MESSAGE_ERROR_CHARS:
            text = text[: MESSAGE_ERROR_CHARS - 1] + "…"
        shown.append(text)
    more = len(errors) - len(shown)
    if more > 0:
        shown.append(f"and {more} more error(s)")
    return f"{what}: {'; '.join(shown)}" if shown else what
