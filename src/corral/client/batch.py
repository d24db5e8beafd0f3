"""``PoolBatch``: the results of some sessions of an :class:`~corral.client.pool.EnvPool`.

A batch holds, for the sessions ``ids`` it covers (in order): ``rewards`` (float64;
``None`` → 0.0), ``terminated`` and ``truncated`` (bool) as numpy arrays; ``obs``, the
observations stacked field by field (see :func:`stack_observations`); ``infos`` (each
observation's ``metadata``); and ``observations``, the typed models. A session that
failed is left out and listed in ``errors``; with ``on_error="raise"`` (the pool's
default) any failure raises :class:`PoolError`, which carries the partial batch.

**Numpy first, models on demand.** A batch is built from the observations' *columns*
(one list per field, as a columnar ``batch`` reply carries them: see
:class:`~corral.protocol.batch.BatchColumns`), not from one object per session. The
arrays come straight from those columns; the typed observations and the ``infos`` maps
are built only when read. A trainer that reads ``obs``, ``rewards`` and the flags never
pays for a pydantic model per step, and a batch allocates a handful of objects, not a
handful per session (which is also what keeps the garbage collector quiet).

:class:`ResultTable` is the pool's builder of batches: the columns of one or more
replies, in session order, with the few per-session overrides auto-resets need.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar, overload

from pydantic import BaseModel

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("EnvPool needs numpy: pip install 'corral[numpy]'") from exc

from corral.client.typed import ObsT
from corral.contract import StepResult
from corral.errors import CorralError
from corral.protocol.batch import ABSENT

_RESERVED = frozenset({"done", "truncated", "reward", "metadata"})
"""Observation fields reported as rewards/terminated/truncated/infos rather than in ``obs``."""

Flags = tuple[float, bool, bool]
"""(reward, terminated, truncated) of one session, overriding its observation's."""

_DTYPES: dict[Any, Any] = {bool: np.bool_, int: np.int64, float: np.float64, str: str}
"""Field types whose wire value is the model's value: their column is used as it is."""
_UNIONS = (typing.Union, types.UnionType)

R = TypeVar("R")


class _Lazy(Generic[R]):
    """``functools.cached_property`` without its lock: Python 3.11's takes an ``RLock``
    on every first read (~0.8 us, against ~0.2 here), and a vec step reads five or six
    of a batch's properties. The value goes in the instance's ``__dict__``, which later
    reads find first; two threads reading a new batch at once may both compute it."""

    def __init__(self, compute: Callable[[Any], R]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> Self: ...

    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> R: ...

    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> Self | R:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


def scalar_dtypes(model: type[BaseModel] | None) -> dict[str, Any]:
    """The numpy dtype of each observation field annotated ``bool``/``int``/``float``
    (``str`` for strings, which stay a list), or one of those ``| None``: those columns
    are read without building a model, as the wire value is the model's value."""
    if model is None:
        return {}
    dtypes: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if name in _RESERVED:
            continue
        if annotation in _DTYPES:
            dtypes[name] = _DTYPES[annotation]
            continue
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) in _UNIONS and len(args) == 2 and type(None) in args:
            inner = args[0] if args[1] is type(None) else args[1]
            if inner in _DTYPES:
                dtypes[name] = _DTYPES[inner]
    return dtypes


def stack_observations(observations: Sequence[BaseModel]) -> dict[str, Any]:
    """Stack observations field by field (``done``/``truncated``/``reward``/``metadata`` aside).

    Per field, across the observations: numpy arrays of one shape and dtype are stacked
    into one array of shape ``(k, *shape)``; bools become a bool array, ints an int64 array,
    ints and floats a float64 array; anything else (strings, nested models, ``None``,
    arrays of differing shapes) stays a list of the values, in order.
    """
    if not observations:
        return {}
    names = [n for n in type(observations[0]).model_fields if n not in _RESERVED]
    return {name: _stack([getattr(o, name) for o in observations]) for name in names}


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, np.ndarray):
        shape, dtype = first.shape, first.dtype
        plain = not dtype.hasobject
        for v in values:
            if not isinstance(v, np.ndarray) or v.shape != shape or v.dtype != dtype:
                return values
            plain = plain and type(v) is np.ndarray
        # Plain arrays of one shape and dtype: np.array makes np.stack's array (fresh,
        # C-ordered, same dtype) at a third of its cost (~2.5 vs ~7 us for 8 small ones).
        return np.array(values) if plain else np.stack(values)
    kinds = {type(v) for v in values}
    if kinds == {bool}:
        return np.array(values, dtype=bool)
    if kinds == {int}:
        return np.array(values, dtype=np.int64)
    if kinds <= {int, float}:
        return np.array(values, dtype=np.float64)
    return values


def _column_array(values: list[Any], dtype: Any, sparse: bool) -> Any:
    """``values`` as an array of ``dtype`` (a list for ``str``, or when a value is None, as
    :func:`stack_observations` gives them), or None when one does not fit."""
    if sparse and any(v is ABSENT for v in values):
        return None
    if None in values:
        return values
    if dtype is str:
        return values if all(type(v) is str for v in values) else None
    try:
        return np.array(values, dtype=dtype)
    except (TypeError, ValueError):
        return None


@dataclass(slots=True)
class ResultTable:
    """Sessions' results as columns, in order: what a :class:`PoolBatch` is built from.

    Attributes:
        ids: the session (slot) id of each successful result, in order.
        fields: each observation field's wire values over ``ids``.
        errors: ``{session id: error}`` for the sessions that failed.
        flags: per-session (reward, terminated, truncated) overrides (auto-resets).
        extra: per-session extra ``info`` entries (``final_info``).
        finals: the wire observation of the step that ended each session's episode
            (``SAME_STEP`` auto-resets), its info's ``final_obs`` once read (typed then).
        sparse: some value is :data:`~corral.protocol.batch.ABSENT` (an observation
            without a field the others have).
        resets: the same-step resets the server ran for sessions whose step ended
            their episode (a ``step_batch`` with ``autoreset``): the new episode's first
            wire observation, or the reset's error. The pool folds them into the table
            (SAME_STEP) before anyone else sees it.
    """

    ids: list[int] = field(default_factory=list)
    fields: dict[str, list[Any]] = field(default_factory=dict)
    errors: dict[int, CorralError] = field(default_factory=dict)
    flags: dict[int, Flags] = field(default_factory=dict)
    extra: dict[int, dict[str, Any]] = field(default_factory=dict)
    finals: dict[int, dict[str, Any]] = field(default_factory=dict)
    sparse: bool = False
    resets: dict[int, dict[str, Any] | CorralError] = field(default_factory=dict)

    @classmethod
    def failed(cls, ids: Sequence[int], error: CorralError) -> ResultTable:
        """Every session of ``ids`` failed with ``error``."""
        return cls(errors=dict.fromkeys(ids, error))

    @classmethod
    def from_rows(cls, ids: list[int], rows: list[dict[str, Any]]) -> ResultTable:
        """The table of row-form observations (a field one of them lacks is ABSENT there)."""
        names: dict[str, None] = {}
        sparse = False
        for row in rows:
            if len(row) != len(names) or row.keys() != names.keys():
                sparse = sparse or bool(names)
                names.update(dict.fromkeys(row))
        if sparse or any(len(row) != len(names) for row in rows):
            fields = {name: [row.get(name, ABSENT) for row in rows] for name in names}
            return cls(ids, fields, sparse=True)
        return cls(ids, {name: [row[name] for row in rows] for name in names})

    def __len__(self) -> int:
        return len(self.ids)

    def column(self, name: str) -> list[Any] | None:
        """The wire values of field ``name`` (None when no observation has it); an
        observation without it has None there."""
        values = self.fields.get(name)
        if values is not None and self.sparse:
            return [None if v is ABSENT else v for v in values]
        return values

    def row(self, position: int) -> dict[str, Any]:
        """The wire observation at ``position``."""
        if self.sparse:
            return {
                name: value
                for name, values in self.fields.items()
                if (value := values[position]) is not ABSENT
            }
        return {name: values[position] for name, values in self.fields.items()}

    def done_ids(self) -> list[int]:
        """The sessions whose observation says ``done``."""
        done = self.fields.get("done")
        if done is None or True not in done:  # most steps end no episode: a scan in C
            return []
        ids = self.ids
        return [ids[k] for k, flag in enumerate(done) if flag is True]

    @classmethod
    def concat(cls, tables: Sequence[ResultTable], order: Sequence[int]) -> ResultTable:
        """One table of ``tables``' results, rows in the order of session ids ``order``
        (ids without a result, the failed ones, are skipped)."""
        if len(tables) == 1 and tables[0].ids == (order if type(order) is list else list(order)):
            return tables[0]
        out = cls()
        for table in tables:
            out.sparse = out.sparse or table.sparse
            out.errors.update(table.errors)
            out.flags.update(table.flags)
            out.extra.update(table.extra)
            out.finals.update(table.finals)
            out.resets.update(table.resets)
        names: dict[str, None] = {}
        for table in tables:
            names.update(dict.fromkeys(table.fields))
        ids: list[int] = []
        columns: dict[str, list[Any]] = {name: [] for name in names}
        for table in tables:
            ids += table.ids
            for name, values in columns.items():
                part = table.fields.get(name)
                if part is None:
                    part = [ABSENT] * len(table.ids)
                    out.sparse = out.sparse or bool(part)
                values += part
        if ids != list(order):
            position = {sid: k for k, sid in enumerate(ids)}
            picks = [position[sid] for sid in order if sid in position]
            ids = [ids[k] for k in picks]
            columns = {name: [values[k] for k in picks] for name, values in columns.items()}
        out.ids, out.fields = ids, columns
        return out

    def split(self, count: int) -> tuple[ResultTable, ResultTable]:
        """The first ``count`` results (errors first, then rows) and the rest."""
        errors = list(self.errors.items())
        taken_errors = dict(errors[:count])
        rows = max(0, count - len(errors))
        head = ResultTable(
            self.ids[:rows],
            {name: values[:rows] for name, values in self.fields.items()},
            taken_errors,
            sparse=self.sparse,
        )
        tail = ResultTable(
            self.ids[rows:],
            {name: values[rows:] for name, values in self.fields.items()},
            dict(errors[count:]),
            sparse=self.sparse,
        )
        for part in (head, tail):
            part.flags = {i: self.flags[i] for i in part.ids if i in self.flags}
            part.extra = {i: self.extra[i] for i in part.ids if i in self.extra}
            part.finals = {i: self.finals[i] for i in part.ids if i in self.finals}
        return head, tail

    @property
    def count(self) -> int:
        """Results and errors together."""
        return len(self.ids) + len(self.errors)


class PoolBatch(Generic[ObsT]):
    """Results of some sessions of a pool, in the order of ``ids`` (see module docstring).

    Args:
        table: the results as columns (see :class:`ResultTable`).
        decode: builds typed observations from wire maps (in one validation call).
        dtypes: the numpy dtype of the observation's plain scalar fields
            (:func:`scalar_dtypes`), so ``obs`` needs no models for them.
    """

    def __init__(
        self,
        table: ResultTable,
        decode: Callable[[list[Any]], list[ObsT]],
        dtypes: dict[str, Any] | None = None,
    ) -> None:
        self._table = table
        self._decode = decode
        self._dtypes = dtypes or {}
        self.errors: dict[int, CorralError] = table.errors
        """``{session id: error}`` for the sessions left out of this batch."""

    def __len__(self) -> int:
        return len(self._table.ids)

    def __repr__(self) -> str:
        return f"PoolBatch(ids={self._table.ids!r}, errors={sorted(self.errors)!r})"

    def _overridden(self, array: np.ndarray[Any, Any], which: int) -> np.ndarray[Any, Any]:
        flags = self._table.flags
        if flags:
            position = self._position
            for sid, values in flags.items():
                k = position.get(sid)
                if k is not None:
                    array[k] = values[which]
        return array

    @_Lazy
    def _position(self) -> dict[int, int]:
        """Each session id's row (the flags' overrides are by session id)."""
        return {sid: k for k, sid in enumerate(self._table.ids)}

    @_Lazy
    def ids(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Session ids of this batch's results, in order."""
        return np.array(self._table.ids, dtype=np.int64)

    @_Lazy
    def rewards(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Each session's reward (``None`` from the environment is 0.0)."""
        column = self._table.column("reward")
        if column is None:
            rewards = np.zeros(len(self), dtype=np.float64)
        elif None in column:
            rewards = np.array([0.0 if r is None else r for r in column], dtype=np.float64)
        else:
            rewards = np.array(column, dtype=np.float64)
        return self._overridden(rewards, 0)

    def _flag(self, name: str) -> np.ndarray[Any, np.dtype[np.bool_]]:
        column = self._table.column(name)
        if column is None:
            return np.zeros(len(self), dtype=bool)
        if None in column:
            return np.array([v is True for v in column], dtype=bool)
        return np.array(column, dtype=bool)

    @_Lazy
    def _truncated_flags(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The observations' ``truncated`` flags (before the overrides)."""
        return self._flag("truncated")

    @_Lazy
    def terminated(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The episode reached a terminal state (Gymnasium's meaning)."""
        terminated = self._flag("done") & ~self._truncated_flags
        return self._overridden(terminated, 1)

    @_Lazy
    def truncated(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The episode was cut short (Gymnasium's meaning)."""
        return self._overridden(self._truncated_flags.copy(), 2)

    @property
    def dones(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """``terminated | truncated``."""
        dones: np.ndarray[Any, np.dtype[np.bool_]] = self.terminated | self.truncated
        return dones

    @_Lazy
    def infos(self) -> list[dict[str, Any]]:
        """Each observation's ``metadata`` (plus ``final_obs``/``final_info`` in SAME_STEP).

        Raises:
            BadObservation: an ended episode's final observation does not match the
                contract (it is typed here, on first access).
        """
        finals = self._table.finals
        if not finals:
            return self._infos({})
        return self._infos(dict(zip(finals, self._decode(list(finals.values())), strict=True)))

    def infos_with(self, final_obs: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
        """:attr:`infos`, with each ``final_obs`` made by ``final_obs`` from the ended
        step's wire observation instead of a typed model (an adapter's own form of it,
        e.g. a Gymnasium sample, without building the model). A fresh list each call."""
        return self._infos({sid: final_obs(row) for sid, row in self._table.finals.items()})

    def _infos(self, finals: dict[int, Any]) -> list[dict[str, Any]]:
        table = self._table
        column = table.column("metadata") or [None] * len(self)
        infos = [dict(m) if isinstance(m, dict) else {} for m in column]
        if finals or table.extra:
            for k, sid in enumerate(table.ids):
                info = infos[k]
                if sid in finals:
                    info["final_obs"] = finals[sid]
                extra = table.extra.get(sid)
                if extra:
                    info.update(extra)
        return infos

    @_Lazy
    def observations(self) -> list[ObsT]:
        """The typed observations (built on first access).

        Raises:
            BadObservation: the server sent one that does not match the contract.
        """
        table = self._table
        return self._decode([table.row(k) for k in range(len(self))])

    @_Lazy
    def obs(self) -> dict[str, Any]:
        """The observations stacked field by field (see :func:`stack_observations`).

        Plain scalar fields and array fields come straight from the columns; a field
        of any other type is read from the typed observations.
        """
        if not len(self):
            return {}
        stacked: dict[str, Any] = {}
        typed: dict[str, Any] | None = None
        for name, values in self._table.fields.items():
            if name in _RESERVED:
                continue
            array = None
            dtype = self._dtypes.get(name)
            if dtype is not None:
                array = _column_array(values, dtype, self._table.sparse)
            elif isinstance(values[0], np.ndarray):
                array = _stack(values)
                if isinstance(array, list):
                    array = None
            if array is None:
                if typed is None:
                    typed = stack_observations(self.observations)
                array = typed.get(name, self._table.column(name))
            stacked[name] = array
        return stacked

    def results(self) -> list[StepResult[ObsT]]:
        """One :class:`~corral.contract.StepResult` per session of this batch, in order.

        The flags are the pool's (auto-resets included) and a missing reward is 0.0, as
        in :attr:`rewards`.
        """
        rewards, terminated, truncated = self.rewards, self.terminated, self.truncated
        return [
            StepResult(
                observation=obs,
                reward=float(rewards[k]),
                terminated=bool(terminated[k]),
                truncated=bool(truncated[k]),
                info=self.infos[k],
            )
            for k, obs in enumerate(self.observations)
        ]


class PoolError(CorralError):
    """Some sessions of a pool call failed.

    Attributes:
        errors: ``{session id: error}`` for every failed session.
        batch: the results of the sessions that did not fail.
    """

    def __init__(self, errors: dict[int, CorralError], batch: PoolBatch[Any]) -> None:
        first = next(iter(errors.values()))
        shown = "; ".join(f"session {i}: {e}" for i, e in list(errors.items())[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(
            f"{len(errors)} of {len(errors) + len(batch)} sessions failed: {shown}{more}",
            details={"failed": sorted(errors)},
            code=str(first.code),
        )
        self.errors = errors
        self.batch = batch
