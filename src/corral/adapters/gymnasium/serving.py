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

**Snapshots**, where the wrapped environment allows them: a classic-control-style
environment whose whole dynamic state is ``unwrapped.state`` (a numeric array or tuple;
set at construction, or at reset for Gymnasium's own classic-control environments),
with a Box observation space, wrapped in nothing but ``gymnasium.make``'s own wrappers
(``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker``). CartPole, MountainCar,
Acrobot and Pendulum are. The snapshot (:class:`GymSnapshot`) carries that state, the
episode attributes those environments keep beside it (``steps_beyond_terminated``,
``last_u``), the generator's state (``np_random``), the wrappers' counters (the
``TimeLimit`` step count), the episode's bookkeeping and the last observation, so a
restored session continues exactly. Any other environment declares no snapshot (its
sessions are refused with ``SNAPSHOT_UNSUPPORTED``), since corral cannot know where its
state lives: a wrapper of its own (a frame stack, a statistics recorder) or a physics
engine's buffers would be silently lost.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, SupportsFloat

import gymnasium
import numpy as np
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit
from pydantic import AfterValidator, Field, PlainSerializer, PlainValidator, create_model
from pydantic_core import core_schema

from corral.adapters.gymnasium.info import array_value, json_value, wire_value
from corral.adapters.gymnasium.spaces import (
    ArrayBinding,
    Binding,
    DiscreteBinding,
    SpaceConversionError,
    field_for_space,
)
from corral.contract import Action, Environment, Observation, Snapshot, State
from corral.contract.arrays import NDArray
from corral.errors import BadSnapshot
from corral.protocol.codecs import PYTHON_DUMP

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


_WRAPPER_STATE: dict[type[Any], tuple[str, ...]] = {
    TimeLimit: ("_elapsed_steps",),
    OrderEnforcing: ("_has_reset",),
    # Its checks ran on the environment the snapshot was taken of: the restored one is
    # marked checked (its first step would otherwise compare against a reset it never had).
    PassiveEnvChecker: (),
}
"""The wrappers ``gymnasium.make`` adds, with the attributes that are their state."""

_CHECKED = ("checked_reset", "checked_step", "checked_data_reuse")
"""The ``PassiveEnvChecker`` flags a restored environment gets set."""

_EPISODE_ATTRIBUTES = ("steps_beyond_terminated", "last_u")
"""Attributes classic-control environments keep beside ``state`` during an episode."""

_CLASSIC_CONTROL = "gymnasium.envs.classic_control."
"""Where Gymnasium's classic-control environments live (some set ``state`` at reset)."""

_BIT_GENERATORS = frozenset({"PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"})
"""numpy's bit generators a snapshot may name (it is untrusted input: never getattr on
any name it carries)."""


class GymSnapshot(Snapshot):
    """A served Gymnasium session (see the module docstring); each served class has its
    subclass whose ``last`` is its own observation model.

    Attributes:
        env_state: ``unwrapped.state`` (None before the first reset).
        state_is_tuple: the environment keeps its state as a tuple, not an array.
        episode: the episode attributes kept beside it (``steps_beyond_terminated``...).
        rng: the state of ``unwrapped.np_random``'s bit generator, as JSON text (its
            integers exceed 64 bits).
        rng_seed: ``unwrapped.np_random_seed``.
        wrappers: each wrapper's state, keyed ``Wrapper.attribute``.
        seed / episode_id / steps / episode_return / terminated / truncated: the
            served episode's bookkeeping.
        last: the observation the session returned last.
    """

    env_state: NDArray | None = None
    state_is_tuple: bool = False
    episode: dict[str, float | int | None] = Field(default_factory=dict)
    rng: str | None = None
    rng_seed: int | None = None
    wrappers: dict[str, int | bool | None] = Field(default_factory=dict)
    seed: int | None = None
    episode_id: str | None = None
    steps: int = Field(default=0, ge=0)
    episode_return: float = 0.0
    terminated: bool = False
    truncated: bool = False
    last: GymObservation | None = None


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
    plain_observation: ClassVar[Callable[[Any], bool] | None] = None
    """When a converted observation sample is one plain value (an array, an integer):
    whether it is exactly what validating it gives, so the model is built without
    validation (see :func:`_plain_check`)."""

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
        self._last: GymObservation | None = None

    def reset(self, seed: int | None = None, **options: Any) -> GymObservation:
        """``env.reset(seed=seed, options=options)`` (``options=None`` when empty)."""
        obs, info = self.env.reset(seed=seed, options=options or None)
        self._seed, self._episode_id = seed, uuid.uuid4().hex
        self._steps, self._return = 0, 0.0
        self._terminated = self._truncated = False
        self._last = self._observation(obs, info, None, terminated=False, truncated=False)
        return self._last

    def step(self, action: Action) -> GymObservation:
        """Convert ``action.action`` to a sample of the action space and step the env."""
        sample = type(self).action_binding.to_gym(getattr(action, "action"))  # noqa: B009
        obs, reward, terminated, truncated, info = self.env.step(sample)
        self._steps += 1
        self._return += float(reward)
        self._terminated, self._truncated = bool(terminated), bool(truncated)
        self._last = self._observation(
            obs, info, reward, terminated=terminated, truncated=truncated
        )
        return self._last

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
        cls = type(self)
        model: Any = cls.observation_type
        value = cls.observation_binding.from_gym(obs)
        metadata = wire_value(info)
        score = None if reward is None else float(reward)
        done, cut = bool(terminated or truncated), bool(truncated)
        valid = cls.plain_observation
        if valid is not None and valid(value) and type(metadata) is dict:
            # Every value is already what validating it gives (the observation checked
            # just now, the info through its own validator unless empty): build the
            # model without pydantic's pass, which costs as much as CartPole's step.
            return _assembled(
                model,
                {
                    "done": done,
                    "truncated": cut,
                    "reward": score,
                    "reward_components": {},
                    "metadata": _validate_info(metadata) if metadata else metadata,
                    "observation": value,
                },
            )
        observation: GymObservation = model(
            observation=value, reward=score, done=done, truncated=cut, metadata=metadata
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
        then once per session. When the environment allows snapshots (see the module
        docstring; that instance is then reset once to read its state's shape), the
        class is a :class:`SnapshotGymEnvironment`.

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
            support = None if cls.has_snapshots() else snapshot_support(probe)
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
            "plain_observation": _plain_check(observation_binding),
            "action_space": action_space,
            "observation_space": observation_space,
            "thread_affinity": renders,
        }
        bases: tuple[type[GymEnvironment], ...] = (cls,)
        if isinstance(support, tuple):
            bases = (
                (SnapshotGymEnvironment,)
                if cls is GymEnvironment
                else (cls, SnapshotGymEnvironment)
            )
            attrs["state_shape"] = support
            last: Any = observation_type | None
            attrs["snapshot_type"] = create_model(
                f"{stem}Snapshot",
                __base__=GymSnapshot,
                __doc__=f"A session of {name}: its whole state (see GymSnapshot).",
                last=(last, None),
            )
        env_class: type[GymEnvironment] = type(f"{stem}Env", bases, attrs)
        return env_class


class SnapshotGymEnvironment(GymEnvironment):
    """A :class:`GymEnvironment` whose wrapped environment allows snapshots (see the
    module docstring); :meth:`GymEnvironment.for_factory` picks it when it does."""

    snapshot_type: ClassVar[type[Snapshot] | None] = GymSnapshot
    state_shape: ClassVar[tuple[int, ...]] = ()
    """The shape of ``unwrapped.state`` after a reset (a snapshot's must match)."""

    def snapshot(self) -> GymSnapshot:
        """The session's whole state (see :class:`GymSnapshot`)."""
        unwrapped = self.env.unwrapped
        state = getattr(unwrapped, "state", None)
        generator = getattr(unwrapped, "_np_random", None)
        seed = getattr(unwrapped, "_np_random_seed", None)
        model: Any = type(self).snapshot_type
        snapshot: GymSnapshot = model(
            env_state=None if state is None else np.array(state),  # its dtype kept
            state_is_tuple=isinstance(state, tuple),
            episode={
                name: _plain(getattr(unwrapped, name))
                for name in _EPISODE_ATTRIBUTES
                if hasattr(unwrapped, name)
            },
            rng=None if generator is None else json.dumps(generator.bit_generator.state),
            rng_seed=seed if isinstance(seed, int) else None,
            wrappers={key: getattr(*where) for key, where in _wrapper_state(self.env).items()},
            seed=self._seed,
            episode_id=self._episode_id,
            steps=self._steps,
            episode_return=self._return,
            terminated=self._terminated,
            truncated=self._truncated,
            last=self._last,
        )
        return snapshot

    def restore(self, snapshot: GymSnapshot) -> GymObservation:
        """Put ``snapshot``'s state into this session's (fresh) environment.

        Raises:
            BadSnapshot: its state, generator or wrappers do not fit this environment.
        """
        unwrapped: Any = self.env.unwrapped
        if snapshot.env_state is not None:
            array = np.asarray(snapshot.env_state)
            if array.shape != type(self).state_shape or array.dtype.kind not in "biuf":
                raise BadSnapshot(
                    f"the snapshot's state is {array.dtype} of shape {array.shape}, "
                    f"{type(self).env_id}'s numbers of shape {type(self).state_shape}",
                    details={"field": "env_state"},
                )
            unwrapped.state = tuple(array.tolist()) if snapshot.state_is_tuple else array.copy()
        for name, value in snapshot.episode.items():
            if name not in _EPISODE_ATTRIBUTES:
                raise BadSnapshot(
                    f"{type(self).env_id} keeps no episode attribute {name!r}",
                    details={"field": "episode"},
                )
            setattr(unwrapped, name, value)
        if snapshot.rng is not None:
            unwrapped.np_random = _generator(snapshot.rng)
            unwrapped._np_random_seed = snapshot.rng_seed
        wrappers = _wrapper_state(self.env)
        for wrapper, _ in _wrappers(self.env):
            if isinstance(wrapper, PassiveEnvChecker):
                for flag in _CHECKED:
                    setattr(wrapper, flag, True)
        for key, value in snapshot.wrappers.items():
            if key not in wrappers:
                raise BadSnapshot(
                    f"{type(self).env_id} has no wrapper state {key!r}",
                    details={"field": "wrappers"},
                )
            setattr(*wrappers[key], value)
        self._seed, self._episode_id = snapshot.seed, snapshot.episode_id
        self._steps, self._return = snapshot.steps, snapshot.episode_return
        self._terminated, self._truncated = snapshot.terminated, snapshot.truncated
        self._last = snapshot.last
        if snapshot.last is not None:
            return snapshot.last
        # Never reset: no observation yet; the session must be reset before a step.
        return self._observation(
            _empty(type(self).observation_space), {}, None, terminated=False, truncated=False
        )


def _wrappers(env: gymnasium.Env[Any, Any]) -> list[tuple[Any, tuple[str, ...]]]:
    """Each wrapper of ``env``'s chain with the attributes that are its state."""
    found = []
    while isinstance(env, gymnasium.Wrapper):
        found.append((env, _WRAPPER_STATE[type(env)]))
        env = env.env
    return found


def _wrapper_state(env: gymnasium.Env[Any, Any]) -> dict[str, tuple[Any, str]]:
    """Where each wrapper's state is: ``{"Wrapper.attribute": (wrapper, attribute)}``."""
    return {
        f"{type(wrapper).__name__}.{name}": (wrapper, name)
        for wrapper, names in _wrappers(env)
        for name in names
    }


def _plain(value: Any) -> Any:
    """A numpy scalar (Pendulum's ``last_u``) as a Python number."""
    return value.item() if isinstance(value, np.generic) else value


def _generator(text: str) -> np.random.Generator:
    """The generator a snapshot's ``rng`` describes.

    Raises:
        BadSnapshot: not the JSON of a known bit generator's state.
    """
    try:
        state = json.loads(text)
        name = state["bit_generator"]
        if name not in _BIT_GENERATORS:
            raise ValueError(f"unknown bit generator {name!r}")
        bit_generator = getattr(np.random, name)()
        bit_generator.state = state
    except (ValueError, KeyError, TypeError) as exc:
        raise BadSnapshot(
            f"the snapshot's generator state is not usable: {exc}", details={"field": "rng"}
        ) from None
    return np.random.Generator(bit_generator)


def _empty(space: gymnasium.Space[Any]) -> Any:
    """A placeholder sample of a Box space: zeros, clipped into its bounds."""
    assert isinstance(space, gymnasium.spaces.Box)
    return np.clip(np.zeros(space.shape, space.dtype), space.low, space.high)


def snapshot_support(env: gymnasium.Env[Any, Any]) -> tuple[int, ...] | str:
    """The shape of ``env``'s state when its sessions can be snapshotted, else why not.

    ``env`` is a probe: it is reset (seed 0) when its shape fits, to read the state.
    """
    wrapper: Any = env
    while isinstance(wrapper, gymnasium.Wrapper):
        if type(wrapper) not in _WRAPPER_STATE:
            return f"it is wrapped in {type(wrapper).__name__}, whose state corral cannot carry"
        wrapper = wrapper.env
    unwrapped = env.unwrapped
    classic = type(unwrapped).__module__.startswith(_CLASSIC_CONTROL)
    if not (classic or hasattr(unwrapped, "state")):
        return "its state is not in unwrapped.state (not a classic-control environment)"
    if not isinstance(env.observation_space, gymnasium.spaces.Box):
        return "its observation space is not a Box"
    env.reset(seed=0)
    state = getattr(unwrapped, "state", None)
    try:
        array = np.asarray(state)
    except (TypeError, ValueError):
        return f"its state is a {type(state).__name__}, not numbers"
    if not isinstance(state, np.ndarray | tuple) or array.dtype.kind not in "biuf":
        return f"its state is a {type(state).__name__}, not an array or tuple of numbers"
    return tuple(array.shape)


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
    if _plain_check(binding) is not None:
        setattr(model, PYTHON_DUMP, _python_dump)
    return model, binding


_FIELDS_SET = frozenset({"observation", "reward", "done", "truncated", "metadata"})
"""The fields :meth:`GymEnvironment._observation` sets (its validated construction's)."""


def _plain_check(binding: Binding) -> Callable[[Any], bool] | None:
    """For an observation space whose samples convert to one plain value, the check
    that a converted sample passes validation unchanged (the field's fast path: an
    ndarray of exactly its dtype and shape, an ``int`` in its bounds); else None."""
    space = binding.space
    if isinstance(binding, ArrayBinding):
        dtype, shape = space.dtype, space.shape

        def array(value: Any) -> bool:
            return type(value) is np.ndarray and value.dtype == dtype and value.shape == shape

        return array
    if isinstance(binding, DiscreteBinding) and binding.values is None:
        assert isinstance(space, gymnasium.spaces.Discrete)
        low, high = int(space.start), int(space.start + space.n - 1)

        def integer(value: Any) -> bool:
            return type(value) is int and low <= value <= high

        return integer
    return None


def _assembled(model: type[GymObservation], values: dict[str, Any]) -> GymObservation:
    """An instance of ``model`` holding ``values`` (every field, each already valid), as
    its validated construction from :data:`_FIELDS_SET` leaves it (what
    ``model_construct`` does, without its per-field Python loop)."""
    observation = model.__new__(model)
    object.__setattr__(observation, "__dict__", values)
    object.__setattr__(observation, "__pydantic_fields_set__", set(_FIELDS_SET))
    object.__setattr__(observation, "__pydantic_extra__", None)
    object.__setattr__(observation, "__pydantic_private__", None)
    return observation


def _python_dump(observation: GymObservation) -> dict[str, Any]:
    """The python-mode dump of a generated observation whose ``observation`` field is
    plain (see :data:`~corral.protocol.codecs.PYTHON_DUMP`): what pydantic's serializer
    gives, field by field in its order, without its ~2 µs for passing an array through."""
    values = observation.__dict__
    out = {"done": values["done"], "truncated": values["truncated"], "reward": values["reward"]}
    components = values["reward_components"]
    if components:  # left out when empty, as the field's exclude_if does
        out["reward_components"] = dict(components)
    metadata = values["metadata"]
    out["metadata"] = dict(metadata) if metadata else {}
    out["observation"] = values["observation"]
    return out


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
