"""``$ref`` in JSON Schemas: one reader, one rule, a guard against cycles.

Every place that walks a schema (model rebuilding, the lock diff, examples, the random
policy, the TRL and Gymnasium adapters) follows references through
:class:`SchemaReader`, so a reference means the same thing everywhere:

* a reference is a JSON Pointer into the same document: ``#`` (the root) or ``#/a/b``,
  with RFC 6901 escapes (``~1`` is ``/``, ``~0`` is ``~``), URI percent-escapes, and
  array indices; anything else (another document, an ``$anchor``) does not resolve;
* a node's other keywords beside ``$ref`` (JSON Schema 2020-12 allows them) are applied
  over the target's: ``{"$ref": "#/$defs/N", "description": "d"}`` is ``N`` with that
  description;
* a chain of references is followed to a node that is not one; a chain that comes back
  to a reference it already followed is a cycle, and raises :class:`RefError` instead of
  recursing forever (``{"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}``).

Recursive *models* (a tree whose children are trees) are no cycle: each reference leads
to an object with properties, and walkers guard their own depth.

The test vectors in ``tests/contract/schema_ref_vectors.json`` pin the rule; the web UI's
JavaScript reader is meant to pass the same file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from corral.errors import UsageError


class RefError(UsageError, ValueError):
    """A ``$ref`` that does not resolve, or a cycle of references (a schema corral was
    given cannot be used: a ``UsageError``, and a ``ValueError`` as before).

    Attributes:
        ref: the reference at fault.
        kind: ``"unresolvable"`` or ``"cycle"``.
    """

    def __init__(self, message: str, *, ref: str, kind: str) -> None:
        super().__init__(message, details={"ref": ref, "kind": kind})
        self.ref = ref
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Resolved:
    """A node with its references followed.

    Attributes:
        node: the node reached, the referring nodes' other keywords applied over it.
        name: the last segment of the last reference followed (a ``$defs`` entry's
            name: a model's class name), or None when none was (or it was ``#``).
    """

    node: Mapping[str, Any]
    name: str | None


def pointer_parts(ref: str) -> list[str] | None:
    """The unescaped segments of a same-document JSON Pointer reference, or None for a
    reference outside the document."""
    if ref == "#":
        return []
    if not ref.startswith("#/"):
        return None
    return [unquote(part).replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/")]


class SchemaReader:
    """The references of one JSON Schema document (see the module docstring).

    Args:
        document: the whole schema (its ``$defs``, ``definitions``...).
    """

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document

    @classmethod
    def of_defs(cls, defs: Mapping[str, Any]) -> SchemaReader:
        """A reader of ``#/$defs/...`` references when only the ``$defs`` are at hand."""
        return cls({"$defs": defs})

    def target(self, ref: str) -> Mapping[str, Any]:
        """The node ``ref`` points at (its own references not followed).

        Raises:
            RefError: it points outside the document, or at nothing (or not at a schema).
        """
        parts = pointer_parts(ref)
        if parts is None:
            raise RefError(
                f"cannot resolve {ref!r}: only references into the same document "
                "('#/...') are followed",
                ref=ref,
                kind="unresolvable",
            )
        node: Any = self.document
        for part in parts:
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                node = None
                break
        if not isinstance(node, Mapping):
            raise RefError(
                f"cannot resolve {ref!r}: the schema has nothing there",
                ref=ref,
                kind="unresolvable",
            )
        return node

    def resolve(self, node: Mapping[str, Any]) -> Resolved:
        """Follow ``node``'s chain of references (see the module docstring).

        Raises:
            RefError: a reference does not resolve, or the chain is a cycle.
        """
        name: str | None = None
        followed: list[str] = []
        while "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str):
                raise RefError(
                    f"'$ref' must be a string, got {type(ref).__name__}",
                    ref=repr(ref),
                    kind="unresolvable",
                )
            if ref in followed:
                chain = " -> ".join([*followed, ref])
                raise RefError(
                    f"the references {chain} form a cycle: they never reach a schema",
                    ref=ref,
                    kind="cycle",
                )
            followed.append(ref)
            target = self.target(ref)
            parts = pointer_parts(ref) or []
            name = parts[-1] if parts else None
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            node = {**target, **siblings} if siblings else target
        return Resolved(node, name)

    def deref(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        """:meth:`resolve`'s node.

        Raises:
            RefError: as :meth:`resolve`.
        """
        return self.resolve(node).node


__all__ = ["RefError", "Resolved", "SchemaReader", "pointer_parts"]
