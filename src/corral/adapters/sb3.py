"""N remote corral sessions as one Stable-Baselines3 ``VecEnv``, stepped in batches.

    from stable_baselines3 import PPO
    from corral.adapters.sb3 import RemoteVecEnv

    envs = RemoteVecEnv.from_env("gym:CartPole-v1", num_envs=8)   # one local server
    PPO("MlpPolicy", envs).learn(100_000)
    envs.close()

The sessions live in an :class:`~corral.client.pool.EnvPool`: the N resets or steps of a
call travel as one batch message per connection (multiplexed, not one WebSocket per
session), which is what makes a remote vectorised environment keep up with a local
``DummyVecEnv``. Episodes end and restart the way SB3 expects (the pool's ``SAME_STEP``
auto-reset): the step that ends an episode returns the next episode's first observation,
with the last one in ``infos[i]["terminal_observation"]`` and
``infos[i]["TimeLimit.truncated"]`` telling a time limit from a terminal state.

Spaces come from the contract's JSON Schemas, as for
:class:`~corral.adapters.gymnasium.RemoteEnv` (exactly the original spaces for a served
Gymnasium environment), then flattened into what SB3's algorithms take
(:mod:`corral.adapters.gymnasium.flat`): an Action of several bounded integer fields is a
``MultiDiscrete`` (``row: int (0..2)``, ``col: int (0..2)`` → ``MultiDiscrete([3, 3])``),
of several float fields one ``Box``, a ``Discrete`` counts from 0; an Observation of
several fields is one ``float32`` ``Box`` (Gymnasium's ``flatten_space``: integers
one-hot, arrays flattened), for ``MlpPolicy``. ``flatten=False`` keeps the ``Dict``
observation (SB3's ``MultiInputPolicy``) and the action space as it is. Needs the ``sb3``
extra (``pip install 'corral[sb3]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np

try:
    from stable_baselines3.common.vec_env import VecEnv
    from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvStepReturn
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "corral.adapters.sb3 needs Stable-Baselines3: pip install 'corral[sb3]'"
    ) from exc

from gymnasium.vector.utils import concatenate, create_empty_array

from corral.adapters.gymnasium.flat import FlatActions, FlatObservations
from corral.adapters.gymnasium.remote import ContractSpaces, info_copy, info_of
from corral.adapters.gymnasium.spaces import (
    DEFAULT_MAX_TEXT_LENGTH,
    ArrayBinding,
    Binding,
    DiscreteBinding,
    ModelBinding,
)
from corral.client.pool import AutoresetMode, EnvPool, PoolBatch, SyncEnvPool
from corral.contract.schema import model_schemas


class RemoteVecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` over the sessions of an :class:`EnvPool`.

    Args:
        pool: a pool in ``SAME_STEP`` auto-reset mode (started here if it is not yet).
            ``close()`` closes it.
        observation_fields / max_text_length: as for
            :class:`~corral.adapters.gymnasium.RemoteEnv`.
        flatten: flatten the spaces for SB3 (see the module docstring); False keeps them
            as the contract gives them.

    Raises:
        ValueError: the pool resets episodes another way.
        SpaceConversionError: the contract has a field with no Gymnasium space, or (with
            ``flatten``) spaces with no flat form SB3 takes.
    """

    def __init__(
        self,
        pool: EnvPool[Any, Any, Any],
        *,
        observation_fields: Sequence[str] | None = None,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
        flatten: bool = True,
    ) -> None:
        self.pool: SyncEnvPool[Any, Any, Any] = pool.sync()
        if self.pool.autoreset_mode is not AutoresetMode.SAME_STEP:
            raise ValueError(
                "an SB3 VecEnv resets an episode in the step that ends it: create the pool "
                f"with autoreset_mode='same_step', not {self.pool.autoreset_mode.name}"
            )
        inner = pool
        try:
            self.pool.start()  # a no-op for a started pool
            assert inner.action_type and inner.observation_type and inner.state_type
            schemas = model_schemas(inner.action_type, inner.observation_type, inner.state_type)
            self.spaces = ContractSpaces.from_schemas(
                schemas, observation_fields=observation_fields, max_text_length=max_text_length
            )
            original = self.spaces.action.space
            self.actions = FlatActions.of(original) if flatten else FlatActions.unchanged(original)
            self.flat_observations = (
                FlatObservations.of(self.spaces.observation.space) if flatten else None
            )
        except BaseException:
            self.pool.close()
            raise
        self.render_mode = None  # frames do not cross the wire from a VecEnv
        observation_space = (
            self.flat_observations.space
            if self.flat_observations is not None
            else self.spaces.observation.space
        )
        super().__init__(self.pool.num_envs, observation_space, self.actions.space)
        self._observations: Any = create_empty_array(
            self.observation_space, n=self.num_envs, fn=np.zeros
        )
        self._actions: list[dict[str, Any]] = []
        self._closed = False
        # The observation field whose stacked column is the observation batch (with the
        # batch's shape and dtype), when the space is one array or plain integer field (a
        # served Gymnasium environment's).
        self._obs_column: tuple[str, tuple[int, ...], Any] | None = None
        obs = _single_field(self.spaces.observation)
        if obs is not None and (_plain_int(obs[1]) or isinstance(obs[1], ArrayBinding)):
            name, field = obs
            shape = (self.num_envs, *(field.space.shape or ()))
            self._obs_column = (name, shape, field.space.dtype)
        # The action field when actions are plain integers (a Discrete space from 0).
        action = _single_field(self.spaces.action)
        self._action_field = (
            action[0]
            if action is not None and _plain_int(action[1]) and self.actions.identity
            else None
        )

    @classmethod
    def from_env(
        cls, target: str, num_envs: int, *, servers: int = 1, **kwargs: Any
    ) -> RemoteVecEnv:
        """``num_envs`` sessions on ``servers`` local servers started for ``target``
        (``module:Class``, ``gym:ENV_ID`` or an environment directory); ``kwargs`` go to
        :class:`EnvPool` except ``observation_fields`` / ``max_text_length`` /
        ``flatten``."""
        own = {k: kwargs.pop(k) for k in _ADAPTER_KEYWORDS if k in kwargs}
        pool = EnvPool(
            num_envs, target, servers=servers, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs
        )
        return cls(pool, **own)

    @classmethod
    def from_url(cls, url: str | Sequence[str], num_envs: int, **kwargs: Any) -> RemoteVecEnv:
        """``num_envs`` sessions on the running server(s) at ``url``; as :meth:`from_env`."""
        own = {k: kwargs.pop(k) for k in _ADAPTER_KEYWORDS if k in kwargs}
        pool = EnvPool(num_envs, url, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
        return cls(pool, **own)

    # -- VecEnv ---------------------------------------------------------------------

    def reset(self) -> Any:
        """Reset every session (with the seeds and options set by ``seed()`` /
        ``set_options()``); returns the stacked first observations."""
        options = [dict(o) for o in self._options]
        batch = self.pool.reset(seed=list(self._seeds), options=options)
        self.reset_infos = [info_of(r) for r in batch.results()]
        self._reset_seeds()
        self._reset_options()
        return self._stack(batch)

    def step_async(self, actions: np.ndarray[Any, Any]) -> None:
        """Remember the actions (a batch of action-space samples) for :meth:`step_wait`."""
        name = self._action_field
        if name is not None:
            # Discrete samples are ints: one list conversion instead of a binding call each.
            self._actions = [{name: int(a)} for a in np.asarray(actions).reshape(-1).tolist()]
            if len(self._actions) == self.num_envs:
                return
        back = self.actions.to_original
        self._actions = [self.spaces.action_of(back(actions[i])) for i in range(self.num_envs)]

    def step_wait(self) -> VecEnvStepReturn:
        """Step every session in one batch; ended episodes restart in the same step.

        Everything comes from the batch's columns (the pool's numpy path): observations,
        rewards and flags as arrays, ``infos`` from the metadata column; no typed
        observation is built per session (nor for an ended episode's final one when the
        space is one array or integer field: its wire value is converted directly).
        ``infos`` are what SB3's ``DummyVecEnv`` gives: every step's has
        ``TimeLimit.truncated``; an ended episode's is its final step's info plus
        ``terminal_observation`` (so ``is_success`` and the like reach callbacks), and the
        new episode's reset info goes to ``reset_infos``.
        """
        batch = self.pool.step(self._actions)
        terminated, truncated = batch.terminated, batch.truncated
        # One conversion to Python bools, not two numpy scalars read per session.
        time_limits = (truncated & ~terminated).tolist()
        to_gym = self.spaces.observation.to_gym
        convert: Callable[[Any], Any]
        if self._obs_column is not None:
            # One array or integer field: its wire value converts as the typed one does,
            # so an ended episode's last observation skips the model (a validation, then
            # a dump for to_gym).
            raw_infos, convert = batch.infos_with(to_gym), _as_is
        else:
            raw_infos, convert = batch.infos, self._observation
        infos: list[dict[str, Any]] = []
        for k, raw in enumerate(raw_infos):
            if not raw:  # most steps: no metadata, no ended episode
                infos.append({"TimeLimit.truncated": time_limits[k]})
                continue
            final = raw.get("final_obs")
            if final is None:
                info = info_copy(raw)
            else:
                # The pool's same-step info is the reset's, with the ended step's beside it.
                self.reset_infos[k] = info_copy(
                    {key: v for key, v in raw.items() if key not in _FINAL_KEYS}
                )
                info = info_copy(raw.get("final_info") or {})
                info["terminal_observation"] = convert(final)
            info["TimeLimit.truncated"] = time_limits[k]
            infos.append(info)
        dones = terminated | truncated
        return self._stack(batch), batch.rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        """Close the sessions and stop the servers the pool started (idempotent)."""
        if not self._closed:
            self._closed = True
            self.pool.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attributes every session shares (``render_mode``, the spaces, ``spec``)."""
        if attr_name == "render_mode":
            value: Any = self.render_mode
        elif attr_name in ("observation_space", "action_space", "spec", "metadata"):
            value = getattr(self, attr_name, None)
        else:
            raise AttributeError(
                f"remote sessions expose no attribute {attr_name!r}; a RemoteVecEnv knows "
                "render_mode, observation_space, action_space, spec and metadata"
            )
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Not possible: the environments live in other processes."""
        raise AttributeError(
            f"cannot set {attr_name!r} on remote sessions: their environments live in the "
            "server; pass settings as reset options (set_options) or server arguments"
        )

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **kwargs: Any
    ) -> list[Any]:
        """Not possible: the environments live in other processes."""
        raise AttributeError(
            f"cannot call {method_name!r} on remote sessions: only reset and step cross the wire"
        )

    def env_is_wrapped(self, wrapper_class: type[Any], indices: VecEnvIndices = None) -> list[bool]:
        """Remote environments are never wrapped on this side."""
        return [False for _ in self._get_indices(indices)]

    # -- internals ------------------------------------------------------------------

    def _stack(self, batch: PoolBatch[Any]) -> Any:
        stacked = self._stack_column(batch)
        if stacked is not None:
            return stacked
        samples = [self._observation(obs) for obs in batch.observations]
        self._observations = concatenate(self.observation_space, samples, self._observations)
        return deepcopy(self._observations)

    def _observation(self, observation: Any) -> Any:
        """One observation as a sample of :attr:`observation_space` (flattened if it is)."""
        sample = self.spaces.observation.to_gym(observation)
        flat = self.flat_observations
        return sample if flat is None else flat.flatten(sample)

    def _stack_column(self, batch: PoolBatch[Any]) -> np.ndarray[Any, Any] | None:
        """The observations straight from the batch's stacked column, as a fresh array of
        the space's dtype and shape, when the space is one array or integer field and
        the column stacked (else None: the per-session conversion handles the rest)."""
        if self._obs_column is None or len(batch) != self.num_envs:
            return None
        name, shape, dtype = self._obs_column
        column = batch.obs.get(name)
        if not isinstance(column, np.ndarray) or column.size != self._observations.size:
            return None
        stacked = np.asarray(column, dtype=dtype).reshape(shape)
        # A column stacked by the client is this call's own array; one read straight
        # from the reply's bytes is read-only, and SB3 (or a wrapper) may write into it.
        return stacked if stacked.flags.writeable else stacked.copy()


_ADAPTER_KEYWORDS = ("observation_fields", "max_text_length", "flatten")
"""Keywords of :meth:`RemoteVecEnv.from_env` / ``from_url`` that are the adapter's."""

_FINAL_KEYS = ("final_obs", "final_info")
"""The pool's SAME_STEP entries an ended episode's ``info`` trades for SB3's
``terminal_observation`` (its other entries are the reset's info, as they always were)."""


def _as_is(value: Any) -> Any:
    return value


def _single_field(model: ModelBinding) -> tuple[str, Binding] | None:
    """The name and binding of a model's one field (None when it has several)."""
    name = model.single
    return None if name is None else (name, model.fields[name])


def _plain_int(binding: Binding) -> bool:
    """A Discrete field of plain integers (no value table): its batch column and its
    actions are the gym samples as they are."""
    return isinstance(binding, DiscreteBinding) and binding.values is None


__all__ = ["RemoteVecEnv"]
