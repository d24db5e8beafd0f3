"""Serving any Gymnasium environment as a corral environment.

    CartPole = GymEnvironment.for_id("CartPole-v1")        # an Environment subclass
    create_app(CartPole)                                   # or: corral serve gym:CartPole-v1

The action model has one field, ``action``, and the observation model one field,
``observation``, typed from the spaces (see :mod:`corral.adapters.gymnasium.spaces`).
``reset(seed, **options)`` calls ``env.reset(seed=seed, options=options)``; ``terminated``
and ``truncated`` map to the observation's ``done``/``truncated``; ``info`` travels as the
observation's ``metadata`` (numpy values included, see :mod:`.info`).

An environment made with ``render_mode="rgb_array"`` (``corral serve gym:ID --kwarg
render_mode=rgb_array``) has the state model :class:`GymFrameState`: ``state()`` carries
the frame ``env.render()`` returns, so a remote ``RemoteEnv.render()`` gets the frame of
the session's own environment, on demand (steps stay frame-free).
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, SupportsFloat

import gymnasium
from pydantic import AfterValidator, Field, PlainSerializer, PlainValidator, create_model
from pydantic_core import core_schema

from corral.adapters.gymnasium.info import array_value, json_value, wire_value
from corral.adapters.gymnasium.spaces import Binding, SpaceConversionError, field_for_space
from corral.contract import Action, Environment, Observation, State
from corral.contract.arrays import NDArray

GYM_PREFIX = "gym:"
"""The ``corral serve`` target prefix naming a registered Gymnasium environment."""


class GymState(State):
    """A served Gymnasium environment's state.

    Attributes:
        env_id: the Gymnasium id (or the factory's name).
        seed: the seed of the last reset (``None`` when unseeded).
        episode_return: the sum of the episode's rewards so far.
        terminated / truncated: how the episode ended, if it did.
    """

    env_id: str = ""
    seed: int | None = None
    episode_return: float = 0.0
    terminated: bool = False
    truncated: bool = False


class GymFrameState(GymState):
    """The state of an environment rendering ``rgb_array`` frames: ``frame`` is what
    ``env.render()`` returned when the state was asked for. Each served class has its own
    subclass whose ``render_fps`` default is the environment's ``metadata["render_fps"]``,
    so clients read it from the contract's schema."""

    frame: NDArray | None = None
    render_fps: float | None = None


def _validate_info(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"metadata must be a dict, got {type(value).__name__}")
    decoded: dict[str, Any] = array_value(value)
    return decoded


def _serialize_info(value: dict[str, Any], info: core_schema.SerializationInfo) -> Any:
    return json_value(value) if info.mode == "json" else value


InfoDict = Annotated[
    dict[str, Any],
    PlainValidator(_validate_info, json_schema_input_type=dict[str, Any]),
    PlainSerializer(_serialize_info),
]
"""A Gymnasium ``info`` dict whose numpy arrays cross both codecs."""


class GymObservation(Observation):
    """Base of served Gymnasium observations: ``metadata`` is the step's ``info``."""

    metadata: InfoDict = Field(default_factory=dict)


class GymEnvironment(Environment[Action, GymObservation, GymState]):
    """A Gymnasium environment served by corral; build subclasses with :meth:`for_id`.

    Class attributes set by :meth:`for_factory`:
        make_env: the zero-argument callable building the Gymnasium environment.
        action_binding / observation_binding: the conversions of the spaces' samples.
        action_space / observation_space: the spaces the models were generated from.
    """

    # Renderers (pygame, OpenGL) need the thread that created them; a class made by
    # for_factory keeps this only when its environments render. Without it, a batch's
    # sessions run in one executor call instead of one thread hop each.
    thread_affinity = True
    make_env: ClassVar[Callable[[], gymnasium.Env[Any, Any]]]
    action_binding: ClassVar[Binding]
    observation_binding: ClassVar[Binding]
    action_space: ClassVar[gymnasium.Space[Any]]
    observation_space: ClassVar[gymnasium.Space[Any]]
    env_id: ClassVar[str] = ""

    def __init__(self) -> None:
        cls = type(self)
        if not hasattr(cls, "make_env"):
            raise TypeError(
                "GymEnvironment is a template: serve GymEnvironment.for_id('CartPole-v1') "
                "or GymEnvironment.for_factory(make_env, name=...)"
            )
        env = cls.make_env()
        if env.action_space != cls.action_space or env.observation_space != cls.observation_space:
            env.close()
            raise SpaceConversionError(
                f"{cls.env_id}: the factory built an environment whose spaces differ from the "
                "ones the contract was generated from; it must build the same spaces every time"
            )
        self.env = env
        # The episode's bookkeeping as plain attributes, made a GymState only when asked
        # for: four validated assignments per step cost more than CartPole's step itself.
        self._seed: int | None = None
        self._episode_id: str | None = None
        self._steps = 0
        self._return = 0.0
        self._terminated = self._truncated = False

    def reset(self, seed: int | None = None, **options: Any) -> GymObservation:
        """``env.reset(seed=seed, options=options)`` (``options=None`` when empty)."""
        obs, info = self.env.reset(seed=seed, options=options or None)
        self._seed, self._episode_id = seed, uuid.uuid4().hex
        self._steps, self._return = 0, 0.0
        self._terminated = self._truncated = False
        return self._observation(obs, info, None, terminated=False, truncated=False)

    def step(self, action: Action) -> GymObservation:
        """Convert ``action.action`` to a sample of the action space and step the env."""
        sample = type(self).action_binding.to_gym(getattr(action, "action"))  # noqa: B009
        obs, reward, terminated, truncated, info = self.env.step(sample)
        self._steps += 1
        self._return += float(reward)
        self._terminated, self._truncated = bool(terminated), bool(truncated)
        return self._observation(obs, info, reward, terminated=terminated, truncated=truncated)

    def state(self) -> GymState:
        """The episode's state (with the rendered frame, for ``rgb_array``)."""
        state_type: Any = type(self).state_type
        fields: dict[str, Any] = {
            "env_id": type(self).env_id,
            "seed": self._seed,
            "episode_id": self._episode_id,
            "step_count": self._steps,
            "episode_return": self._return,
            "terminated": self._terminated,
            "truncated": self._truncated,
        }
        if issubclass(state_type, GymFrameState):
            frame_state: GymState = state_type(**fields, frame=self.env.render())
            return frame_state
        return GymState(**fields)

    def close(self) -> None:
        """Close the Gymnasium environment."""
        self.env.close()

    def _observation(
        self,
        obs: Any,
        info: dict[str, Any],
        reward: SupportsFloat | None,
        *,
        terminated: bool,
        truncated: bool,
    ) -> GymObservation:
        model: Any = type(self).observation_type
        observation: GymObservation = model(
            observation=type(self).observation_binding.from_gym(obs),
            reward=None if reward is None else float(reward),
            done=bool(terminated or truncated),
            truncated=bool(truncated),
            metadata=wire_value(info),
        )
        return observation

    @classmethod
    def for_id(cls, env_id: str, **make_kwargs: Any) -> type[GymEnvironment]:
        """The environment class serving ``gymnasium.make(env_id, **make_kwargs)``.

        Raises:
            ValueError: ``env_id`` is not registered (the message lists close matches).
            SpaceConversionError: a space has no contract counterpart.
        """
        module, sep, registered = env_id.rpartition(":")
        if sep:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(
                    f"cannot load Gymnasium environment {env_id!r}: importing {module!r} "
                    f"failed ({exc}); check that it is importable and registers {registered!r}"
                ) from None
        try:
            gymnasium.spec(registered)
        except gymnasium.error.Error as exc:
            raise ValueError(f"unknown Gymnasium environment {env_id!r}: {exc}") from None
        make = functools.partial(gymnasium.make, env_id, **make_kwargs)
        return cls.for_factory(make, name=env_id)

    @classmethod
    def for_factory(
        cls,
        make_env: Callable[[], gymnasium.Env[Any, Any]],
        *,
        name: str,
        description: str = "",
        contract_version: str = "1.0.0",
    ) -> type[GymEnvironment]:
        """The environment class serving the environments ``make_env()`` builds.

        ``make_env`` is called once here to read the spaces (that instance is closed),
        then once per session.

        Raises:
            SpaceConversionError: a space has no contract counterpart.
        """
        probe = make_env()
        try:
            action_space, observation_space = probe.action_space, probe.observation_space
            spec = probe.spec
            renders = getattr(probe, "render_mode", None) is not None
            frames = probe.render_mode == "rgb_array"
            fps = probe.metadata.get("render_fps")
        finally:
            probe.close()
        stem = _class_stem(name)
        action_type, action_binding = _action_model(stem, action_space)
        observation_type, observation_binding = _observation_model(stem, observation_space)
        attrs: dict[str, Any] = {
            "__module__": cls.__module__,
            "__doc__": f"The Gymnasium environment {name!r} served by corral.",
            "make_env": staticmethod(make_env),
            "env_id": name,
            "name": f"{GYM_PREFIX}{name}",
            "description": description or _describe(name, spec, action_space, observation_space),
            "contract_version": contract_version,
            "action_type": action_type,
            "observation_type": observation_type,
            "state_type": _frame_state(stem, fps) if frames else GymState,
            "action_binding": action_binding,
            "observation_binding": observation_binding,
            "action_space": action_space,
            "observation_space": observation_space,
            "thread_affinity": renders,
        }
        env_class: type[GymEnvironment] = type(f"{stem}Env", (cls,), attrs)
        return env_class


def _frame_state(stem: str, fps: Any) -> type[GymFrameState]:
    model: type[GymFrameState] = create_model(
        f"{stem}State",
        __base__=GymFrameState,
        render_fps=(float | None, None if fps is None else float(fps)),
    )
    return model


def _class_stem(name: str) -> str:
    parts = re.split(r"[^0-9A-Za-z]+", name.rpartition(":")[2])
    stem = "".join(part[:1].upper() + part[1:] for part in parts if part)
    return stem if stem[:1].isalpha() else f"Gym{stem}"


def _describe(
    name: str,
    spec: Any,
    action_space: gymnasium.Space[Any],
    observation_space: gymnasium.Space[Any],
) -> str:
    limit = getattr(spec, "max_episode_steps", None)
    text = f"Gymnasium {name}: actions {action_space}, observations {observation_space}"
    return text + (f", at most {limit} steps per episode." if limit else ".")


def _action_model(stem: str, space: gymnasium.Space[Any]) -> tuple[type[Action], Binding]:
    annotation, binding = field_for_space(space, f"{stem}Action.action")

    def in_space(value: Any) -> Any:
        # The schema states the bounds; this enforces the rest (Box bounds, charsets).
        if not space.contains(binding.to_gym(value)):
            raise ValueError(f"action {value!r} is not in the action space {space}")
        return value

    # A Discrete space's bounds are the field's, all there is to check: the in_space
    # check would repeat them for every action the server admits.
    checked: Any = annotation
    if type(space) is not gymnasium.spaces.Discrete:
        checked = Annotated[annotation, AfterValidator(in_space)]
    model = create_model(
        f"{stem}Action",
        __base__=Action,
        __doc__=f"An action of {stem}: a sample of {space}.",
        action=(checked, Field(description=f"A sample of the action space {space}.")),
    )
    return model, binding


def _observation_model(
    stem: str, space: gymnasium.Space[Any]
) -> tuple[type[GymObservation], Binding]:
    annotation, binding = field_for_space(space, f"{stem}Observation.observation")
    model = create_model(
        f"{stem}Observation",
        __base__=GymObservation,
        __doc__=f"An observation of {stem}; metadata is the step's info.",
        observation=(annotation, Field(description=f"A sample of the observation space {space}.")),
    )
    return model, binding


def serve_target(
    target: str, *, search_path: str | Path | None = None, make_kwargs: dict[str, Any] | None = None
) -> type[GymEnvironment]:
    """The environment class for a ``corral serve`` target ``gym:ENV_ID``.

    ``ENV_ID`` is anything ``gymnasium.make`` takes, including ``module:Name-v0`` for an
    environment that ``module`` registers on import (``search_path`` is put first on
    ``sys.path`` to find it); ``make_kwargs`` go to ``gymnasium.make`` (``--kwarg``).

    Raises:
        ValueError: the target lacks the prefix or names no registered environment.
    """
    if not target.startswith(GYM_PREFIX) or not target[len(GYM_PREFIX) :]:
        raise ValueError(f"a Gymnasium target looks like 'gym:CartPole-v1', got {target!r}")
    if search_path is not None:
        path = str(Path(search_path).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    return GymEnvironment.for_id(target[len(GYM_PREFIX) :], **(make_kwargs or {}))
