"""The messages of ``corral/1``: one static table, both directions.

Every message is a map with a ``type`` and, for requests and their replies, an ``id``.
Requests name the session they address (``session``), so one connection carries many
sessions. A reply echoes the request's ``id``; replies may come out of order.

=====================  ==========================  ===========================
request (client →)     class                       reply (← server)
=====================  ==========================  ===========================
``hello``              :class:`Hello`              ``welcome`` :class:`Welcome`
``open``               :class:`Open`               ``opened`` :class:`Opened`
``attach``             :class:`Attach`             ``attached`` :class:`Attached`
``reset``              :class:`Reset`              ``result`` :class:`Result`
``step``               :class:`Step`               ``result`` :class:`Result`
``state``              :class:`GetState`           ``state`` :class:`StateReply`
``close``              :class:`Close`              ``closed`` :class:`Closed`
``snapshot``           :class:`TakeSnapshot`       ``snapshot`` :class:`SnapshotReply`
``restore``            :class:`Restore`            ``restored`` :class:`Restored`
``reset_batch``        :class:`~.batch.ResetBatch` ``batch`` :class:`~.batch.BatchReply`
``step_batch``         :class:`~.batch.StepBatch`  ``batch`` :class:`~.batch.BatchReply`
any                                                ``error`` :class:`ErrorReply`
=====================  ==========================  ===========================

Rules every peer can rely on: a request id names one request of a session; re-sending
the same request (same kind, equal payload) under it is answered from the server's
reply cache, any other request under it is ``REQUEST_ID_REUSED``. A ``reset``, ``step``,
``reset_batch`` or ``step_batch`` may carry ``"acked": true``: the client holds the reply
of every earlier (lower-id) request of each session it names, so the server forgets those
replies at once instead of keeping a session's last few (see
:meth:`corral.protocol.session.ReplyCache.forget_before`); it still knows they were
answered, and a request of that session under a lower id is ``REQUEST_ID_REUSED``
(never run twice). A reward (and each
reward component) is a finite number on every codec, or the step is ``BAD_OBSERVATION``
(JSON has no NaN or infinity). ``hello`` may carry the client's ``max_frame_bytes``; a
reply larger than that is ``REPLY_TOO_LARGE`` instead. Error replies echo what they
quote of a request bounded (:func:`corral.protocol.fields.echo`). ``restore`` is not a
request of a session: like ``open`` it opens one (and takes a slot), from a
:class:`~corral.protocol.snapshot.SessionSnapshot`, answering with the new session's
id, token and the observation of the restored state.

Each type is a dataclass that the client builds and the server parses (and the other
way round for replies), with one way out, ``to_wire()`` (the map a codec encodes), and
one way in, ``from_wire(map)``, which is strict about types and raises a
:class:`~corral.errors.ProtocolError` with a stable code, so that no malformed value ever
reaches an environment. :data:`REQUESTS` and :data:`REPLIES` are the whole table; they
are read-only, so nothing joins them as a side effect of an import.

The classes are plain ``slots`` dataclasses, not frozen ones and not pydantic models:
they are built and read once per message on the hot path, where a frozen dataclass
costs twice as much to build. Treat them as immutable.

One module of ~700 lines because it is one table: each class is a row of it, read and
written by the same field readers (:mod:`corral.protocol.fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Self

from corral.contract.tasks import TaskRef, task_ref
from corral.errors import BadMessage, CorralError, InvalidArgument, UnknownType, error_from_wire
from corral.protocol import fields as f
from corral.protocol.batch import BatchReply, ResetBatch, StepBatch
from corral.protocol.codecs import PROTOCOL
from corral.protocol.snapshot import SessionSnapshot


@dataclass(frozen=True, slots=True)
class ContractRef:
    """A side's view of the contract: version, fingerprint and, optionally, the schemas
    (annotations stripped) for the server to diff when the fingerprints differ."""

    version: str
    fingerprint: str | None = None
    schemas: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The ``contract`` map of a ``hello`` (``schemas`` only when there are some)."""
        msg: dict[str, Any] = {"version": self.version, "fingerprint": self.fingerprint}
        if self.schemas is not None:
            msg["schemas"] = self.schemas
        return msg

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> ContractRef:
        """Read a ``contract`` map; ``schemas``, when sent, maps model names to maps."""
        schemas = f.optional(msg, "schemas", dict)
        if schemas is not None and not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in schemas.items()
        ):
            raise BadMessage(
                "field 'contract.schemas' of 'hello' must map model names to JSON Schemas",
                details={"field": "contract.schemas"},
            )
        return cls(f.required(msg, "version", str), f.optional(msg, "fingerprint", str), schemas)


# -- requests (client → server) ----------------------------------------------------


@dataclass(slots=True)
class _SessionMessage:
    """The shape of a message that is just a request id and a session id."""

    type: ClassVar[str]
    id: int
    session: str

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id, "session": self.session}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Self:
        """Read the message."""
        return cls(f.request_id(msg), f.required(msg, "session", str))


@dataclass(slots=True)
class _TokenMessage:
    """The shape of a message that names a session and its resume token."""

    type: ClassVar[str]
    id: int
    session: str
    token: str

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id, "session": self.session, "token": self.token}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Self:
        """Read the message."""
        return cls(
            f.request_id(msg), f.required(msg, "session", str), f.required(msg, "token", str)
        )


@dataclass(slots=True)
class Hello:
    """Opens the connection: protocol version, the client's contract, wanted extras.

    ``max_frame_bytes`` is the largest frame the client takes: the server answers a
    reply larger than that with ``REPLY_TOO_LARGE`` instead of a frame the client's
    socket would refuse (and drop the connection over).
    """

    type: ClassVar[str] = "hello"
    id: int
    protocol: str = PROTOCOL
    client: str = ""
    contract: ContractRef | None = None
    want_schemas: bool = False
    max_frame_bytes: int | None = None
    notices: bool = False
    """The client reads the server's notices (``going_away``); a client that does not
    say so never gets one (an older client would take it for a broken reply)."""

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map (``contract`` only when there is one)."""
        msg: dict[str, Any] = {
            "type": self.type,
            "id": self.id,
            "protocol": self.protocol,
            "client": self.client,
            "schemas": self.want_schemas,
        }
        if self.contract is not None:
            msg["contract"] = self.contract.to_wire()
        if self.max_frame_bytes is not None:
            msg["max_frame_bytes"] = self.max_frame_bytes
        if self.notices:
            msg["notices"] = True
        return msg

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Hello:
        """Read a ``hello``; ``max_frame_bytes``, when sent, is a positive integer."""
        contract = f.optional(msg, "contract", dict)
        ref = None if contract is None else ContractRef.from_wire(contract)
        limit = f.optional(msg, "max_frame_bytes", int)
        if limit is not None and not 1 <= limit <= f.MAX_ID:
            raise BadMessage(
                "field 'max_frame_bytes' of 'hello' must be a positive integer",
                details={"field": "max_frame_bytes"},
            )
        return cls(
            id=f.request_id(msg),
            protocol=f.required(msg, "protocol", str),
            client=f.optional(msg, "client", str) or "",
            contract=ref,
            want_schemas=bool(f.optional(msg, "schemas", bool)),
            max_frame_bytes=limit,
            notices=bool(f.optional(msg, "notices", bool)),
        )


@dataclass(slots=True)
class Open:
    """Creates a session (a fresh environment instance)."""

    type: ClassVar[str] = "open"
    id: int

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Open:
        """Read an ``open``."""
        return cls(f.request_id(msg))


@dataclass(slots=True)
class Attach(_TokenMessage):
    """Re-attaches this connection to a live session after a reconnect."""

    type: ClassVar[str] = "attach"


@dataclass(slots=True)
class Reset:
    """Starts a new episode of a session, of task ``task`` when given.

    ``task`` travels as ``{"split": str, "index": int}`` and only when set, so a reset
    without one reads the same to a server that predates it. The server resolves it
    through the environment's tasks face and hands it to ``reset`` as the ``split`` and
    ``index`` options.
    """

    type: ClassVar[str] = "reset"
    id: int
    session: str
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    task: TaskRef | None = None
    acked: bool = False
    """The client holds every earlier reply of the session (see the module docstring);
    set by :meth:`corral.protocol.client.ClientProtocol.send`."""

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        wire = {
            "type": self.type,
            "id": self.id,
            "session": self.session,
            "seed": self.seed,
            "options": self.options,
        }
        if self.task is not None:
            wire["task"] = {"split": self.task.split, "index": self.task.index}
        if self.acked:
            wire["acked"] = True
        return wire

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Reset:
        """Read a ``reset``; a seed outside 0..2**63-1 or a malformed task address is
        ``INVALID_ARGUMENT``."""
        seed = f.seed(msg)
        raw = f.optional(msg, "task", dict)
        task = None
        if raw is not None:
            task = task_ref(raw.get("split"), raw.get("index"))
            if task is None:
                raise InvalidArgument(
                    "a reset's task is {split: str, index: int >= 0}, got an empty map"
                )
        return cls(
            f.request_id(msg),
            f.required(msg, "session", str),
            seed,
            f.optional(msg, "options", dict) or {},
            task,
            msg.get("acked") is True,
        )


@dataclass(slots=True)
class Step:
    """Applies one action (a wire object, validated by the server's Action model)."""

    type: ClassVar[str] = "step"
    id: int
    session: str
    action: Any
    acked: bool = False
    """As :attr:`Reset.acked`."""

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        wire = {"type": self.type, "id": self.id, "session": self.session, "action": self.action}
        if self.acked:
            wire["acked"] = True
        return wire

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Step:
        """Read a ``step`` (the action may be anything, null included)."""
        action = f.present(msg, "action")
        acked = msg.get("acked") is True
        return cls(f.request_id(msg), f.required(msg, "session", str), action, acked)


@dataclass(slots=True)
class GetState(_SessionMessage):
    """Asks for the session's current state."""

    type: ClassVar[str] = "state"


@dataclass(slots=True)
class Close(_SessionMessage):
    """Ends a session and frees its slot."""

    type: ClassVar[str] = "close"


@dataclass(slots=True)
class TakeSnapshot(_SessionMessage):
    """Asks for a snapshot of the session (it is left as it was)."""

    type: ClassVar[str] = "snapshot"


@dataclass(slots=True)
class Restore:
    """Opens a new session in the state a snapshot captured (reserving a slot, as
    ``open`` does)."""

    type: ClassVar[str] = "restore"
    id: int
    snapshot: SessionSnapshot

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id, "snapshot": self.snapshot.to_wire()}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Restore:
        """Read a ``restore``: a missing snapshot is ``BAD_MESSAGE``, a malformed one
        ``BAD_SNAPSHOT``."""
        rid = f.request_id(msg)
        return cls(rid, SessionSnapshot.from_wire(f.present(msg, "snapshot")))


# -- replies (server → client) -----------------------------------------------------


@dataclass(slots=True)
class Welcome:
    """The reply to ``hello``: who the server is, its limits, how it treats the client."""

    type: ClassVar[str] = "welcome"
    id: int
    server: dict[str, Any]
    env: dict[str, Any]
    limits: dict[str, Any]
    compat: str
    schemas: dict[str, Any] | None = None
    protocol: str = PROTOCOL

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map (``schemas`` only when asked for)."""
        msg: dict[str, Any] = {
            "type": self.type,
            "id": self.id,
            "protocol": self.protocol,
            "server": self.server,
            "env": self.env,
            "limits": self.limits,
            "compat": self.compat,
        }
        if self.schemas is not None:
            msg["schemas"] = self.schemas
        return msg

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Welcome:
        """Read a ``welcome``."""
        return cls(
            id=f.request_id(msg),
            server=f.required(msg, "server", dict),
            env=f.required(msg, "env", dict),
            limits=f.required(msg, "limits", dict),
            compat=f.required(msg, "compat", str),
            schemas=f.optional(msg, "schemas", dict),
            protocol=f.required(msg, "protocol", str),
        )


@dataclass(slots=True)
class Opened(_TokenMessage):
    """The reply to ``open``: the new session's id and its resume token."""

    type: ClassVar[str] = "opened"


@dataclass(slots=True)
class Attached(_TokenMessage):
    """The reply to ``attach``: the session now answers on this connection."""

    type: ClassVar[str] = "attached"


@dataclass(slots=True)
class Result:
    """The reply to ``reset`` and ``step``: the observation's wire object."""

    type: ClassVar[str] = "result"
    id: int
    session: str
    observation: Any

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {
            "type": self.type,
            "id": self.id,
            "session": self.session,
            "observation": self.observation,
        }

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Result:
        """Read a ``result``."""
        observation = f.present(msg, "observation")
        return cls(f.request_id(msg), f.required(msg, "session", str), observation)


@dataclass(slots=True)
class StateReply:
    """The reply to ``state``: the state's wire object."""

    type: ClassVar[str] = "state"
    id: int
    session: str
    state: Any

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id, "session": self.session, "state": self.state}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> StateReply:
        """Read a ``state`` reply."""
        state = f.present(msg, "state")
        return cls(f.request_id(msg), f.required(msg, "session", str), state)


@dataclass(slots=True)
class Closed(_SessionMessage):
    """The reply to ``close``."""

    type: ClassVar[str] = "closed"


@dataclass(slots=True)
class SnapshotReply:
    """The reply to ``snapshot``: the session's :class:`SessionSnapshot`."""

    type: ClassVar[str] = "snapshot"
    id: int
    session: str
    snapshot: SessionSnapshot

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {
            "type": self.type,
            "id": self.id,
            "session": self.session,
            "snapshot": self.snapshot.to_wire(),
        }

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> SnapshotReply:
        """Read a ``snapshot`` reply (a malformed envelope is ``BAD_SNAPSHOT``)."""
        snapshot = SessionSnapshot.from_wire(f.present(msg, "snapshot"))
        return cls(f.request_id(msg), f.required(msg, "session", str), snapshot)


@dataclass(slots=True)
class Restored:
    """The reply to ``restore``: the new session's id and resume token, and the
    observation of the restored state."""

    type: ClassVar[str] = "restored"
    id: int
    session: str
    token: str
    observation: Any

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {
            "type": self.type,
            "id": self.id,
            "session": self.session,
            "token": self.token,
            "observation": self.observation,
        }

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Restored:
        """Read a ``restored`` reply."""
        observation = f.present(msg, "observation")
        return cls(
            f.request_id(msg),
            f.required(msg, "session", str),
            f.required(msg, "token", str),
            observation,
        )


@dataclass(slots=True)
class GoingAway:
    """A notice (answering no request, ``id`` null): the server drains and closes this
    connection within ``deadline_s`` seconds.

    Sent once per connection, only to a client whose ``hello`` asked for ``notices``.
    Until the deadline the server keeps serving the sessions it holds — steps, and
    ``snapshot`` so the client can move them — but opens and restores no new ones
    (``NOT_READY``); what is still open at the deadline is lost.

    Attributes:
        deadline_s: seconds from when it was sent until the server closes (>= 0).
        reason: why, for people (``"draining"``, ``"shutting down"``).
        server: the draining server's id.
    """

    type: ClassVar[str] = "going_away"
    deadline_s: float
    reason: str
    server: str
    id: None = None

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {
            "type": self.type,
            "id": None,
            "deadline_s": self.deadline_s,
            "reason": self.reason,
            "server": self.server,
        }

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> GoingAway:
        """Read a ``going_away`` notice (the deadline a number >= 0)."""
        deadline = f.required(msg, "deadline_s", (int, float))
        if isinstance(deadline, bool) or not 0 <= deadline < float("inf"):
            raise BadMessage(
                "field 'deadline_s' of 'going_away' must be a number >= 0",
                details={"field": "deadline_s"},
            )
        return cls(
            float(deadline),
            f.optional(msg, "reason", str) or "",
            f.required(msg, "server", str),
        )


@dataclass(slots=True)
class ErrorReply:
    """An error, in reply to any request: ``{code, message, details}``.

    ``id`` is None when the request's id was unreadable (or for a notice that answers
    no request); ``session`` names the session when the error concerns one.
    """

    type: ClassVar[str] = "error"
    id: int | None
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    session: str | None = None

    @classmethod
    def of(cls, error: CorralError, session: str | None = None) -> ErrorReply:
        """The reply carrying ``error`` (answering its ``request_id``), with what it echoes
        of the request bounded (:func:`~corral.protocol.fields.echo`)."""
        return cls(
            error.request_id,
            str(error.code),
            f.clip(error.message, f.MESSAGE_CHARS),
            f.echo(error.details),
            None if session is None else f.clip(session),
        )

    def exception(self) -> CorralError:
        """The exception this reply carries, as its code's class."""
        wire = {"code": self.code, "message": self.message, "details": self.details}
        return error_from_wire(wire, self.id)

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map (``session`` only when there is one)."""
        msg: dict[str, Any] = {
            "type": self.type,
            "id": self.id,
            "code": self.code,
            "message": self.message,
            "details": self.details,
        }
        if self.session is not None:
            msg["session"] = self.session
        return msg

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> ErrorReply:
        """Read an ``error``; a missing message reads as the code."""
        code: str = f.required(msg, "code", str)
        return cls(
            f.reply_id(msg),
            code,
            f.optional(msg, "message", str) or code,
            f.optional(msg, "details", dict) or {},
            f.optional(msg, "session", str),
        )


# -- the table -----------------------------------------------------------------------

Request = (
    Hello
    | Open
    | Attach
    | Reset
    | Step
    | GetState
    | Close
    | TakeSnapshot
    | Restore
    | ResetBatch
    | StepBatch
)
"""Any message a client sends."""
Reply = (
    Welcome
    | Opened
    | Attached
    | Result
    | StateReply
    | Closed
    | SnapshotReply
    | Restored
    | BatchReply
    | ErrorReply
    | GoingAway
)
"""Any message a server sends."""

RequestType = (
    type[Hello]
    | type[Open]
    | type[Attach]
    | type[Reset]
    | type[Step]
    | type[GetState]
    | type[Close]
    | type[TakeSnapshot]
    | type[Restore]
    | type[ResetBatch]
    | type[StepBatch]
)
ReplyType = (
    type[Welcome]
    | type[Opened]
    | type[Attached]
    | type[Result]
    | type[StateReply]
    | type[Closed]
    | type[SnapshotReply]
    | type[Restored]
    | type[BatchReply]
    | type[ErrorReply]
    | type[GoingAway]
)

_REQUEST_CLASSES: tuple[RequestType, ...] = (
    Hello,
    Open,
    Attach,
    Reset,
    Step,
    GetState,
    Close,
    TakeSnapshot,
    Restore,
    ResetBatch,
    StepBatch,
)
_REPLY_CLASSES: tuple[ReplyType, ...] = (
    Welcome,
    Opened,
    Attached,
    Result,
    StateReply,
    Closed,
    SnapshotReply,
    Restored,
    BatchReply,
    ErrorReply,
    GoingAway,
)

REQUESTS: Mapping[str, RequestType] = MappingProxyType({c.type: c for c in _REQUEST_CLASSES})
"""Every request type a client may send, by its ``type``."""
REPLIES: Mapping[str, ReplyType] = MappingProxyType({c.type: c for c in _REPLY_CLASSES})
"""Every reply type a server may send, by its ``type``."""


def _kind(msg: dict[str, Any]) -> str:
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise BadMessage("message has no string field 'type'", details={"field": "type"})
    return kind


def parse_request(msg: dict[str, Any]) -> Request:
    """Validate a decoded message and return the typed request.

    Raises:
        BadMessage: a field is missing or has the wrong type.
        InvalidArgument: a reset's seed is out of range.
        UnknownType: ``type`` is not a known request.
    """
    kind = _kind(msg)
    cls = REQUESTS.get(kind)
    if cls is None:
        raise UnknownType(
            f"unknown message type {kind!r}", details={"known": sorted(REQUESTS), "type": kind}
        )
    return cls.from_wire(msg)


def parse_reply(msg: dict[str, Any]) -> Reply:
    """Validate a decoded reply and return the typed reply (the client's side).

    Raises:
        BadMessage: a field is missing or has the wrong type.
        UnknownType: ``type`` is not a known reply.
    """
    kind = _kind(msg)
    cls = REPLIES.get(kind)
    if cls is None:
        raise UnknownType(
            f"unknown reply type {kind!r}", details={"known": sorted(REPLIES), "type": kind}
        )
    return cls.from_wire(msg)
