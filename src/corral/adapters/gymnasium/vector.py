"""N remote corral sessions as one ``gymnasium.vector.VectorEnv``.

    envs = RemoteVectorEnv.from_env("gym:CartPole-v1", num_envs=8)
    obs, infos = envs.reset(seed=0)
    obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())

It behaves like ``gymnasium.vector.SyncVectorEnv`` over the same environments and seeds,
including the three autoreset modes (``NEXT_STEP``, ``SAME_STEP``, ``DISABLED`` with
``options={"reset_mask": ...}``), but every reset and step of the N sessions is sent at
once. The sessions sit behind :class:`Sessions`, the one interface the vector env uses:
:class:`PoolSessions` (the default of :meth:`RemoteVectorEnv.from_env` / ``from_url``) keeps
them in an :class:`~corral.client.pool.EnvPool`, so the N resets or steps travel as one
batch message per connection; :class:`ClientSessions` drives one client per session.

Autoresets: a local vector env resets an ended sub-env unseeded, its generator going on. A
pool with recovery on (the default) seeds them instead, from its own generator
(:meth:`~corral.client.pool.EnvPool.auto_seed`, reseeded by a seeded ``reset()``), so that
every episode can move by verified replay when its server is lost, and runs still repeat
from the trainer's seeds. Step-for-step equality with ``SyncVectorEnv`` past the first
episode then needs ``recover=False`` (as for SB3's ``RemoteVecEnv``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from copy import deepcopy
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from corral.adapters.gymnasium.remote import ContractSpaces, info_of
from corral.adapters.gymnasium.spaces import DEFAULT_MAX_TEXT_LENGTH
from corral.blocking import run_blocking
from corral.client import AsyncEnvClient
from corral.client.local_server import LocalServer
from corral.client.pool import AutoresetMode as PoolAutoreset
from corral.client.pool import EnvPool, SyncEnvPool
from corral.contract import StepResult
from corral.contract.schema import model_schemas

ResetRequest = tuple[int, int | None, dict[str, Any]]
"""``(session index, seed, options)``."""
StepRequest = tuple[int, dict[str, Any]]
"""``(session index, action as a dict of the Action model)``."""


class Sessions(Protocol):
    """The sessions behind a :class:`RemoteVectorEnv`: batched reset and step."""

    @property
    def size(self) -> int:
        """How many sessions there are."""
        ...

    def spaces(
        self, observation_fields: Sequence[str] | None, max_text_length: int
    ) -> ContractSpaces:
        """The contract's Gymnasium spaces (all sessions share one contract)."""
        ...

    def reset(self, requests: Sequence[ResetRequest]) -> list[StepResult[Any]]:
        """Reset the given sessions at once; results in request order."""
        ...

    def step(self, requests: Sequence[StepRequest]) -> list[StepResult[Any]]:
        """Step the given sessions at once; results in request order."""
        ...

    def auto_reset(self, indices: Sequence[int]) -> list[StepResult[Any]]:
        """Start the next episode of sessions whose episode ended (an autoreset, which
        the trainer does not seed); results in ``indices`` order."""
        ...

    def close(self) -> None:
        """Close every session (idempotent)."""
        ...


class ClientSessions:
    """Sessions as N :class:`AsyncEnvClient`, driven concurrently on the background loop.

    Args:
        clients: one client per session, all of the same environment.
        server: a local server the clients use, stopped by :meth:`close`.
    """

    def __init__(
        self, clients: Sequence[AsyncEnvClient[Any, Any, Any]], server: LocalServer | None = None
    ) -> None:
        if not clients:
            raise ValueError("a vector environment needs at least one session")
        self.clients = list(clients)
        self.server = server
        self._closed = False
        timeouts = [c.timeout for c in self.clients]
        # Each request is bounded by its client's timeout; the margin covers the gather.
        self._timeout = None if None in timeouts else max(t for t in timeouts if t) + 5.0
        self._run(_gather([c.connect() for c in self.clients]))

    @classmethod
    def to_url(cls, url: str, num_envs: int, **client_kwargs: Any) -> ClientSessions:
        """``num_envs`` sessions on the server at ``url``."""
        return cls([AsyncEnvClient(url, **client_kwargs) for _ in range(num_envs)])

    @classmethod
    def on_local_server(
        cls,
        target: str,
        num_envs: int,
        *,
        server_args: list[str] | None = None,
        **client_kwargs: Any,
    ) -> ClientSessions:
        """Start one local server for ``target`` and open ``num_envs`` sessions on it."""
        server = LocalServer(target, server_args=server_args)
        url = run_blocking(server.start(), None)
        try:
            return cls([AsyncEnvClient(url, **client_kwargs) for _ in range(num_envs)], server)
        except BaseException:
            server.stop_now()
            raise

    @property
    def size(self) -> int:
        """How many sessions there are."""
        return len(self.clients)

    def _run(self, coro: Any) -> Any:
        return run_blocking(coro, self._timeout)

    def spaces(
        self, observation_fields: Sequence[str] | None, max_text_length: int
    ) -> ContractSpaces:
        """The spaces of the first session's contract."""
        return ContractSpaces.from_client(
            self.clients[0], observation_fields=observation_fields, max_text_length=max_text_length
        )

    def reset(self, requests: Sequence[ResetRequest]) -> list[StepResult[Any]]:
        """Reset the given sessions concurrently."""
        calls = [self.clients[i].reset(seed, **options) for i, seed, options in requests]
        results: list[StepResult[Any]] = self._run(_gather(calls))
        return results

    def step(self, requests: Sequence[StepRequest]) -> list[StepResult[Any]]:
        """Step the given sessions concurrently."""
        calls = [self.clients[i].step(action) for i, action in requests]
        results: list[StepResult[Any]] = self._run(_gather(calls))
        return results

    def auto_reset(self, indices: Sequence[int]) -> list[StepResult[Any]]:
        """Reset them unseeded: each environment's own generator goes on, as in
        Gymnasium's vector envs (lone clients do not move an episode anywhere)."""
        return self.reset([(i, None, {}) for i in indices])

    def close(self) -> None:
        """Close every client, then the local server if there is one."""
        if self._closed:
            return
        self._closed = True
        try:
            run_blocking(_gather([c.close() for c in self.clients], return_exceptions=True), 30.0)
        finally:
            if self.server is not None:
                self.server.stop_now()


class PoolSessions:
    """Sessions in an :class:`EnvPool`: every reset or step is one batch per connection.

    The pool runs without auto-reset (the vector env decides when sessions reset).

    Args:
        pool: a pool created with ``autoreset_mode="disabled"`` (started here if needed);
            :meth:`close` closes it.

    Attributes:
        async_pool: ``pool`` itself (its models, its servers' URLs).
        pool: its blocking twin, which the vector env drives.
    """

    def __init__(self, pool: EnvPool[Any, Any, Any]) -> None:
        self.async_pool = pool
        self.pool: SyncEnvPool[Any, Any, Any] = pool.sync()
        if self.pool.autoreset_mode is not PoolAutoreset.DISABLED:
            raise ValueError("PoolSessions needs a pool created with autoreset_mode='disabled'")
        self._closed = False
        self.pool.start()

    @classmethod
    def create(cls, target: str | Sequence[str], num_envs: int, **kwargs: Any) -> PoolSessions:
        """``num_envs`` sessions of ``target`` (as :class:`EnvPool` takes it)."""
        return cls(EnvPool(num_envs, target, autoreset_mode=PoolAutoreset.DISABLED, **kwargs))

    @property
    def size(self) -> int:
        """How many sessions there are."""
        return self.pool.num_envs

    def spaces(
        self, observation_fields: Sequence[str] | None, max_text_length: int
    ) -> ContractSpaces:
        """The spaces of the pool's contract."""
        inner = self.async_pool
        assert inner.action_type and inner.observation_type and inner.state_type
        schemas = model_schemas(inner.action_type, inner.observation_type, inner.state_type)
        return ContractSpaces.from_schemas(
            schemas, observation_fields=observation_fields, max_text_length=max_text_length
        )

    def reset(self, requests: Sequence[ResetRequest]) -> list[StepResult[Any]]:
        """Reset the given sessions in one batch."""
        batch = self.pool.reset(
            seed=[seed for _, seed, _ in requests],
            options=[options for _, _, options in requests],
            ids=[i for i, _, _ in requests],
        )
        return batch.results()

    def step(self, requests: Sequence[StepRequest]) -> list[StepResult[Any]]:
        """Step the given sessions in one batch."""
        ids = [i for i, _ in requests]
        actions = [action for _, action in requests]
        if ids == list(range(self.size)):
            return self.pool.step(actions).results()
        self.pool.send(actions, session_ids=ids)
        batch = self.pool.recv()
        by_id = dict(zip(batch.ids.tolist(), batch.results(), strict=True))
        return [by_id[i] for i in ids]

    def auto_reset(self, indices: Sequence[int]) -> list[StepResult[Any]]:
        """Reset them seeded from the pool's generator (:meth:`EnvPool.auto_seed`): with
        recovery on, an episode a lost server held can then move by verified replay
        instead of ending truncated; a seeded ``reset()`` makes the seeds repeat."""
        return self.reset([(i, self.async_pool.auto_seed(), {}) for i in indices])

    def close(self) -> None:
        """Close the pool (and the servers it started); idempotent."""
        if not self._closed:
            self._closed = True
            self.pool.close()


class RemoteVectorEnv(VectorEnv[Any, Any, Any]):
    """A ``VectorEnv`` over remote sessions (see the module docstring).

    Args:
        sessions: the sessions (:class:`ClientSessions`, or clients to wrap in one).
        autoreset_mode: Gymnasium's autoreset mode (``NEXT_STEP`` by default, as in
            ``SyncVectorEnv``).
        copy: return copies of the observation buffer (as ``SyncVectorEnv`` does).
        observation_fields / max_text_length: as for
            :class:`~corral.adapters.gymnasium.remote.RemoteEnv`.
    """

    def __init__(
        self,
        sessions: Sessions | Sequence[AsyncEnvClient[Any, Any, Any]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        observation_fields: Sequence[str] | None = None,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
    ) -> None:
        super().__init__()
        self.sessions: Sessions = (
            ClientSessions(list(sessions)) if isinstance(sessions, Sequence) else sessions
        )
        try:
            self.autoreset_mode = autoreset(autoreset_mode)
            self.spaces = self.sessions.spaces(observation_fields, max_text_length)
        except BaseException:
            self.sessions.close()
            raise
        self.copy = copy
        self.num_envs = self.sessions.size
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        self.single_action_space = self.spaces.action.space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.single_observation_space = self.spaces.observation.space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._env_obs: list[Any] = [None] * self.num_envs
        self._observations: Any = create_empty_array(
            self.single_observation_space, n=self.num_envs, fn=np.zeros
        )
        self._rewards = np.zeros((self.num_envs,), dtype=np.float64)
        self._terminations = np.zeros((self.num_envs,), dtype=np.bool_)
        self._truncations = np.zeros((self.num_envs,), dtype=np.bool_)
        self._autoreset_envs = np.zeros((self.num_envs,), dtype=np.bool_)
        self._closed = False

    @classmethod
    def from_url(cls, url: str | Sequence[str], num_envs: int, **kwargs: Any) -> RemoteVectorEnv:
        """``num_envs`` sessions on the server(s) at ``url``, in an :class:`EnvPool`;
        ``kwargs`` go to this class (``autoreset_mode``, ``copy``, ``observation_fields``,
        ``max_text_length``) or else to the pool."""
        own, pool_kwargs = _split(kwargs)
        return cls(PoolSessions.create(url, num_envs, **pool_kwargs), **own)

    @classmethod
    def from_env(cls, target: str, num_envs: int, **kwargs: Any) -> RemoteVectorEnv:
        """``num_envs`` sessions on a local server started for ``target`` (``module:Class``
        or ``gym:ENV_ID``; ``servers=M`` starts M), in an :class:`EnvPool`, stopped when the
        vector env closes."""
        own, pool_kwargs = _split(kwargs)
        return cls(PoolSessions.create(target, num_envs, **pool_kwargs), **own)

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={self.num_envs} "
                f"but got length={len(seeds)}."
            )
        return seeds

    def _reset_mask(self, options: dict[str, Any]) -> npt.NDArray[np.bool_]:
        mask = options.pop("reset_mask")
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
        if mask.shape != (self.num_envs,):
            raise ValueError(
                f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {mask.shape}"
            )
        if mask.dtype != np.bool_:
            raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
        if not np.any(mask):
            raise ValueError(
                "`options['reset_mask']` must contain a boolean array with at least one True "
                f"value, got reset_mask={mask}"
            )
        return mask

    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every session (or those in ``options["reset_mask"]``).

        ``seed``: None (unseeded), an int (session ``i`` gets ``seed + i``) or one seed
        per session. The other ``options`` are the environments' reset options.
        """
        seeds = self._seeds(seed)
        options = dict(options or {})
        if "reset_mask" in options:
            mask = self._reset_mask(options)
        else:
            mask = np.ones((self.num_envs,), dtype=np.bool_)
        self._terminations[mask] = False
        self._truncations[mask] = False
        self._autoreset_envs[mask] = False
        indices = [i for i in range(self.num_envs) if mask[i]]
        results = self.sessions.reset([(i, seeds[i], options) for i in indices])
        infos: dict[str, Any] = {}
        for i, result in zip(indices, results, strict=True):
            self._env_obs[i] = self.spaces.observation_of(result)
            infos = self._add_info(infos, info_of(result), i)
        self._observations = concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        return (deepcopy(self._observations) if self.copy else self._observations), infos

    def step(
        self, actions: Any
    ) -> tuple[
        Any,
        npt.NDArray[np.float64],
        npt.NDArray[np.bool_],
        npt.NDArray[np.bool_],
        dict[str, Any],
    ]:
        """Step every session with its action, resetting ended ones per the autoreset mode.

        Raises:
            RuntimeError: with ``DISABLED``, a session whose episode ended was not reset.
        """
        samples = list(iterate(self.action_space, actions))
        ended = [i for i in range(self.num_envs) if self._autoreset_envs[i]]
        if ended and self.autoreset_mode is AutoresetMode.DISABLED:
            raise RuntimeError(
                f"sub-environment(s) {ended} ended and autoreset_mode is DISABLED: reset them "
                "with reset(options={'reset_mask': mask}) before stepping"
            )
        resets = ended if self.autoreset_mode is AutoresetMode.NEXT_STEP else []
        steps = [i for i in range(self.num_envs) if i not in resets]
        step_results = (
            self.sessions.step([(i, self.spaces.action_of(samples[i])) for i in steps])
            if steps
            else []
        )
        reset_results = self.sessions.auto_reset(resets) if resets else []
        outcome: dict[int, tuple[StepResult[Any], bool]] = {
            **{i: (r, True) for i, r in zip(steps, step_results, strict=True)},
            **{i: (r, False) for i, r in zip(resets, reset_results, strict=True)},
        }
        finals: dict[int, StepResult[Any]] = {}
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            done = [i for i in steps if outcome[i][0].done]
            for i, result in zip(done, self.sessions.auto_reset(done), strict=True):
                finals[i] = outcome[i][0]
                outcome[i] = (result, True)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            result, stepped = outcome[i]
            final = finals.get(i)
            source = final if final is not None else result
            if stepped:
                self._rewards[i] = 0.0 if source.reward is None else float(source.reward)
                self._terminations[i] = source.terminated
                self._truncations[i] = source.truncated
            else:
                self._rewards[i] = 0.0
                self._terminations[i] = False
                self._truncations[i] = False
            if final is not None:
                infos = self._add_info(
                    infos,
                    {"final_obs": self.spaces.observation_of(final), "final_info": info_of(final)},
                    i,
                )
            self._env_obs[i] = self.spaces.observation_of(result)
            infos = self._add_info(infos, info_of(result), i)
        self._observations = concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (
            deepcopy(self._observations) if self.copy else self._observations,
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )

    def close_extras(self, **kwargs: Any) -> None:
        """Close the sessions (``VectorEnv.close`` calls this once)."""
        self.sessions.close()


def autoreset(mode: str | AutoresetMode) -> AutoresetMode:
    """Parse an autoreset mode: the enum, its value (``"NextStep"``) or its name
    (``"next_step"``, any case).

    Raises:
        ValueError: for anything else, listing the modes.
    """
    if isinstance(mode, AutoresetMode):
        return mode
    for member in AutoresetMode:
        if mode in (member.value, member.name) or mode.upper() == member.name:
            return member
    names = ", ".join(m.name for m in AutoresetMode)
    raise ValueError(f"unknown autoreset mode {mode!r}; use one of {names}")


async def _gather(calls: Sequence[Coroutine[Any, Any, Any]], **kwargs: Any) -> list[Any]:
    """``asyncio.gather`` as a coroutine, so that it starts on the loop that runs it."""
    return list(await asyncio.gather(*calls, **kwargs))


_OWN_KWARGS = ("autoreset_mode", "copy", "observation_fields", "max_text_length")


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    own = {k: kwargs.pop(k) for k in _OWN_KWARGS if k in kwargs}
    return own, kwargs
