"""Schema export, fingerprints and contract versions.

The fingerprint is a SHA-256 over the canonical JSON Schemas of Action, Observation and
State (and of the reset options and snapshot models, for environments that have them)
with annotation-only keywords (titles, descriptions, examples) removed: renaming a
docstring does not change it, adding, removing or retyping a field does.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson
from pydantic import BaseModel

SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$"
)

_ANNOTATION_KEYS = frozenset({"title", "description", "examples", "$comment"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "contains", "propertyNames")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def parse_semver(version: str) -> tuple[int, int, int]:
    """Return ``(major, minor, patch)`` of a semantic version string.

    Raises:
        ValueError: if ``version`` is not ``MAJOR.MINOR.PATCH[-pre][+build]``.
    """
    match = SEMVER.fullmatch(version)
    if match is None:
        raise ValueError(
            f"contract version {version!r} is not semantic (MAJOR.MINOR.PATCH, e.g. '1.0.0')"
        )
    return int(match[1]), int(match[2]), int(match[3])


def model_schemas(
    action: type[BaseModel], observation: type[BaseModel], state: type[BaseModel]
) -> dict[str, dict[str, Any]]:
    """The JSON Schemas of the three contract models, keyed ``action/observation/state``."""
    return {
        "action": action.model_json_schema(),
        "observation": observation.model_json_schema(),
        "state": state.model_json_schema(),
    }


def _strip(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ANNOTATION_KEYS:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _strip(sub) for name, sub in value.items()}
        elif key in _SCHEMA_VALUES or key in _SCHEMA_LISTS:
            out[key] = _strip(value)
        else:
            out[key] = value
    return out


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without its annotations (titles, descriptions, examples): what a client
    sends in its ``hello`` for the server to diff, at a fraction of the size."""
    stripped: dict[str, Any] = _strip(schema)
    return stripped


def canonical_schema(schema: dict[str, Any]) -> bytes:
    """Canonical bytes of a schema: annotations removed, keys sorted."""
    stripped = _strip(schema)
    try:
        return orjson.dumps(stripped, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # orjson stops at 64-bit integers; a default or bound may be larger. The stdlib
        # encoder writes the same compact form for every value orjson would have taken
        # but floats, and a schema always takes the same branch, so hashes stay stable.
        return json.dumps(
            stripped, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()


def fingerprint(schemas: dict[str, dict[str, Any]]) -> str:
    """A short, deterministic hash of the contract schemas (``sha256:`` + 16 hex digits)."""
    digest = hashlib.sha256()
    for name in sorted(schemas):
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(canonical_schema(schemas[name]))
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()[:16]


@dataclass(frozen=True)
class Contract:
    """What an environment promises on the wire: its models, version and fingerprint."""

    name: str
    version: str
    action: type[BaseModel]
    observation: type[BaseModel]
    state: type[BaseModel]
    reset_options: type[BaseModel] | None = None
    """The reset options' model (see :mod:`corral.contract.options`), if it has one."""
    snapshot: type[BaseModel] | None = None
    """The snapshot model (see :mod:`corral.contract.snapshot`), if it declares one."""

    @cached_property
    def schemas(self) -> dict[str, dict[str, Any]]:
        """The JSON Schemas of action, observation and state, and ``reset_options`` and
        ``snapshot`` when the environment has those models (only then: the fingerprint
        of a contract without them is the same as before they existed)."""
        schemas = model_schemas(self.action, self.observation, self.state)
        if self.reset_options is not None:
            schemas["reset_options"] = self.reset_options.model_json_schema()
        if self.snapshot is not None:
            schemas["snapshot"] = self.snapshot.model_json_schema()
        return schemas

    @cached_property
    def fingerprint(self) -> str:
        """The fingerprint of :attr:`schemas`."""
        return fingerprint(self.schemas)


def compatible(client_version: str, server_version: str) -> bool:
    """True when a client built for ``client_version`` can talk to ``server_version``.

    Semantic versioning: the same major version is compatible; a major change is not.
    """
    return parse_semver(client_version)[0] == parse_semver(server_version)[0]
