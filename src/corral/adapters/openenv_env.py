"""Serve an environment written for OpenEnv with corral, unchanged.

    corral serve my_env.server.my_environment:MyEnvironment     # detected and adapted

    from corral.adapters.openenv_env import from_openenv
    Env = from_openenv(MyEnvironment, action_type=MyAction, observation_type=MyObservation)
    corral.server.serve(Env)

An OpenEnv environment subclasses ``openenv.core.env_server.interfaces.Environment``
with OpenEnv ``Action``/``Observation``/``State`` models; its ``state`` is a property
and ``reset``/``step`` take OpenEnv's keywords. :func:`from_openenv` builds a corral
:class:`~corral.contract.Environment` around it:

* each OpenEnv model gets a corral twin that *subclasses* it (and corral's base), so
  the author's fields, constraints and validators all apply, the action the OpenEnv
  code receives is an instance of its own class, and corral's wire-safety check runs;
* the models come from the generic parameters (``Environment[MyAction, MyObs, MyState]``)
  or, failing that, from the annotations of ``step`` and of the ``state`` property, or
  from the arguments;
* ``reset_async``/``step_async`` overrides are awaited on the event loop; otherwise the
  sync methods run on one thread per session (OpenEnv's own rule);
* reset keywords the OpenEnv ``reset`` does not take are refused with a clear error
  (OpenEnv drops them silently), except ``episode_id``, which every OpenEnv client may
  send;
* ``get_metadata()`` supplies the name and description when the class gives them.

Not carried over: ``SUPPORTS_CONCURRENT_SESSIONS`` (corral's capacity is the server's
``--max-sessions``; pass ``--max-sessions 1`` for an environment that cannot run twice in
one process), transforms/rubrics (they run inside the OpenEnv code as usual), and
OpenEnv's MCP environments' ``list_tools``/``call_tool`` step actions.

Needs ``openenv-core`` installed (``pip install 'corral[openenv]'``).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel, create_model

from corral.contract import Action, Environment, Observation, State
from corral.contract.options import accepted_reset_options, check_reset_options

_OPENENV_BASE = ("openenv.core.env_server.interfaces", "Environment")


def is_openenv_environment(obj: Any) -> bool:
    """True for a subclass of OpenEnv's ``Environment`` (checked without importing openenv)."""
    if not isinstance(obj, type):
        return False
    return any((k.__module__, k.__qualname__) == _OPENENV_BASE for k in obj.__mro__[1:])


def _openenv() -> Any:
    try:
        from openenv.core.env_server import interfaces, types
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "serving an OpenEnv environment needs openenv-core: pip install 'corral[openenv]'"
        ) from exc
    return interfaces, types


def _twin(model: type[BaseModel], corral_base: type[BaseModel]) -> type[BaseModel]:
    """A corral model subclassing the OpenEnv ``model`` (fields, validators, name kept)."""
    if issubclass(model, corral_base):
        return model
    twin = create_model(model.__name__, __base__=(model, corral_base), __module__=model.__module__)
    twin.__doc__ = model.__doc__
    twin.__qualname__ = model.__qualname__
    return twin


def _models_from_generics(cls: type, base: type) -> list[Any]:
    for klass in cls.__mro__:
        for orig in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(orig)
            if isinstance(origin, type) and issubclass(origin, base):
                args = [a if isinstance(a, type) else None for a in typing.get_args(orig)]
                if any(args):
                    return args + [None] * (3 - len(args))
    return [None, None, None]


def _model_hint(hint: Any) -> Any:
    """``hint`` if it names a class (``Any`` and unions name none), else None."""
    return hint if isinstance(hint, type) and hint is not Any else None


def _models_from_annotations(cls: Any) -> list[Any]:
    found: list[Any] = [None, None, None]
    try:
        hints = typing.get_type_hints(cls.step)
    except Exception:
        hints = {}
    params = list(inspect.signature(cls.step).parameters)
    if len(params) > 1:
        found[0] = _model_hint(hints.get(params[1]))
    found[1] = _model_hint(hints.get("return"))
    prop = inspect.getattr_static(cls, "state", None)
    if isinstance(prop, property) and prop.fget is not None:
        try:
            found[2] = _model_hint(typing.get_type_hints(prop.fget).get("return"))
        except Exception:
            found[2] = None
    return found


def _overrides(cls: type, name: str, base: type) -> bool:
    return getattr(cls, name) is not getattr(base, name)


def from_openenv(
    env: Any,
    *,
    factory: Callable[[], Any] | None = None,
    action_type: type[BaseModel] | None = None,
    observation_type: type[BaseModel] | None = None,
    state_type: type[BaseModel] | None = None,
    name: str | None = None,
    description: str | None = None,
    contract_version: str = "1.0.0",
) -> type[Environment[Any, Any, Any]]:
    """A corral :class:`Environment` class serving the OpenEnv environment class ``env``.

    Args:
        env: a subclass of OpenEnv's ``Environment``.
        factory: builds one instance per session (default: ``env()``).
        action_type / observation_type / state_type: the OpenEnv models, when neither
            the generic parameters nor the annotations name them.
        name / description: override what ``get_metadata()`` (or the class name) gives.
        contract_version: the corral contract version to publish.

    Raises:
        TypeError: ``env`` is not an OpenEnv environment, or a model cannot be found or
            is not an OpenEnv/pydantic model.
    """
    interfaces, types = _openenv()
    base = interfaces.Environment
    if not (isinstance(env, type) and issubclass(env, base)):
        raise TypeError(
            f"from_openenv() needs a subclass of openenv's Environment, got {env!r}; "
            "corral environments are served directly"
        )
    given = [action_type, observation_type, state_type]
    generic = _models_from_generics(env, base)
    annotated = _models_from_annotations(env)
    chosen = [g or gen or ann for g, gen, ann in zip(given, generic, annotated, strict=True)]
    if chosen[2] is None:
        chosen[2] = types.State
    roles = ("action_type", "observation_type", "state_type")
    expected = (types.Action, types.Observation, types.State)
    for role, model, want in zip(roles, chosen, expected, strict=True):
        if model is None:
            raise TypeError(
                f"cannot tell the {role.removesuffix('_type')} model of {env.__name__}: "
                f"declare Environment[MyAction, MyObservation, MyState], annotate step(), "
                f"or pass {role}=... to from_openenv()"
            )
        if not (isinstance(model, type) and issubclass(model, want)):
            raise TypeError(
                f"{env.__name__}'s {role} {model!r} is not a subclass of openenv's {want.__name__}"
            )
    act = cast(type[Action], _twin(chosen[0], Action))
    obs = cast(type[Observation], _twin(chosen[1], Observation))
    st = cast(type[State], _twin(chosen[2], State))
    make = factory or env
    meta_name, meta_description = name, description
    if meta_name is None or meta_description is None:
        probe = make()
        try:
            meta = probe.get_metadata()
        finally:
            probe.close()
        meta_name = meta_name or getattr(meta, "name", None) or env.__name__
        meta_description = meta_description or getattr(meta, "description", "") or ""
    accepted = accepted_reset_options(
        getattr(env, "reset_async" if _overrides(env, "reset_async", base) else "reset")
    )
    return _adapter_class(
        env,
        make,
        (act, obs, st),
        (meta_name, meta_description, contract_version),
        accepted,
        (_overrides(env, "reset_async", base), _overrides(env, "step_async", base)),
    )


def _adapter_class(
    env: Any,
    make: Callable[[], Any],
    models: tuple[type[Action], type[Observation], type[State]],
    identity: tuple[str, str, str],
    accepted: frozenset[str] | None,
    asyncs: tuple[bool, bool],
) -> type[Environment[Any, Any, Any]]:
    act, obs, st = models
    env_name, env_description, version = identity
    reset_is_async, step_is_async = asyncs

    def check_options(options: dict[str, Any]) -> dict[str, Any]:
        if accepted is None:
            return options
        if "episode_id" in options and "episode_id" not in accepted:
            options = {k: v for k, v in options.items() if k != "episode_id"}
        check_reset_options(options, accepted, env.__name__)
        return options

    def to_observation(value: Any) -> Observation:
        if isinstance(value, BaseModel):
            return obs.model_validate(value.model_dump())
        return value  # type: ignore[no-any-return]  # the service reports the wrong type

    class OpenEnvAdapter(Environment[Any, Any, Any]):
        __doc__ = f"corral adapter serving the OpenEnv environment {env.__qualname__}."
        action_type = act
        observation_type = obs
        state_type = st
        name = env_name
        description = env_description
        contract_version = version
        thread_affinity = True
        openenv_class = env

        def __init__(self) -> None:
            self.inner = make()

        def state(self) -> State:
            value = self.inner.state
            if isinstance(value, BaseModel):
                return st.model_validate(value.model_dump())
            return value  # type: ignore[no-any-return]

        def close(self) -> None:
            self.inner.close()

    # Each method is async exactly when the OpenEnv class overrides its *_async twin,
    # which is when OpenEnv itself awaits it instead of running the sync one on a thread.
    if reset_is_async:

        async def reset_async(self: Any, seed: int | None = None, **options: Any) -> Observation:
            kwargs = check_options(options)
            return to_observation(await self.inner.reset_async(seed=seed, **kwargs))

        OpenEnvAdapter.reset = reset_async  # type: ignore[method-assign]
    else:

        def reset_sync(self: Any, seed: int | None = None, **options: Any) -> Observation:
            kwargs = check_options(options)
            return to_observation(self.inner.reset(seed=seed, **kwargs))

        OpenEnvAdapter.reset = reset_sync  # type: ignore[method-assign]
    if step_is_async:

        async def step_async(self: Any, action: Action) -> Observation:
            return to_observation(await self.inner.step_async(action))

        OpenEnvAdapter.step = step_async  # type: ignore[method-assign]
    else:

        def step_sync(self: Any, action: Action) -> Observation:
            return to_observation(self.inner.step(action))

        OpenEnvAdapter.step = step_sync  # type: ignore[method-assign]

    OpenEnvAdapter.__name__ = OpenEnvAdapter.__qualname__ = f"{env.__name__}Adapter"
    OpenEnvAdapter.__module__ = env.__module__
    return OpenEnvAdapter


__all__ = ["from_openenv", "is_openenv_environment"]
