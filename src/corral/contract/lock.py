"""The schema lock file: what a contract looked like when its author last locked it.

An environment commits ``corral.lock.json``: its contract version, fingerprint and the
JSON Schemas of Action, Observation and State. In CI, the current models are compared
against it (:func:`check_lock`, using :mod:`corral.contract.diff`): breaking changes
fail unless the contract's major version was bumped for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.contract.diff import MODELS, OPTIONAL_MODELS, Change, diff_schemas
from corral.contract.schema import Contract, fingerprint, parse_semver
from corral.errors import UsageError

LOCK_FORMAT = 1
"""Version of the lock file layout (the ``corral_lock`` key)."""


class LockError(UsageError, ValueError):
    """A schema lock file is missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class SchemaLock:
    """The content of a schema lock file.

    Attributes:
        name: the environment's name.
        contract_version: the contract's semantic version when locked.
        fingerprint: the fingerprint of ``schemas``.
        schemas: the JSON Schemas keyed ``action``, ``observation``, ``state`` (and
            ``reset_options`` and ``snapshot`` when the environment has those models).
    """

    name: str
    contract_version: str
    fingerprint: str
    schemas: dict[str, dict[str, Any]]

    def to_json(self) -> str:
        """Canonical, diff-friendly text: sorted keys, two-space indent, final newline."""
        data = {
            "corral_lock": LOCK_FORMAT,
            "name": self.name,
            "contract_version": self.contract_version,
            "fingerprint": self.fingerprint,
            "schemas": self.schemas,
        }
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def lock_of(
    source: Contract | Mapping[str, Mapping[str, Any]],
    *,
    name: str | None = None,
    contract_version: str | None = None,
) -> SchemaLock:
    """Build the lock of a contract, or of a ``{"action", "observation", "state"}`` mapping.

    Args:
        source: the contract, or the three schemas.
        name: overrides the contract's name (a bare mapping has none: ``""``).
        contract_version: overrides the contract's version (default ``"1.0.0"`` for a mapping).

    Raises:
        LockError: a schema is missing from the mapping, or the version is not semver.
    """
    if isinstance(source, Contract):
        schemas = {k: dict(v) for k, v in source.schemas.items()}
        name = source.name if name is None else name
        contract_version = source.version if contract_version is None else contract_version
    else:
        missing = [m for m in MODELS if m not in source]
        if missing:
            raise LockError(f"schemas lack {', '.join(missing)}; pass all of {', '.join(MODELS)}")
        schemas = {m: dict(source[m]) for m in (*MODELS, *OPTIONAL_MODELS) if m in source}
    version = contract_version or "1.0.0"
    try:
        parse_semver(version)
    except ValueError as exc:
        raise LockError(str(exc)) from None
    # Round-trip through JSON so that what is fingerprinted is what is written.
    schemas = json.loads(json.dumps(schemas))
    return SchemaLock(
        name=name or "",
        contract_version=version,
        fingerprint=fingerprint(schemas),
        schemas=schemas,
    )


def write_lock(
    source: Contract | Mapping[str, Mapping[str, Any]],
    path: str | Path,
    *,
    name: str | None = None,
    contract_version: str | None = None,
) -> SchemaLock:
    """Write the lock file of ``source`` (see :func:`lock_of`) to ``path`` and return it."""
    lock = lock_of(source, name=name, contract_version=contract_version)
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(lock.to_json(), encoding="utf-8")
    tmp.replace(target)
    return lock


def read_lock(path: str | Path) -> SchemaLock:
    """Read and check a lock file.

    Raises:
        LockError: the file is missing, not JSON, lacks a key, or its fingerprint does
            not match its schemas (it was edited by hand); the message says how to fix it.
    """
    target = Path(path)
    regenerate = "regenerate it with 'corral schema lock'"
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LockError(
            f"{target}: no schema lock file; create it with 'corral schema lock'"
        ) from None
    except (OSError, ValueError) as exc:
        raise LockError(f"{target}: cannot read the lock file ({exc}); {regenerate}") from None
    if not isinstance(data, dict):
        raise LockError(f"{target}: not a lock file (top level is not an object); {regenerate}")
    if data.get("corral_lock") != LOCK_FORMAT:
        raise LockError(
            f"{target}: unknown lock format {data.get('corral_lock')!r} "
            f"(this corral reads {LOCK_FORMAT}); {regenerate}"
        )
    for key, kind in (("contract_version", str), ("fingerprint", str), ("schemas", dict)):
        if not isinstance(data.get(key), kind):
            raise LockError(f"{target}: '{key}' is missing or mistyped; {regenerate}")
    schemas = data["schemas"]
    missing = [m for m in MODELS if not isinstance(schemas.get(m), dict)]
    if missing:
        raise LockError(f"{target}: schemas lack {', '.join(missing)}; {regenerate}")
    actual = fingerprint(schemas)
    if actual != data["fingerprint"]:
        raise LockError(
            f"{target}: fingerprint {data['fingerprint']} does not match its schemas "
            f"({actual}); the file was edited by hand: {regenerate}"
        )
    return SchemaLock(
        name=str(data.get("name", "")),
        contract_version=data["contract_version"],
        fingerprint=data["fingerprint"],
        schemas={m: schemas[m] for m in (*MODELS, *OPTIONAL_MODELS) if m in schemas},
    )


@dataclass(frozen=True)
class LockCheck:
    """The result of comparing the current contract against its lock.

    Attributes:
        lock: the lock compared against.
        current: the current contract's lock (as ``corral schema lock`` would write it).
        changes: every difference.
        major_bumped: the current contract version's major is above the lock's, which
            declares breaking changes intended.
    """

    lock: SchemaLock
    current: SchemaLock
    changes: list[Change]
    major_bumped: bool

    @property
    def breaking(self) -> list[Change]:
        """The breaking changes."""
        return [c for c in self.changes if c.breaking]

    @property
    def ok(self) -> bool:
        """No breaking change, or the major version was bumped for them."""
        return not self.breaking or self.major_bumped

    @property
    def stale(self) -> bool:
        """The lock differs from the current contract (schemas or version)."""
        return (
            self.lock.fingerprint != self.current.fingerprint
            or self.lock.contract_version != self.current.contract_version
        )

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)


def check_lock(
    lock: SchemaLock, contract: Contract, *, tolerant_readers: bool = False
) -> LockCheck:
    """Compare ``contract`` against ``lock`` (see :func:`diff_schemas`)."""
    current = lock_of(contract)
    changes = diff_schemas(lock.schemas, current.schemas, tolerant_readers=tolerant_readers)
    try:
        bumped = parse_semver(current.contract_version)[0] > parse_semver(lock.contract_version)[0]
    except ValueError:
        bumped = False
    return LockCheck(lock=lock, current=current, changes=changes, major_bumped=bumped)
