"""``PoolBatch``: the results of some sessions of an :class:`~corral.client.pool.EnvPool`.

A batch holds, for the sessions ``ids`` it covers (in order): ``observations`` (typed
models), ``rewards`` (float64; ``None`` → 0.0), ``terminated`` and ``truncated`` (bool),
``infos`` (each observation's ``metadata``), and ``obs``: the observations stacked field
by field (see :func:`stack_observations`). A session that failed is left out and listed
in ``errors``; with ``on_error="raise"`` (the pool's default) any failure raises
:class:`PoolError`, which carries the partial batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any, Generic

from pydantic import BaseModel

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("EnvPool needs numpy: pip install 'corral[numpy]'") from exc

from corral.client.typed import ObsT
from corral.contract import StepResult
from corral.errors import CorralError

_RESERVED = frozenset({"done", "truncated", "reward", "metadata"})
"""Observation fields reported as rewards/terminated/truncated/infos rather than in ``obs``."""


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
    stacked: dict[str, Any] = {}
    for name in names:
        values = [getattr(o, name) for o in observations]
        stacked[name] = _stack(values)
    return stacked


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, np.ndarray):
        if all(
            isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        ):
            return np.stack(values)
        return values
    kinds = {type(v) for v in values}
    if kinds == {bool}:
        return np.array(values, dtype=bool)
    if kinds == {int}:
        return np.array(values, dtype=np.int64)
    if kinds <= {int, float}:
        return np.array(values, dtype=np.float64)
    return values


class PoolBatch(Generic[ObsT]):
    """Results of some sessions of a pool, in the order of ``ids`` (see module docstring).

    Everything is built on first access: observations are validated into their model
    when ``observations`` or ``obs`` is read (rewards and flags are read without it), and
    the numpy arrays when first used, so a batch costs only what its reader uses.
    """

    def __init__(
        self,
        ids: list[int],
        raw: list[dict[str, Any]],
        infos: list[dict[str, Any]],
        rewards: list[float],
        terminated: list[bool],
        truncated: list[bool],
        decode: Callable[[list[Any]], list[ObsT]],
        errors: dict[int, CorralError] | None = None,
    ) -> None:
        self._ids = ids
        self._rewards = rewards
        self._terminated = terminated
        self._truncated = truncated
        self.infos = infos
        """Each observation's ``metadata`` (plus ``final_obs``/``final_info`` in SAME_STEP)."""
        self.errors: dict[int, CorralError] = errors or {}
        """``{session id: error}`` for the sessions left out of this batch."""
        self._raw = raw
        self._decode = decode

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"PoolBatch(ids={self._ids!r}, errors={sorted(self.errors)!r})"

    @cached_property
    def ids(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Session ids of this batch's results, in order."""
        return np.array(self._ids, dtype=np.int64)

    @cached_property
    def rewards(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Each session's reward (``None`` from the environment is 0.0)."""
        return np.array(self._rewards, dtype=np.float64)

    @cached_property
    def terminated(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The episode reached a terminal state (Gymnasium's meaning)."""
        return np.array(self._terminated, dtype=bool)

    @cached_property
    def truncated(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The episode was cut short (Gymnasium's meaning)."""
        return np.array(self._truncated, dtype=bool)

    @cached_property
    def observations(self) -> list[ObsT]:
        """The typed observations.

        Raises:
            BadObservation: the server sent one that does not match the contract.
        """
        return self._decode(self._raw)

    @cached_property
    def obs(self) -> dict[str, Any]:
        """The observations stacked field by field (see :func:`stack_observations`)."""
        return stack_observations(self.observations)

    def results(self) -> list[StepResult[ObsT]]:
        """One :class:`~corral.contract.StepResult` per session of this batch, in order.

        The flags are the pool's (auto-resets included) and a missing reward is 0.0, as
        in :attr:`rewards`.
        """
        return [
            StepResult(
                observation=obs,
                reward=self._rewards[k],
                terminated=self._terminated[k],
                truncated=self._truncated[k],
                info=self.infos[k],
            )
            for k, obs in enumerate(self.observations)
        ]

    @property
    def dones(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """``terminated | truncated``."""
        dones: np.ndarray[Any, np.dtype[np.bool_]] = self.terminated | self.truncated
        return dones


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
