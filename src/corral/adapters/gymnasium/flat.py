"""Flat spaces for learners that take one action space and one observation vector (SB3).

An Action with several fields is a ``Dict`` space (``row: int (0..2)`` and ``col: int
(0..2)`` give ``Dict(row: Discrete(3), col: Discrete(3))``), which Stable-Baselines3's
algorithms refuse, and a ``Discrete`` with a non-zero ``start`` (``int (1..6)``), which
they sample from 0. :class:`FlatActions` turns such a space into one they take, and
samples of that space back into samples of the original:

==========================================  ===========================================
the action space                            what the learner sees
==========================================  ===========================================
``Discrete(n, start)``                      ``Discrete(n)`` (``start`` added back)
``MultiDiscrete(nvec, start)``              ``MultiDiscrete(nvec)`` (``start`` added back)
``Dict``/``Tuple`` of integers only         ``MultiDiscrete`` of every leaf's ``n``, in order
``Dict``/``Tuple`` of ``Box`` only          one ``float32`` ``Box`` (Gymnasium's ``flatten_space``)
anything else                               itself
==========================================  ===========================================

A ``Dict`` mixing integers and floats has no flat form SB3 takes (it has no hybrid action
space): :class:`SpaceConversionError` says so, naming the fields.

Observations flatten with Gymnasium's own :func:`gymnasium.spaces.flatten_space` and
:func:`gymnasium.spaces.flatten` (what its ``FlattenObservation`` wrapper does; a
``Discrete`` becomes a one-hot block) into a ``float32`` ``Box``: :class:`FlatObservations`.
For one ``gymnasium.Env``, :class:`FlattenAction` is the action wrapper; Gymnasium's
``FlattenObservation`` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from corral.adapters.gymnasium.spaces import SpaceConversionError

_INTEGER = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


@dataclass
class _Leaf:
    """One integer leaf of a composite action: where its values sit in the flat sample."""

    path: tuple[str | int, ...]
    space: spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary
    offset: int
    size: int


@dataclass
class FlatActions:
    """An action space a learner takes, and the way back to the original's samples.

    Attributes:
        original: the action space of the environment.
        space: what the learner samples (see the module docstring).
    """

    original: spaces.Space[Any]
    space: spaces.Space[Any]
    _back: Callable[[Any], Any] = field(repr=False)

    @classmethod
    def of(cls, original: spaces.Space[Any]) -> FlatActions:
        """The flat form of ``original`` (itself when nothing needs flattening).

        Raises:
            SpaceConversionError: a composite space mixes integer and float leaves, or
                holds a leaf that has no flat form (text, sequences, unions).
        """
        if isinstance(original, spaces.Discrete):
            start = int(original.start)
            if start == 0:
                return cls.unchanged(original)
            return cls(original, spaces.Discrete(int(original.n)), lambda a: np.int64(a) + start)
        if isinstance(original, spaces.MultiDiscrete):
            if not np.any(original.start):
                return cls.unchanged(original)
            flat = spaces.MultiDiscrete(original.nvec, dtype=original.dtype)
            return cls(original, flat, lambda a: np.asarray(a, original.dtype) + original.start)
        if not isinstance(original, (spaces.Dict, spaces.Tuple)):
            return cls.unchanged(original)
        leaves = list(_leaves(original, ()))
        kinds = {isinstance(space, _INTEGER) for _, space in leaves}
        unsupported = [
            _name(path) for path, space in leaves if not isinstance(space, (*_INTEGER, spaces.Box))
        ]
        if unsupported:
            raise SpaceConversionError(
                f"the action's field(s) {unsupported} have no flat form a learner takes: use "
                "bounded integers (Discrete), fixed-shape float arrays or bounded floats (Box)"
            )
        if kinds == {True}:
            return cls._integers(original, leaves)
        if kinds == {False}:
            flat_box = _float32_box(spaces.flatten_space(original))
            return cls(original, flat_box, lambda a: spaces.unflatten(original, np.asarray(a)))
        integers = [_name(p) for p, s in leaves if isinstance(s, _INTEGER)]
        floats = [_name(p) for p, s in leaves if not isinstance(s, _INTEGER)]
        raise SpaceConversionError(
            f"the action mixes integer fields {integers} with float fields {floats}; "
            "Stable-Baselines3 has no action space for both (make them all integers, or all "
            "floats)"
        )

    @classmethod
    def unchanged(cls, original: spaces.Space[Any]) -> FlatActions:
        """``original`` as it is (samples pass through)."""
        return cls(original, original, _same)

    @classmethod
    def _integers(
        cls, original: spaces.Space[Any], found: list[tuple[tuple[str | int, ...], Any]]
    ) -> FlatActions:
        leaves: list[_Leaf] = []
        nvec: list[int] = []
        for path, space in found:
            sizes = _integer_sizes(space)
            leaves.append(_Leaf(path, space, len(nvec), len(sizes)))
            nvec.extend(sizes)
        flat = spaces.MultiDiscrete(np.array(nvec, dtype=np.int64))

        def back(sample: Any) -> Any:
            values = np.asarray(sample, dtype=np.int64).reshape(-1)
            out: Any = _empty(original)
            for leaf in leaves:
                _put(out, leaf.path, _integer_value(leaf.space, values[leaf.offset :][: leaf.size]))
            return _frozen(out)

        return cls(original, flat, back)

    def to_original(self, sample: Any) -> Any:
        """The sample of :attr:`original` for a sample of :attr:`space`."""
        return self._back(sample)

    @property
    def identity(self) -> bool:
        """Nothing is flattened: samples pass as they are."""
        return self.space is self.original


@dataclass
class FlatObservations:
    """An observation space as one ``float32`` ``Box`` (Gymnasium's ``flatten_space``).

    Attributes:
        original: the observation space of the environment (a ``Dict`` or ``Tuple``).
        space: the flat ``Box``.
    """

    original: spaces.Space[Any]
    space: spaces.Box

    @classmethod
    def of(cls, original: spaces.Space[Any]) -> FlatObservations | None:
        """The flat form of a ``Dict``/``Tuple`` space (None for any other space, which a
        learner takes as it is).

        Raises:
            SpaceConversionError: a field has no flat form (a ``Sequence`` or a union).
        """
        if not isinstance(original, (spaces.Dict, spaces.Tuple)):
            return None
        bad = [
            _name(path)
            for path, space in _leaves(original, ())
            if isinstance(space, (spaces.Sequence, spaces.OneOf, spaces.Graph))
        ]
        if bad:
            raise SpaceConversionError(
                f"the observation's field(s) {bad} have no fixed-size flat form; leave them "
                "out (observation_fields=[...]) or keep the Dict (flatten=False, with SB3's "
                "MultiInputPolicy)"
            )
        return cls(original, _float32_box(spaces.flatten_space(original)))

    def flatten(self, sample: Any) -> np.ndarray[Any, Any]:
        """One observation sample as the flat ``float32`` vector."""
        return np.asarray(spaces.flatten(self.original, sample), dtype=np.float32)


class FlattenAction(gymnasium.ActionWrapper[Any, Any, Any]):
    """A ``gymnasium.Env`` whose action space is :class:`FlatActions`' flat form (for
    learners that refuse ``Dict`` actions); pair it with ``FlattenObservation``.

    Raises:
        SpaceConversionError: as :meth:`FlatActions.of`.
    """

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        self.flat = FlatActions.of(env.action_space)
        self.action_space = self.flat.space

    def action(self, action: Any) -> Any:
        """The original action space's sample for ``action``."""
        return self.flat.to_original(action)


# -- helpers --------------------------------------------------------------------------


def _same(sample: Any) -> Any:
    return sample


def _float32_box(box: spaces.Space[Any]) -> spaces.Box:
    """Gymnasium's flat ``Box`` as ``float32`` (what SB3's policies compute in)."""
    assert isinstance(box, spaces.Box)
    low, high = box.low.astype(np.float32), box.high.astype(np.float32)
    return spaces.Box(low, high, box.shape, dtype=np.float32)


def _leaves(space: spaces.Space[Any], path: tuple[str | int, ...]) -> Any:
    """``(path, space)`` of every non-composite subspace, in the space's order."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _leaves(sub, (*path, key))
    elif isinstance(space, spaces.Tuple):
        for index, sub in enumerate(space.spaces):
            yield from _leaves(sub, (*path, index))
    else:
        yield path, space


def _name(path: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in path) or "action"


def _integer_sizes(space: Any) -> list[int]:
    if isinstance(space, spaces.Discrete):
        return [int(space.n)]
    if isinstance(space, spaces.MultiDiscrete):
        return [int(n) for n in np.asarray(space.nvec).reshape(-1)]
    return [2] * int(np.prod(space.shape))  # MultiBinary


def _integer_value(space: Any, values: np.ndarray[Any, Any]) -> Any:
    if isinstance(space, spaces.Discrete):
        return np.int64(values[0] + int(space.start))
    if isinstance(space, spaces.MultiDiscrete):
        shaped = values.reshape(space.shape) + np.asarray(space.start)
        return shaped.astype(space.dtype)
    return values.reshape(space.shape).astype(space.dtype)  # MultiBinary


def _empty(space: spaces.Space[Any]) -> Any:
    if isinstance(space, spaces.Dict):
        return {key: _empty(sub) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return [_empty(sub) for sub in space.spaces]
    return None


def _put(out: Any, path: tuple[str | int, ...], value: Any) -> None:
    for part in path[:-1]:
        out = out[part]
    out[path[-1]] = value


def _frozen(value: Any) -> Any:
    """Lists made for Tuple spaces become tuples (a ``Tuple`` space's samples)."""
    if isinstance(value, dict):
        return {key: _frozen(v) for key, v in value.items()}
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


__all__ = ["FlatActions", "FlatObservations", "FlattenAction"]
