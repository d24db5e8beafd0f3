"""Typed snapshots: an environment's full state as a model, to restore it elsewhere.

An environment MAY declare a snapshot of its state::

    class CounterSnapshot(Snapshot):
        count: int
        last: CounterObservation | None

    class Counter(Environment[Act, CounterObservation, State]):
        def snapshot(self) -> CounterSnapshot:            # the model is inferred from
            return CounterSnapshot(count=self.count, last=self.last)   # the annotation

        def restore(self, snapshot: CounterSnapshot) -> CounterObservation:
            self.count, self.last = snapshot.count, snapshot.last
            return self.last or CounterObservation()

``snapshot()`` returns the model; ``restore(snapshot)``, called on a fresh instance (the
factory's, never reset), rebuilds that state and returns the observation of the restored
state, as if the last ``reset``/``step`` had just returned it. Either may be ``async
def``, like ``reset``/``step``. ``snapshot()`` may be called in any phase of a session,
before its first reset included (then there is no episode to capture).

The model is a :class:`Snapshot` (unknown fields are refused) that can cross the wire
(:func:`~corral.contract.wiresafe.make_wire_safe`); it is declared with
``snapshot_type = MySnapshot`` or inferred from ``snapshot()``'s return annotation. Its
schema joins the contract's (``schemas["snapshot"]``): in the fingerprint, the lock file
and the lock diff, only for environments that declare one, so every other contract is
unchanged. A snapshot crosses the wire as the model's JSON form, never pickled.

:func:`snapshot_model` is the check :class:`~corral.contract.Environment` runs when a
subclass is defined: both methods or neither, and a model it can resolve.
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from corral.contract.models import WireModel
from corral.contract.wiresafe import make_wire_safe

SCHEMA_KEY = "snapshot"
"""The key of the snapshot model's schema in a contract's schemas (and its lock)."""


class Snapshot(WireModel):
    """Base of an environment's snapshot model: unknown fields are refused.

    Its JSON form, the one every snapshot crosses the wire in, keeps non-finite floats
    as the strings ``"NaN"``/``"Infinity"`` (JSON has no such numbers; ``null`` would
    not restore the same state).
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


def snapshot_model(
    cls: type, base_snapshot: Callable[..., Any], base_restore: Callable[..., Any]
) -> type[Snapshot] | None:
    """The snapshot model environment class ``cls`` declares, or None if it has none.

    ``base_snapshot``/``base_restore`` are the base class's methods: ``cls`` declares
    snapshots when it (or a parent) overrides both.

    Raises:
        TypeError: one method without the other; a ``snapshot_type`` without the
            methods; no resolvable model; a model that is not a :class:`Snapshot`; a
            ``restore`` whose parameter is not the model. The message names the class
            and the fix.
    """
    takes = getattr(cls, "snapshot", base_snapshot) is not base_snapshot
    gives = getattr(cls, "restore", base_restore) is not base_restore
    declared = cls.__dict__.get("snapshot_type")
    name = cls.__qualname__
    if takes != gives:
        have, lack = ("snapshot()", "restore()") if takes else ("restore()", "snapshot()")
        raise TypeError(
            f"{name} defines {have} but not {lack}: define both, snapshot(self) -> "
            "MySnapshot and restore(self, snapshot: MySnapshot) -> Observation (which "
            "rebuilds the state snapshot() captured), or neither"
        )
    if not takes:
        if declared is not None:
            raise TypeError(
                f"{name}.snapshot_type is {declared!r} but {name} defines no snapshot() "
                "and restore(): define both, or remove snapshot_type"
            )
        return None
    # Declared here, else inferred from the annotation, else the parent's model.
    model = declared
    if model is None:
        inferred = _annotated(cls, "snapshot", "return")
        model = inferred if inferred is not None else getattr(cls, "snapshot_type", None)
    if model is None:
        raise TypeError(
            f"{name} defines snapshot() and restore() but corral cannot tell the snapshot "
            f"model: annotate snapshot(self) -> MySnapshot, or set snapshot_type = MySnapshot "
            f"on {name} (MySnapshot a subclass of corral.contract.Snapshot)"
        )
    if not (isinstance(model, type) and issubclass(model, Snapshot)):
        raise TypeError(
            f"{name}'s snapshot model {model!r} is not a subclass of "
            "corral.contract.Snapshot: derive it from Snapshot (a pydantic model that "
            "refuses unknown fields)"
        )
    make_wire_safe(model)
    _check_restore(cls, name, model)
    return model


def _check_restore(cls: type, name: str, model: type[Snapshot]) -> None:
    """``restore`` takes one argument besides ``self``, annotated (if at all) with a type
    the model is."""
    try:
        params = list(inspect.signature(cls.restore).parameters.values())  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # pragma: no cover - a builtin or C method
        return
    positional = [
        p
        for p in params[1:]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) != 1 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise TypeError(
            f"{name}.restore must take exactly one argument besides self, the snapshot: "
            f"def restore(self, snapshot: {model.__name__}) -> Observation"
        )
    hint = _annotated(cls, "restore", positional[0].name) if positional else None
    if isinstance(hint, type) and issubclass(hint, BaseModel) and not issubclass(model, hint):
        raise TypeError(
            f"{name}.restore takes a {hint.__name__} but the snapshot model is "
            f"{model.__name__}: annotate it restore(self, snapshot: {model.__name__})"
        )


def _annotated(cls: type, method: str, name: str) -> Any:
    """The resolved annotation ``name`` of ``cls.<method>``, or None when absent or
    unresolvable (a forward reference to a name the module does not define)."""
    fn = getattr(cls, method)
    module = sys.modules.get(cls.__module__)
    localns = {**(vars(module) if module is not None else {}), cls.__name__: cls}
    try:
        hints = typing.get_type_hints(fn, localns=localns)
    except Exception:  # NameError, TypeError...: unresolvable, ask for snapshot_type
        return None
    return hints.get(name)


__all__ = ["SCHEMA_KEY", "Snapshot", "snapshot_model"]
