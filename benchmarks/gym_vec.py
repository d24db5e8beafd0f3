"""Gymnasium's ``AsyncVectorEnv`` as an SB3 ``VecEnv``: the PPO section's fourth contender.

SB3 does not take a Gymnasium vector environment: its ``VecEnv`` resets finished
episodes itself and hands the last observation over in ``infos[i]["terminal_observation"]``.
:class:`GymnasiumVecEnv` runs an ``AsyncVectorEnv`` (one process per environment, shared
memory for observations) in Gymnasium's ``SAME_STEP`` autoreset mode, which does the same,
and translates the final observations and infos to SB3's form. Nothing else happens in
it: each ``step`` is one ``AsyncVectorEnv.step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn


class GymnasiumVecEnv(VecEnv):
    """An SB3 view of ``AsyncVectorEnv(env_fns)`` (see the module docstring)."""

    def __init__(self, env_fns: Sequence[Callable[[], gymnasium.Env[Any, Any]]]) -> None:
        self.vector = AsyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        super().__init__(
            len(env_fns), self.vector.single_observation_space, self.vector.single_action_space
        )
        self._actions: np.ndarray[Any, Any] | None = None

    def reset(self) -> VecEnvObs:
        obs, _ = self.vector.reset(seed=self._seeds[0] if self._seeds else None)
        self._reset_seeds()
        return obs  # type: ignore[no-any-return]

    def step_async(self, actions: np.ndarray[Any, Any]) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        assert self._actions is not None
        obs, rewards, terminated, truncated, info = self.vector.step(self._actions)
        dones = terminated | truncated
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        final = info.get("final_obs")
        for i in np.flatnonzero(dones):
            if final is not None:
                infos[i]["terminal_observation"] = final[i]
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.vector.close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        values = self.vector.get_attr(attr_name)
        return [values[i] for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        self.vector.set_attr(attr_name, value)

    def env_method(
        self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any
    ) -> list[Any]:
        values = self.vector.call(method_name, *method_args, **method_kwargs)
        return [values[i] for i in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[Any], indices: Any = None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]
