"""A remote corral session as a ``gymnasium.Env``.

    env = as_gymnasium(SyncEnvClient.from_env("corral.envs.wordle:WordleEnv"))
    obs, info = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

The spaces are derived from the contract's JSON Schemas (see
:mod:`corral.adapters.gymnasium.spaces`): for a served Gymnasium environment they are
exactly the original spaces; for any other corral environment the action space comes
from the Action model and the observation space from the Observation model without its
``done``/``truncated``/``reward``/``metadata`` fields (``metadata`` is returned as
``info``).

Like an environment from ``gymnasium.make``, a ``RemoteEnv`` has a :attr:`spec`
(``corral/<name>``, made by :func:`make_remote`: ``spec.make()`` opens another session of
the same server, as ``check_env`` does) and a ``render_mode``: ``"rgb_array"`` renders
the frame of the session's own environment on the server (its state carries the frame:
a Gymnasium environment served with ``--kwarg render_mode=rgb_array``), so wrappers such
as ``RecordVideo`` work.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.registration import EnvSpec
from pydantic import BaseModel

from corral.adapters.gymnasium.info import array_value
from corral.adapters.gymnasium.spaces import (
    DEFAULT_MAX_TEXT_LENGTH,
    OBSERVATION_BASE_FIELDS,
    ModelBinding,
    model_binding,
)
from corral.client import AsyncEnvClient, SyncEnvClient
from corral.contract import StepResult
from corral.contract.schema import model_schemas


@dataclass(frozen=True)
class ContractSpaces:
    """The Gymnasium view of a contract: the action and observation bindings."""

    action: ModelBinding
    observation: ModelBinding

    @classmethod
    def from_schemas(
        cls,
        schemas: dict[str, Any],
        *,
        observation_fields: Sequence[str] | None = None,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
    ) -> ContractSpaces:
        """Derive both spaces from ``{"action": schema, "observation": schema, ...}``.

        Raises:
            SpaceConversionError: a field has no Gymnasium space (pass ``observation_fields`` to
                keep only the fields that have one).
        """
        return cls(
            action=model_binding(schemas["action"], max_text_length=max_text_length),
            observation=model_binding(
                schemas["observation"],
                exclude=sorted(OBSERVATION_BASE_FIELDS),
                only=observation_fields,
                max_text_length=max_text_length,
            ),
        )

    @classmethod
    def from_client(
        cls,
        client: AsyncEnvClient[Any, Any, Any],
        *,
        observation_fields: Sequence[str] | None = None,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
    ) -> ContractSpaces:
        """Derive the spaces of a connected client's contract.

        The server's published schemas are used when the handshake carried them, else
        the schemas of the client's models (the same, by the contract fingerprint).
        """
        schemas = client.server_info.get("schemas")
        if not schemas:
            assert client.action_type and client.observation_type and client.state_type
            schemas = model_schemas(client.action_type, client.observation_type, client.state_type)
        return cls.from_schemas(
            schemas, observation_fields=observation_fields, max_text_length=max_text_length
        )

    def observation_of(self, result: StepResult[Any]) -> Any:
        """The observation sample of a step result."""
        return self.observation.to_gym(result.observation)

    def action_of(self, sample: Any) -> dict[str, Any]:
        """The action (as a dict for the Action model) for an action sample."""
        action: dict[str, Any] = self.action.from_gym(sample)
        return action


def info_of(result: StepResult[Any]) -> dict[str, Any]:
    """A step result's ``info``: its metadata with arrays and numpy scalars restored
    (see :mod:`corral.adapters.gymnasium.info`), as a fresh copy."""
    return info_copy(result.info)


def info_copy(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`info_of` for an ``info`` mapping (a pool batch's ``infos[i]``)."""
    if not metadata:  # most steps' info: nothing to restore or copy
        return {}
    info: dict[str, Any] = copy.deepcopy(array_value(dict(metadata), scalars=True))
    return info


_ADAPTER_KEYWORDS = ("observation_fields", "max_text_length", "render_mode")


class RemoteEnv(gymnasium.Env[Any, Any]):
    """A ``gymnasium.Env`` whose every call is a request to a remote corral session.

    Args:
        client: a client of the session (async clients are driven through ``.sync()``).
        observation_fields: keep only these observation fields in the space (for models
            with fields that have no Gymnasium space, such as free-form dicts).
        max_text_length: ``Text.max_length`` for strings whose schema sets no maximum.
        close_client: ``close()`` closes the client (and any server it started).
        render_mode: ``"rgb_array"`` (when the server renders frames) or None.

    Raises:
        SpaceConversionError: the contract has a field with no Gymnasium space.
        ValueError: ``render_mode`` is not one the server renders.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        client: SyncEnvClient[Any, Any, Any] | AsyncEnvClient[Any, Any, Any],
        *,
        observation_fields: Sequence[str] | None = None,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
        close_client: bool = True,
        render_mode: str | None = None,
    ) -> None:
        self.client = client.sync() if isinstance(client, AsyncEnvClient) else client
        self.client.connect()
        self.spaces = ContractSpaces.from_client(
            self.client.async_client,
            observation_fields=observation_fields,
            max_text_length=max_text_length,
        )
        self.action_space = self.spaces.action.space
        self.observation_space = self.spaces.observation.space
        self._close_client = close_client
        self._closed = False
        state_fields = self.client.async_client.state_type.model_fields  # type: ignore[union-attr]
        self.metadata = {"render_modes": ["rgb_array"] if "frame" in state_fields else []}
        fps = state_fields["render_fps"].default if "render_fps" in state_fields else None
        if fps is not None:
            self.metadata["render_fps"] = fps
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            self.close()
            raise ValueError(
                f"render_mode {render_mode!r} is not served: this server renders "
                f"{self.metadata['render_modes'] or 'nothing'} (serve a Gymnasium "
                "environment with '--kwarg render_mode=rgb_array' for frames)"
            )
        self.render_mode = render_mode
        name = str(self.client.async_client.server_info.get("env", {}).get("name") or "env")
        adapter = {"observation_fields": observation_fields, "max_text_length": max_text_length}
        # The copy reaches the server the way this session does (its dialer: the network,
        # or corral.testing's in-process one).
        reach = {"url": self.client.async_client.url, "dialer": self.client.async_client.dialer}
        self.spec = EnvSpec(
            id=f"corral/{_spec_name(name)}",
            entry_point="corral.adapters.gymnasium.remote:make_remote",
            kwargs={**reach, **adapter},
        )

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RemoteEnv:
        """Connect to the server at ``url``; ``kwargs`` go to :class:`AsyncEnvClient`
        except ``observation_fields``/``max_text_length``, which go to the adapter."""
        adapter = {k: kwargs.pop(k) for k in _ADAPTER_KEYWORDS if k in kwargs}
        return cls(AsyncEnvClient(url, **kwargs), **adapter)

    @classmethod
    def from_env(cls, target: str, **kwargs: Any) -> RemoteEnv:
        """Start ``target`` (``module:Class`` or ``gym:ENV_ID``) in a local server and
        connect; the server stops when the environment closes."""
        adapter = {k: kwargs.pop(k) for k in _ADAPTER_KEYWORDS if k in kwargs}
        return cls(SyncEnvClient.from_env(target, **kwargs), **adapter)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the remote episode; ``options`` become the environment's reset options."""
        super().reset(seed=seed)
        result = self.client.reset(seed, **(options or {}))
        return self.spaces.observation_of(result), info_of(result)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Send ``action`` (a sample of :attr:`action_space`) and return Gymnasium's 5-tuple."""
        result = self.client.step(self.spaces.action_of(action))
        reward = 0.0 if result.reward is None else float(result.reward)
        return (
            self.spaces.observation_of(result),
            reward,
            bool(result.terminated),
            bool(result.truncated),
            info_of(result),
        )

    def render(self) -> Any:
        """The current frame (``rgb_array``: an ``(H, W, 3)`` uint8 array), rendered by
        the session's environment on the server; None without a render mode."""
        if self.render_mode is None:
            return None
        return np.asarray(getattr(self.client.state(), "frame"))  # noqa: B009

    def state(self) -> BaseModel:
        """The remote environment's typed State (not part of Gymnasium's API)."""
        state: BaseModel = self.client.state()
        return state

    def close(self) -> None:
        """Close the session (and its client, unless ``close_client=False``); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._close_client:
            self.client.close()


def make_remote(url: str, render_mode: str | None = None, **kwargs: Any) -> RemoteEnv:
    """A :class:`RemoteEnv` on a new session of the server at ``url``: the entry point of
    a ``RemoteEnv``'s spec (``gymnasium.make(env.spec, render_mode=...)``)."""
    return RemoteEnv.from_url(url, render_mode=render_mode, **kwargs)


def _spec_name(name: str) -> str:
    # EnvSpec ids are ``[namespace/]name[-vN]``; keep a served Gymnasium env's own id.
    stem = name.removeprefix("gym:").rpartition(":")[2]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem) or "env"


def as_gymnasium(
    client: SyncEnvClient[Any, Any, Any] | AsyncEnvClient[Any, Any, Any], **kwargs: Any
) -> RemoteEnv:
    """The session of ``client`` as a ``gymnasium.Env`` (see :class:`RemoteEnv`)."""
    return RemoteEnv(client, **kwargs)
