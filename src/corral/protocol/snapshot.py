"""A session's snapshot on the wire: the envelope, its signature, and the server's seal.

A ``snapshot`` request returns a :class:`SessionSnapshot`; a ``restore`` request carries
one back and opens a *new* session in the state it captured (on this server or another
of the fleet). The envelope holds, besides the environment's own snapshot (the model's
JSON form, :mod:`corral.contract.snapshot`), everything needed to check it and to
continue exactly where the session was::

    {"format": "corral-snapshot/1", "env": "wordle",
     "contract": {"version": "1.0.0", "fingerprint": "sha256:…"},
     "position": {"phase": "ready", "episodes": 1, "steps": 3, "episode_steps": 3},
     "snapshot": {…the env's model…}, "created_at": 1767225600.5,
     "sig": "hmac-sha256:…"}

The environment's part is always in JSON form (bytes as base64, arrays as
``{dtype, shape, data}``), whatever the codec that carried it, so one envelope restores
over either codec and its signature covers the same bytes everywhere.

**Signing.** With a fleet key (``ServerConfig.fleet_key``), the server signs every
envelope it makes: HMAC-SHA256 over :func:`canonical`, the envelope without ``sig``
as JSON with sorted keys and integral floats written as integers (so an envelope that
passed through a JavaScript client, which writes ``1.0`` as ``1``, still verifies), and
refuses to restore one that is unsigned or whose signature does not match
(``BAD_SNAPSHOT``). A snapshot carries the environment's whole state through the client;
signed, it cannot be forged or altered there. Without a key, envelopes are unsigned and
the snapshot model's validation is the only guard: a client can restore any state the
model admits.

:class:`SnapshotSeal` is the server's side, sans I/O: :meth:`~SnapshotSeal.seal` wraps
an environment's snapshot (size limit, signature), :meth:`~SnapshotSeal.open` checks an
envelope and returns the position and the validated model to restore.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from corral.contract.schema import compatible, parse_semver
from corral.errors import (
    BadObservation,
    BadSnapshot,
    ContractMismatch,
    SnapshotTooLarge,
    SnapshotUnsupported,
    validation_errors,
    validation_message,
)
from corral.protocol.position import Phase, Position

FORMAT = "corral-snapshot/1"
"""The envelope format this code writes and reads."""

SIGNATURE = "hmac-sha256:"
"""The prefix of a signature: its scheme."""

_EXACT = 2**53
"""Integral floats below this in magnitude are exact as integers in every JSON reader."""

_PHASES = {phase.value: phase for phase in (Phase.NEW, Phase.READY, Phase.ENDED)}


def _bad(message: str, field: str | None = None) -> BadSnapshot:
    return BadSnapshot(message, details={} if field is None else {"field": field})


def _read(obj: dict[str, Any], name: str, kind: type, where: str = "") -> Any:
    value = obj.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _bad(
            f"the snapshot's field {where}{name!r} must be {kind.__name__}, "
            f"got {type(value).__name__}",
            f"{where}{name}",
        )
    return value


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A session's snapshot as it crosses the wire (see the module docstring).

    Attributes:
        env: the environment's name.
        contract_version / fingerprint: the contract it was taken under.
        position: where the session was in its lifecycle.
        snapshot: the environment's snapshot model, in its JSON form. It holds the
            environment's whole state (a Wordle secret, say): never show it to a policy.
        created_at: when it was taken (Unix time, seconds).
        sig: its signature (``hmac-sha256:…``), when the server has a fleet key.
        format: the envelope format, :data:`FORMAT`.
    """

    env: str
    contract_version: str
    fingerprint: str
    position: Position
    snapshot: Any
    created_at: float
    sig: str | None = None
    format: str = FORMAT

    def to_wire(self) -> dict[str, Any]:
        """The envelope's wire map (``sig`` only when signed)."""
        wire = self._unsigned()
        if self.sig is not None:
            wire["sig"] = self.sig
        return wire

    def _unsigned(self) -> dict[str, Any]:
        position = self.position
        return {
            "format": self.format,
            "env": self.env,
            "contract": {"version": self.contract_version, "fingerprint": self.fingerprint},
            "position": {
                "phase": position.phase.value,
                "episodes": position.episodes,
                "steps": position.steps,
                "episode_steps": position.episode_steps,
            },
            "snapshot": self.snapshot,
            "created_at": self.created_at,
        }

    @classmethod
    def from_wire(cls, obj: Any) -> SessionSnapshot:
        """Read an envelope, strictly: every field present and of its type, a position a
        live session can have.

        Raises:
            BadSnapshot: naming the field at fault.
        """
        if not isinstance(obj, dict):
            raise _bad(f"a snapshot is a map (the 'snapshot' reply's), got {type(obj).__name__}")
        fmt = obj.get("format")
        if fmt != FORMAT:
            raise _bad(f"unknown snapshot format {fmt!r}: this server reads {FORMAT!r}", "format")
        contract = _read(obj, "contract", dict)
        raw = _read(obj, "position", dict)
        phase = _PHASES.get(raw.get("phase"))
        if phase is None:
            raise _bad(
                f"the snapshot's position.phase must be one of {sorted(_PHASES)}, "
                f"got {raw.get('phase')!r}",
                "position.phase",
            )
        position = Position(
            phase,
            _read(raw, "episodes", int, "position."),
            _read(raw, "steps", int, "position."),
            _read(raw, "episode_steps", int, "position."),
        )
        problem = position.problem()
        if problem is not None:
            raise _bad(f"the snapshot's position is impossible: {problem}", "position")
        if "snapshot" not in obj:
            raise _bad("the snapshot has no field 'snapshot' (the environment's state)", "snapshot")
        created = obj.get("created_at")
        if not isinstance(created, int | float) or isinstance(created, bool):
            raise _bad("the snapshot's field 'created_at' must be a number", "created_at")
        sig = obj.get("sig")
        if sig is not None and not isinstance(sig, str):
            raise _bad("the snapshot's field 'sig' must be a string", "sig")
        return cls(
            env=_read(obj, "env", str),
            contract_version=_read(contract, "version", str, "contract."),
            fingerprint=_read(contract, "fingerprint", str, "contract."),
            position=position,
            snapshot=obj["snapshot"],
            created_at=float(created),
            sig=sig,
        )

    def canonical(self) -> bytes:
        """The bytes its signature covers (see the module docstring).

        Raises:
            BadSnapshot: it holds a value JSON cannot carry.
        """
        try:
            return orjson.dumps(_normal(self._unsigned()), option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise _bad(f"the snapshot holds a value JSON cannot carry: {exc}") from None


def _normal(value: Any) -> Any:
    """``value`` with integral floats as integers (the canonical form's one rewrite)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < _EXACT else value
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def signature(canonical: bytes, key: bytes) -> str:
    """The signature of an envelope's :meth:`~SessionSnapshot.canonical` bytes."""
    return SIGNATURE + hmac.new(key, canonical, hashlib.sha256).hexdigest()


def unsupported(env: str) -> SnapshotUnsupported:
    """The error for a snapshot or restore of environment ``env``, which declares none."""
    return SnapshotUnsupported(
        f"{env} declares no snapshot: to support snapshot/restore (and fork), define "
        "snapshot(self) -> MySnapshot and restore(self, snapshot: MySnapshot) -> "
        "Observation on the environment class, MySnapshot a corral.contract.Snapshot "
        "(see docs/snapshots.md)",
        details={"env": env},
    )


class SnapshotSeal:
    """Seals a server's snapshots and opens the ones it is asked to restore (sans I/O).

    Args:
        env: the environment's name.
        contract_version / fingerprint: the served contract.
        model: the snapshot model (None: the environment declares none).
        key: the fleet key that signs envelopes (None: unsigned).
        max_bytes: the largest envelope (its canonical bytes) taken or restored.
    """

    def __init__(
        self,
        *,
        env: str,
        contract_version: str,
        fingerprint: str,
        model: type[BaseModel] | None,
        key: bytes | None,
        max_bytes: int,
    ) -> None:
        self.env = env
        self.contract_version = contract_version
        self.fingerprint = fingerprint
        self.model = model
        self.key = key
        self.max_bytes = max_bytes

    @property
    def supported(self) -> bool:
        """True when the environment declares a snapshot model."""
        return self.model is not None

    def unsupported(self) -> SnapshotUnsupported:
        """The refusal of a snapshot or restore when :attr:`supported` is False."""
        return unsupported(self.env)

    def seal(self, position: Position, value: Any, created_at: float) -> SessionSnapshot:
        """The envelope of ``value``, what the environment's ``snapshot()`` returned, for
        a session at ``position``; signed when there is a key.

        Raises:
            BadObservation: ``value`` is not the snapshot model, or not JSON-able.
            SnapshotTooLarge: the envelope exceeds :attr:`max_bytes`.
        """
        model = self.model
        if model is None:
            raise self.unsupported()
        if not isinstance(value, model):
            raise BadObservation(
                f"{self.env}.snapshot() returned {type(value).__name__}, not {model.__name__}",
                details={"returned": type(value).__name__},
            )
        try:
            wire = value.model_dump(mode="json")
        except Exception as exc:
            raise BadObservation(
                f"the snapshot could not be serialized: {exc}", details={"model": model.__name__}
            ) from None
        envelope = SessionSnapshot(
            self.env, self.contract_version, self.fingerprint, position, wire, created_at
        )
        try:
            canonical = envelope.canonical()
        except BadSnapshot as exc:
            raise BadObservation(
                f"{self.env}.snapshot() {exc.message.removeprefix('the snapshot ')}",
                details={"model": model.__name__},
            ) from None
        self._check_size(len(canonical))
        if self.key is None:
            return envelope
        return dataclasses.replace(envelope, sig=signature(canonical, self.key))

    def _check_size(self, size: int) -> None:
        if size > self.max_bytes:
            raise SnapshotTooLarge(
                f"the snapshot of {size} bytes exceeds the server's max_snapshot_bytes "
                f"of {self.max_bytes}",
                details={"size": size, "limit": self.max_bytes},
            )

    def open(self, envelope: SessionSnapshot) -> tuple[Position, BaseModel]:
        """Check ``envelope`` for a restore; return its position and validated model.

        Raises:
            SnapshotUnsupported: the environment declares no snapshot.
            SnapshotTooLarge: the envelope exceeds :attr:`max_bytes`.
            BadSnapshot: unsigned or badly signed (with a key), of another environment,
                or failing the snapshot model under the same contract.
            ContractMismatch: taken under an incompatible contract (another major
                version, or a fingerprint whose snapshot this model refuses).
        """
        model = self.model
        if model is None:
            raise self.unsupported()
        canonical = envelope.canonical()
        self._check_size(len(canonical))
        if self.key is not None:
            if envelope.sig is None:
                raise _bad(
                    "the snapshot is not signed and this server restores only signed ones "
                    "(it has a fleet key): restore a snapshot one of its fleet took",
                    "sig",
                )
            expected = signature(canonical, self.key)
            if not hmac.compare_digest(envelope.sig.encode(), expected.encode()):
                raise _bad(
                    "the snapshot's signature does not match: it was altered after it was "
                    "taken, or signed with another fleet key",
                    "sig",
                )
        if envelope.env != self.env:
            raise _bad(
                f"the snapshot is of environment {envelope.env!r}, this server serves {self.env!r}",
                "env",
            )
        theirs = envelope.contract_version
        try:
            parse_semver(theirs)
        except ValueError as exc:
            raise _bad(str(exc), "contract.version") from None
        details = {
            "snapshot_version": theirs,
            "snapshot_fingerprint": envelope.fingerprint,
            "server_version": self.contract_version,
            "server_fingerprint": self.fingerprint,
        }
        if not compatible(theirs, self.contract_version):
            raise ContractMismatch(
                f"the snapshot was taken under contract {theirs}, this server serves "
                f"{self.contract_version}: another major version cannot restore it",
                details=details,
            )
        try:
            restored = model.model_validate_json(orjson.dumps(envelope.snapshot))
        except (ValidationError, ValueError, TypeError, orjson.JSONEncodeError) as exc:
            errors = validation_errors(exc) if isinstance(exc, ValidationError) else []
            what = (
                validation_message(f"invalid {model.__name__}", exc)
                if isinstance(exc, ValidationError)
                else f"invalid {model.__name__}: {exc}"
            )
            if envelope.fingerprint != self.fingerprint:
                raise ContractMismatch(
                    f"the snapshot was taken under contract {theirs} "
                    f"({envelope.fingerprint}) and this server's {model.__name__} "
                    f"({self.fingerprint}) refuses it: {what}",
                    details={**details, "errors": errors},
                ) from None
            raise BadSnapshot(what, details={"errors": errors}) from None
        return envelope.position, restored


__all__ = [
    "FORMAT",
    "SIGNATURE",
    "SessionSnapshot",
    "SnapshotSeal",
    "signature",
    "unsupported",
]
