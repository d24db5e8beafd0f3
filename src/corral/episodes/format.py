"""The lines of an episode file: one pydantic model per kind of JSONL line.

A file is a sequence of *segments*. Each starts with a header line (:class:`Header`)
saying which format, environment and contract the lines after it belong to; a file
written in one go has one segment, a resumed or concatenated one has several. After
the header come step lines (:class:`StepRecord`, one per ``reset`` or ``step``
request, failed ones included) and end lines (:class:`EpisodeEnd`, one per episode
once it is over), interleaved across the sessions that wrote them. Lines of one
episode share its ``episode`` id, unique within the segment.

Fields whose value is ``null`` may be left out. Unknown fields are kept when a line is
read and written back (a later minor revision may add some); an incompatible change
bumps the number in :data:`FORMAT`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from corral.contract.tasks import TaskRef
from corral.protocol.fields import clip

FORMAT_VERSION = 1
"""The version of the format this corral writes and the newest it reads."""
FORMAT = f"corral-episodes/{FORMAT_VERSION}"
"""The value of a header's ``format`` field."""

M = TypeVar("M", bound=BaseModel)

_FORMAT_RE = re.compile(r"corral-episodes/(\d+)")
_VERSION_DIGITS = 9
"""Digits a format version may have: more is no version any corral wrote (and Python
refuses to read a number of over 4,300 digits)."""

Outcome = Literal["terminated", "truncated", "failed", "abandoned", "incomplete"]
"""How an episode ended.

* ``terminated`` / ``truncated``: the environment ended it (Gymnasium's meanings);
* ``failed``: an error ended the session (``SESSION_LOST``, ``STEP_TIMEOUT``, ...);
* ``abandoned``: the recorder stopped it before the end (a new reset, the client closed);
* ``incomplete``: the file has no end line for it (the writer was killed); never written,
  only computed when reading.
"""

SESSION_ENDING_CODES = frozenset(
    {
        "SESSION_LOST",
        "UNKNOWN_SESSION",
        "STEP_TIMEOUT",
        "CONNECTION_LOST",
        "CLIENT_CLOSED",
        "FACTORY_ERROR",
        "CAPACITY_REACHED",
    }
)
"""Error codes after which the session (and so its episode) cannot go on."""


class _Line(BaseModel):
    # Unknown fields survive a read/write round trip, so a newer writer's additions
    # are not lost by an older tool that rewrites a file.
    model_config = ConfigDict(extra="allow")


class ErrorInfo(BaseModel):
    """A failed request, as the wire gave it: stable ``code``, ``message``, ``details``."""

    model_config = ConfigDict(extra="allow")

    code: str = Field(min_length=1)
    message: str = ""
    details: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, error: BaseException) -> ErrorInfo:
        """The record of ``error``: a :class:`~corral.errors.CorralError`'s code, else
        ``INTERNAL_ERROR`` with the exception's type and text."""
        code = getattr(error, "code", None)
        if isinstance(code, str) and code:
            message = getattr(error, "message", str(error))
            details = getattr(error, "details", None)
            return cls(
                code=code,
                message=str(message),
                details=_json_safe(details) if isinstance(details, dict) else {},
            )
        return cls(code="INTERNAL_ERROR", message=f"{type(error).__name__}: {error}")


class EnvInfo(BaseModel):
    """The environment a segment was recorded against (from the server's handshake).

    Attributes:
        name: the environment's name.
        contract_version: its contract's semantic version.
        fingerprint: the hash of its schemas (``sha256:...``); replay checks it.
        schemas: the JSON Schemas of ``action``, ``observation`` and ``state``, when the
            writer had them (lets a reader rebuild typed models without the server).
    """

    model_config = ConfigDict(extra="allow")

    name: str = ""
    contract_version: str | None = None
    fingerprint: str | None = None
    schemas: dict[str, dict[str, Any]] | None = None


class Header(_Line):
    """The first line of a segment.

    Attributes:
        format: :data:`FORMAT` (``corral-episodes/<version>``).
        created: when the segment was started (UTC).
        env: the environment and contract the lines belong to.
        source: who wrote it: ``client``, ``pool``, ``web``, ``eval``, ``replay``, ...
        url: the server the episodes ran on, when known.
        corral_version: the version of corral that wrote it.
        meta: free-form facts about the run (policy, command line, ...).
    """

    kind: Literal["header"] = "header"
    format: str = FORMAT
    created: datetime = Field(default_factory=lambda: datetime.now(UTC))
    env: EnvInfo = Field(default_factory=EnvInfo)
    source: str = ""
    url: str | None = None
    corral_version: str = Field(default_factory=lambda: _corral_version())
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        format_version(value)
        return value


_SHOWN_CHARS = 60
"""Characters of a bad ``format`` value an error quotes."""


def format_version(value: str) -> int:
    """The version number of a header's ``format`` value, one this corral reads.

    Raises:
        ValueError: not ``corral-episodes/<n>`` with ``1 <= n <= FORMAT_VERSION``: no
            version (``/0``, ``/01``, another name), or a newer one (upgrade corral).
    """
    shown = clip(value, _SHOWN_CHARS)
    match = _FORMAT_RE.fullmatch(value)
    digits = match[1] if match is not None else ""
    if not digits or digits.startswith("0"):
        raise ValueError(
            f"not an episode file: format {shown!r} is not {FORMAT!r} "
            "(versions are numbered from 1)"
        )
    if len(digits) > _VERSION_DIGITS or int(digits) > FORMAT_VERSION:
        raise ValueError(
            f"format {shown!r} was written by a newer corral; this one reads up to "
            f"{FORMAT!r} (upgrade corral)"
        )
    return int(digits)


class Lineage(BaseModel):
    """Where a forked episode branched off: its parent episode and the step it was at.

    Attributes:
        episode: the parent episode's id (in the same file, when both were recorded).
        session: the session that ran the parent.
        step: how many steps the parent had taken when it was forked.
    """

    model_config = ConfigDict(extra="allow")

    episode: str | None = None
    session: str | None = None
    step: int = Field(ge=0)


class StepRecord(_Line):
    """One ``reset`` or ``step`` request and its outcome.

    Attributes:
        episode: the episode's id (unique within the segment).
        session: the session that ran it (the server's id, or the recorder's label).
        index: the line's position in its episode: 0 for the reset, then 1, 2, ...
            (failed requests take an index too).
        op: ``reset`` or ``step``. A ``reset`` line with an ``action`` is a step that
            an auto-resetting environment answered with a new episode.
        seed / task / options: how the episode was started (repeated on every line
            so that each line stands alone; ``options`` only on the reset line).
        action: the action sent (JSON form of the Action model), for ``step``.
        observation: the observation returned (JSON form), or null when it failed.
        state: a snapshot of the environment's state after the request, if recorded.
        reward / reward_components / terminated / truncated: as the observation gave
            them, lifted out for readers that do not parse observations (JSON has no
            NaN or infinity: a value that is not a finite number is written as null).
        t: when the request was sent (Unix time, seconds).
        latency_s: how long its reply took, as the recorder measured it.
        error: the error the request got, when it failed.
        parent: on the first line of a forked episode, where it branched off
            (:class:`Lineage`).
    """

    kind: Literal["step"] = "step"
    episode: str = Field(min_length=1)
    session: str | None = None
    index: int = Field(ge=0)
    op: Literal["reset", "step"]
    seed: int | None = None
    task: TaskRef | None = None
    options: dict[str, Any] | None = None
    action: dict[str, Any] | None = None
    observation: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    reward: float | None = None
    reward_components: dict[str, float | None] = Field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    t: float = 0.0
    latency_s: float | None = Field(default=None, ge=0)
    error: ErrorInfo | None = None
    parent: Lineage | None = None

    @model_validator(mode="after")
    def _has_outcome(self) -> StepRecord:
        if self.observation is None and self.error is None:
            raise ValueError("a step line needs an observation or an error")
        if self.op == "step" and self.action is None:
            raise ValueError("a step line with op 'step' needs its action")
        return self

    @property
    def done(self) -> bool:
        """True when this request ended the episode."""
        return self.terminated or self.truncated

    def action_as(self, model: type[M]) -> M:
        """The action as an instance of ``model`` (validated in JSON mode, so bytes and
        arrays come back from their JSON forms).

        Raises:
            ValueError: the line has no action, or it does not fit ``model``.
        """
        return _typed(model, self.action, "action")

    def observation_as(self, model: type[M]) -> M:
        """The observation as an instance of ``model`` (see :meth:`action_as`).

        Raises:
            ValueError: the line has no observation, or it does not fit ``model``.
        """
        return _typed(model, self.observation, "observation")


class EpisodeEnd(_Line):
    """The last line of an episode: its outcome and totals.

    Attributes:
        episode / session / seed / task: as on its step lines.
        outcome: how it ended (see :data:`Outcome`).
        length: the number of ``step`` requests (the reset not counted).
        total_reward: the sum of the step rewards (``None`` rewards count 0; null when
            the sum is not a finite number).
        reward_components: each named component summed over the episode (null when
            the sum is not a finite number).
        success: whether the task was solved: the final observation's
            ``metadata["success"]`` when the environment gives one, else terminated with
            a positive final reward; null when the episode did not end.
        duration_s: from sending the reset to the last reply.
        error: the error that ended the episode (outcome ``failed``).
    """

    kind: Literal["end"] = "end"
    episode: str = Field(min_length=1)
    session: str | None = None
    seed: int | None = None
    task: TaskRef | None = None
    outcome: Outcome
    length: int = Field(default=0, ge=0)
    total_reward: float | None = 0.0
    reward_components: dict[str, float | None] = Field(default_factory=dict)
    success: bool | None = None
    duration_s: float | None = Field(default=None, ge=0)
    error: ErrorInfo | None = None


Line = Annotated[Header | StepRecord | EpisodeEnd, Field(discriminator="kind")]
"""Any line of an episode file."""

LINE: TypeAdapter[Header | StepRecord | EpisodeEnd] = TypeAdapter(Line)
"""Validates one line (``LINE.validate_json(raw)``)."""


def read_line(raw: bytes | str) -> Header | StepRecord | EpisodeEnd:
    """One line of a file as a reader takes it: :data:`LINE` validation, and a header
    must *name* its format (a missing ``format`` is no file of any version: the default
    a writer fills in is not a reader's guess).

    Raises:
        ValidationError: the line is not a valid line.
        ValueError: a header without ``format``.
    """
    line = LINE.validate_json(raw)
    if isinstance(line, Header) and "format" not in line.model_fields_set:
        raise ValueError(
            f"a header line must name its format ('format': {FORMAT!r}); this one has none"
        )
    return line


def dump_line(line: Header | StepRecord | EpisodeEnd) -> bytes:
    """One line of the file: compact JSON, null fields left out, ``\\n``-terminated."""
    return line.__pydantic_serializer__.to_json(line, exclude_none=True) + b"\n"


def line_schema() -> dict[str, Any]:
    """The JSON Schema of a line (for tools in other languages, e.g. the web UI)."""
    return LINE.json_schema()


def _typed(model: type[M], value: dict[str, Any] | None, what: str) -> M:
    if value is None:
        raise ValueError(f"this line has no {what}")
    return model.model_validate_json(orjson.dumps(value))


def _json_safe(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as plain JSON data (error details may hold tuples or odd objects)."""
    loaded: dict[str, Any] = orjson.loads(
        orjson.dumps(value, default=repr, option=orjson.OPT_NON_STR_KEYS)
    )
    return loaded


def _corral_version() -> str:
    from corral import __version__

    return __version__
