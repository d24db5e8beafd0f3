"""Serve an environment written for OpenEnv with corral, unchanged.

    corral serve path/to/my_env                        # a directory with openenv.yaml
    corral serve my_env.server.app:app                 # OpenEnv's FastAPI app
    corral serve my_env.server.my_environment:MyEnv    # the Environment class itself
    corral serve my_env                                # an installed OpenEnv env package

    from corral.adapters.openenv_env import from_openenv
    Env = from_openenv(MyEnvironment, action_type=MyAction, observation_type=MyObservation)

An OpenEnv environment subclasses ``openenv.core.env_server.interfaces.Environment``.
:func:`openenv_target` finds what OpenEnv's own server would serve: the arguments of the
``create_app(env, ActionCls, ObservationCls, ...)`` call that builds the app named by
``openenv.yaml`` (``app: server.app:app``), read back from the built app, so a factory
with constructor arguments, the declared models and ``max_concurrent_envs`` all carry
over without the user editing anything. :func:`from_openenv` then builds a corral
:class:`~corral.contract.Environment` around it, with two faces:

* **OpenEnv's face** (:class:`OpenEnvRuntime`, the ``openenv_*`` methods): OpenEnv
  clients get OpenEnv's semantics exactly, computed by the *installed* OpenEnv release
  (0.3 or 0.10) itself: its message models, action deserialization (MCP
  ``list_tools``/``call_tool`` routing included), observation serialization (0.10 nests
  ``metadata``), reset keyword filtering (keywords the signature does not take are
  dropped), no lifecycle rules of corral's (the environment decides whether a step
  before reset is an error), ``MCPEnvironment`` tools over JSON-RPC.
* **corral's face** (``reset``/``step``/``state``): typed models for corral clients.
  Each OpenEnv model gets a corral twin that subclasses it, so the author's fields,
  constraints and validators apply and the action the OpenEnv code receives is an
  instance of its own class. ``MCPEnvironment``'s tool actions and observations get
  one model each (:class:`McpAction`, :class:`McpObservation`).

Sync methods run on one thread per session and ``reset_async``/``step_async`` overrides
are awaited on the event loop, as OpenEnv does. Rubrics and transforms run inside the
environment's own code, as in OpenEnv. ``SUPPORTS_CONCURRENT_SESSIONS`` is not needed:
corral's capacity is the server's ``--max-sessions`` (the manifest default is
``max_concurrent_envs`` when the app declares it).

Needs an OpenEnv release installed (``openenv-core`` 0.3 or ``openenv`` 0.10).

One module (~900 lines) because finding an OpenEnv environment, reading its app's arguments
and wrapping it are one adapter with one set of OpenEnv version differences; the wire side
lives in corral.protocol.openenv.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, Field, create_model
from pydantic_core import to_jsonable_python

from corral.contract import Action, Environment, Observation, State
from corral.errors import EnvError
from corral.protocol.openenv import flatten_observation

_OPENENV_BASE = ("openenv.core.env_server.interfaces", "Environment")


def is_openenv_environment(obj: Any) -> bool:
    """True for a subclass of OpenEnv's ``Environment`` (checked without importing openenv)."""
    if not isinstance(obj, type):
        return False
    return any((k.__module__, k.__qualname__) == _OPENENV_BASE for k in obj.__mro__[1:])


def _openenv() -> Any:
    try:
        from openenv.core.env_server import http_server
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "serving an OpenEnv environment needs OpenEnv installed: "
            "pip install openenv (or openenv-core)"
        ) from exc
    return http_server


# -- finding what OpenEnv would serve ---------------------------------------------------


@dataclass(frozen=True)
class OpenEnvApp:
    """The arguments of an OpenEnv ``create_app`` call, read back from the app it built.

    Attributes:
        factory: builds one environment instance (the class, or the app's factory).
        env_class: the environment class (the factory's result's class).
        action_cls / observation_cls: the models given to ``create_app``.
        reset_observation_cls: OpenEnv 0.10's reset observation model (else None).
        state_cls: OpenEnv 0.10's state model (else None: OpenEnv's base State).
        env_name: the name given to ``create_app`` (the Task API's name).
        max_concurrent_envs: the app's session limit.
        routes: the app's own routes, added by the environment's code beside OpenEnv's
            (a custom ``/web`` page, a ``/config``): served by corral too.
    """

    factory: Callable[[], Any]
    env_class: type
    action_cls: type[BaseModel]
    observation_cls: type[BaseModel]
    reset_observation_cls: type[BaseModel] | None
    state_cls: type[BaseModel] | None
    env_name: str
    max_concurrent_envs: int
    routes: tuple[Any, ...] = ()


_FRAMEWORK_MODULES = ("openenv.", "openenv_core.", "fastapi.", "starlette.", "gradio.")
"""Where OpenEnv's own routes, FastAPI's docs and OpenEnv's web interface come from."""


def own_routes(app: Any) -> tuple[Any, ...]:
    """The routes of an OpenEnv app that the environment's code added itself."""
    found = []
    for route in getattr(app, "routes", ()):
        endpoint = getattr(route, "endpoint", None) or getattr(route, "app", None)
        module = getattr(endpoint, "__module__", None) or type(endpoint).__module__
        if not f"{module}.".startswith(_FRAMEWORK_MODULES):
            found.append(route)
    return tuple(found)


def _http_server_of(app: Any) -> Any:
    """The OpenEnv ``HTTPEnvServer`` behind a FastAPI app, found in its routes' closures."""
    for route in getattr(app, "routes", ()):
        endpoint = getattr(route, "endpoint", None)
        for cell in getattr(endpoint, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                value = cell.cell_contents
                if hasattr(value, "_env_factory") and hasattr(value, "action_cls"):
                    return value
    return None


def is_openenv_app(obj: Any) -> bool:
    """True for an ASGI app built by OpenEnv's ``create_app``."""
    return _http_server_of(obj) is not None


def spec_from_app(app: Any) -> OpenEnvApp:
    """What OpenEnv's ``create_app`` was given for ``app``.

    Raises:
        TypeError: ``app`` was not built by OpenEnv's ``create_app``.
    """
    server = _http_server_of(app)
    if server is None:
        raise TypeError(f"{app!r} is not an app built by OpenEnv's create_app()")
    factory = server._env_factory
    env_class = factory if isinstance(factory, type) else None
    if env_class is None:
        probe = factory()  # OpenEnv does the same to check concurrency safety
        try:
            env_class = type(probe)
        finally:
            probe.close()
    reset_cls = getattr(server, "reset_observation_cls", None)
    return OpenEnvApp(
        factory=factory,
        env_class=env_class,
        action_cls=server.action_cls,
        observation_cls=server.observation_cls,
        reset_observation_cls=reset_cls if reset_cls is not server.observation_cls else None,
        state_cls=getattr(server, "state_cls", None),
        env_name=str(getattr(server, "env_name", None) or env_class.__name__),
        max_concurrent_envs=int(getattr(server, "_max_concurrent_envs", 1)),
        routes=own_routes(app),
    )


def _ancestor_modules(module: str, leaf: str) -> list[str]:
    """``<package>.<leaf>`` and ``<package>.server.<leaf>`` for each package above
    ``module``, nearest first (where an environment package keeps its app or models)."""
    parts = module.split(".")
    found: list[str] = []
    for depth in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:depth])
        for name in (f"{prefix}.{leaf}", f"{prefix}.server.{leaf}"):
            if name not in found and name != module:
                found.append(name)
    return found


def _import_if_present(name: str) -> Any:
    """The module ``name`` if it exists (None otherwise, or when importing it fails)."""
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except Exception:  # an app that cannot be built here is not the one to read
        return None


def app_spec_for(env_class: type) -> OpenEnvApp | None:
    """What the OpenEnv app beside ``env_class`` gives ``create_app`` for it, if any.

    OpenEnv environments keep their app in ``<package>.server.app`` (``openenv.yaml``'s
    default); when that app serves ``env_class``, its arguments (the models, a factory
    with constructor arguments, ``max_concurrent_envs``) are what OpenEnv serves, so the
    class form serves the same.
    """
    for name in _ancestor_modules(env_class.__module__, "app"):
        module = _import_if_present(name)
        app = getattr(module, "app", None)
        if app is None or not is_openenv_app(app):
            continue
        spec = spec_from_app(app)
        if isinstance(spec.env_class, type) and issubclass(spec.env_class, env_class):
            return spec
    return None


def _declared_models(env_class: type, base: type) -> list[type]:
    """The subclasses of ``base`` defined in the ``models`` module of ``env_class``'s
    package (OpenEnv's layout: ``<package>/models.py``)."""
    for name in _ancestor_modules(env_class.__module__, "models"):
        module = _import_if_present(name)
        if module is None:
            continue
        found = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, base)
            and obj is not base
            and obj.__module__ == module.__name__
        ]
        if found:
            return found
    return []


# -- OpenEnv's own semantics, computed by the installed release ----------------------------


def _get_valid_kwargs(fn: Callable[..., Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """OpenEnv's keyword rule: keep what the signature names, all with ``**kwargs``."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(data)
    return {k: v for k, v in data.items() if k in params}


class OpenEnvRuntime:
    """The installed OpenEnv release's message models and helpers, for one environment.

    The server's OpenEnv routes use it (through :class:`corral.protocol.openenv.PeerRuntime`)
    to answer exactly as OpenEnv's own server would for this environment.
    """

    def __init__(self, spec: OpenEnvApp) -> None:
        server = _openenv()
        from openenv.core.env_server import mcp_types, serialization, types

        self.spec = spec
        self.types = types
        self.mcp_types = mcp_types
        self._serialization = serialization
        self._jsonable = server._make_json_serializable
        self.version = _installed_version()
        self.env_name = spec.env_name
        self.nested_metadata = "metadata" in types.ResetResponse.model_fields
        """True for OpenEnv 0.10's envelope (metadata nested and top-level)."""
        self.action_cls = spec.action_cls
        self.mcp_actions = {mcp_types.CallToolAction, mcp_types.ListToolsAction}
        self.ws_models: dict[str, type[BaseModel]] = {
            "reset": types.WSResetMessage,
            "step": types.WSStepMessage,
            "state": types.WSStateMessage,
            "close": types.WSCloseMessage,
            "mcp": mcp_types.WSMCPMessage,
        }
        self.reset_request = types.ResetRequest
        self.step_request = types.StepRequest
        self.own_routes = list(spec.routes)

    # wire helpers (pure)
    def serialize(self, observation: Any) -> dict[str, Any]:
        """OpenEnv's ``{observation, reward, done[, metadata]}`` for an observation."""
        return cast(dict[str, Any], self._serialization.serialize_observation(observation))

    def deserialize_action(self, data: dict[str, Any]) -> Any:
        """The action OpenEnv's server would build (MCP tool actions routed the same way)."""
        return self._serialization.deserialize_action(data, self.action_cls)

    def jsonable(self, value: Any) -> Any:
        """OpenEnv's ``_make_json_serializable``."""
        return self._jsonable(value)

    def rpc_request(self, payload: Any) -> Any:
        """OpenEnv's ``JsonRpcRequest`` for a decoded payload (pydantic errors propagate)."""
        return self.mcp_types.JsonRpcRequest(**payload)

    def rpc_success(self, request_id: Any, result: Any) -> dict[str, Any]:
        """OpenEnv's JSON-RPC success response."""
        response = self.mcp_types.JsonRpcResponse.success(result=result, request_id=request_id)
        return cast(dict[str, Any], response.model_dump())

    def rpc_error(
        self, code: int, message: str | None, request_id: Any = None, data: Any = None
    ) -> dict[str, Any]:
        """OpenEnv's JSON-RPC error response."""
        codes = self.mcp_types.JsonRpcErrorCode
        response = self.mcp_types.JsonRpcResponse.error_response(
            codes(code), message, data=data, request_id=request_id
        )
        return cast(dict[str, Any], response.model_dump())

    def http_reply(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's HTTP ``/reset`` (``kind="reset"``) or ``/step`` response body."""
        model = self.types.ResetResponse if kind == "reset" else self.types.StepResponse
        return cast(dict[str, Any], model(**data).model_dump(mode="json"))

    def http_state(self, data: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's ``GET /state`` body: the state as its response model declares it."""
        fields = (self.spec.state_cls or self.types.State).model_fields
        return {k: v for k, v in data.items() if k in fields}

    def task_request(self, name: str) -> type[BaseModel]:
        """The Task API's request model for ``tasks``/``num_tasks``/``task``/``task_range``."""
        models = {
            "tasks": self.types.ListTasksRequest,
            "num_tasks": self.types.NumTasksRequest,
            "task": self.types.GetTaskRequest,
            "task_range": self.types.GetTaskRangeRequest,
        }
        return cast(type[BaseModel], models[name])

    @property
    def publishes_reset_observation(self) -> bool:
        """The installed release's ``/schema`` has a ``reset_observation`` (0.10)."""
        return "reset_observation" in self.types.SchemaResponse.model_fields

    def reset_observation_schema(self) -> dict[str, Any] | None:
        """The reset observation model's schema when the app declares one of its own."""
        cls = self.spec.reset_observation_cls
        if not self.publishes_reset_observation or cls is None:
            return None
        return cls.model_json_schema()

    def metadata(self) -> dict[str, Any]:
        """OpenEnv's ``GET /metadata`` body (a fresh instance's ``get_metadata()``)."""
        env = self.spec.factory()
        try:
            return cast(dict[str, Any], env.get_metadata().model_dump(mode="json"))
        finally:
            env.close()

    @property
    def has_task_api(self) -> bool:
        """True when the installed release serves the Task API routes (0.10)."""
        return hasattr(self.types, "ListTasksRequest")

    def normalize_split(self, split: Any) -> dict[str, Any]:
        """OpenEnv 0.10's split shape."""
        if hasattr(split, "model_dump"):
            return cast(dict[str, Any], split.model_dump())
        if isinstance(split, dict):
            return cast(dict[str, Any], self.jsonable(split))
        if isinstance(split, str):
            kind = split if split in {"train", "validation", "test"} else "validation"
            return {"name": split, "type": kind}
        return {"name": str(split), "type": "validation"}


def _installed_version() -> str:
    from importlib import metadata

    for dist in ("openenv", "openenv-core"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return "unknown"


# -- corral's face: models ---------------------------------------------------------------


class McpAction(Action):
    """corral's form of OpenEnv's ``ListToolsAction`` / ``CallToolAction``."""

    type: Literal["list_tools", "call_tool"]
    tool_name: str | None = Field(default=None, description="The tool to call.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Its arguments.")


class McpObservation(Observation):
    """corral's form of OpenEnv's ``ListToolsObservation`` / ``CallToolObservation``."""

    tools: list[dict[str, Any]] | None = None
    tool_name: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None


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
    reset_observation_type: type[BaseModel] | None = None,
    env_name: str | None = None,
    name: str | None = None,
    description: str | None = None,
    contract_version: str = "1.0.0",
    forms: str | None = None,
) -> type[Environment[Any, Any, Any]]:
    """A corral :class:`Environment` class serving the OpenEnv environment ``env``.

    Args:
        env: a subclass of OpenEnv's ``Environment``, or an :class:`OpenEnvApp` (what
            :func:`load_openenv` found: its factory and models are used).
        factory: builds one instance per session (default: ``env()``).
        action_type / observation_type / state_type: the OpenEnv models, when neither
            the generic parameters nor the annotations name them.
        reset_observation_type: OpenEnv 0.10's reset observation model, if different.
        env_name: the name OpenEnv's Task API answers to (default: the class name).
        name / description: override what ``get_metadata()`` (or the class name) gives.
        contract_version: the corral contract version to publish.
        forms: the targets naming this environment's app, named in a refusal.

    The models come from the arguments, else ``Environment[MyAction, MyObservation,
    MyState]``, else the annotations of ``step`` and of the ``state`` property, else the
    one subclass of each defined in the package's ``models`` module; OpenEnv's base
    ``Action``/``Observation`` never count (they describe no real model).

    Raises:
        TypeError: ``env`` is not an OpenEnv environment, a model cannot be found or is
            not an OpenEnv/pydantic model, or the class cannot be built without the
            arguments its app gives; the message names the forms that work.
    """
    server = _openenv()
    from openenv.core.env_server import interfaces, types

    routes: tuple[Any, ...] = ()
    if isinstance(env, OpenEnvApp):
        found = env
        routes = found.routes
        env = found.env_class
        factory = factory or found.factory
        action_type = action_type or found.action_cls
        observation_type = observation_type or found.observation_cls
        state_type = state_type or found.state_cls
        reset_observation_type = reset_observation_type or found.reset_observation_cls
        env_name = env_name or found.env_name
    base = interfaces.Environment
    if not (isinstance(env, type) and issubclass(env, base)):
        raise TypeError(
            f"from_openenv() needs a subclass of openenv's Environment, got {env!r}; "
            "corral environments are served directly"
        )
    mcp = server.MCPEnvironment if hasattr(server, "MCPEnvironment") else None
    mcp_env = mcp is not None and issubclass(env, mcp)
    given = [action_type, observation_type, state_type]
    generic = _models_from_generics(env, base)
    annotated = _models_from_annotations(env)
    roles = ("action_type", "observation_type", "state_type")
    expected = (types.Action, types.Observation, types.State)
    chosen: list[Any] = []
    for role, want, *candidates in zip(roles, expected, given, generic, annotated, strict=True):
        # OpenEnv's base classes say nothing of the real model (an env annotating
        # step(action: Action)): never serve one as the contract.
        model = next((m for m in candidates if m is not None and m is not want), None)
        if model is None and role != "state_type" and not mcp_env:
            declared = _declared_models(env, want)
            model = declared[0] if len(declared) == 1 else None
        chosen.append(model)
    if chosen[2] is None:
        chosen[2] = types.State
    if mcp_env:
        chosen[0] = chosen[0] or types.Action
        chosen[1] = chosen[1] or types.Observation
    where = f"serve {forms}, " if forms else ""
    for role, model, want in zip(roles, chosen, expected, strict=True):
        if model is None:
            raise TypeError(
                f"cannot tell the {role.removesuffix('_type')} model of {env.__name__} "
                f"(its step() names none, or only OpenEnv's base {want.__name__}): {where}"
                f"declare Environment[MyAction, MyObservation, MyState], annotate step() "
                f"with the real models, or pass {role}=... to from_openenv()"
            )
        if not (isinstance(model, type) and issubclass(model, want)):
            raise TypeError(
                f"{env.__name__}'s {role} {model!r} is not a subclass of openenv's {want.__name__}"
            )
    make = factory or env
    spec = OpenEnvApp(
        factory=make,
        env_class=env,
        action_cls=chosen[0],
        observation_cls=chosen[1],
        reset_observation_cls=reset_observation_type,
        state_cls=state_type,
        env_name=env_name or env.__name__,
        max_concurrent_envs=1,
        routes=routes,
    )
    runtime = OpenEnvRuntime(spec)
    if mcp_env or chosen[0] in runtime.mcp_actions or chosen[0] is types.Action:
        act: type[Action] = McpAction
        obs: type[Observation] = McpObservation
    else:
        act = cast(type[Action], _twin(chosen[0], Action))
        obs = cast(type[Observation], _twin(chosen[1], Observation))
    st = cast(type[State], _twin(chosen[2], State))
    meta_name, meta_description = name, description
    if meta_name is None or meta_description is None:
        try:
            probe = make()
        except TypeError as exc:  # constructor arguments only the app gives
            raise TypeError(
                f"{env.__name__}() cannot be built without arguments ({exc}): {where}or "
                "pass factory=... to from_openenv()"
            ) from None
        try:
            meta = probe.get_metadata()
        finally:
            probe.close()
        meta_name = meta_name or getattr(meta, "name", None) or env.__name__
        meta_description = meta_description or getattr(meta, "description", "") or ""
    return _adapter_class(
        runtime,
        (act, obs, st),
        (meta_name, meta_description, contract_version),
        frozenset(name for name in _HOOKS if hasattr(base, name) and _overrides(env, name, base)),
    )


def _adapter_class(
    runtime: OpenEnvRuntime,
    models: tuple[type[Action], type[Observation], type[State]],
    identity: tuple[str, str, str],
    overridden: frozenset[str],
) -> type[Environment[Any, Any, Any]]:
    act, obs, st = models
    env = runtime.spec.env_class
    make = runtime.spec.factory
    env_name, env_description, version = identity
    reset_is_async, step_is_async = "reset_async" in overridden, "step_async" in overridden
    mcp_types = runtime.mcp_types

    def corral_action(action: Any) -> Any:
        if isinstance(action, McpAction):
            if action.type == "list_tools":
                return mcp_types.ListToolsAction()
            return mcp_types.CallToolAction(
                tool_name=action.tool_name or "", arguments=action.arguments
            )
        return action

    def to_observation(value: Any) -> Observation:
        if not isinstance(value, BaseModel):
            return value  # type: ignore[no-any-return]  # the service reports the wrong type
        if obs is McpObservation:
            fields = to_jsonable_python(value.model_dump(), fallback=str)
            if "tools" in fields and isinstance(fields["tools"], list):
                fields["tools"] = [t for t in fields["tools"] if isinstance(t, dict)]
            return McpObservation.model_validate(
                {k: v for k, v in fields.items() if k in McpObservation.model_fields}
            )
        return obs.model_validate(value.model_dump())

    def reset_kwargs(fn: Callable[..., Any], seed: int | None, options: dict[str, Any]) -> Any:
        data = dict(options)
        if seed is not None:
            data.setdefault("seed", seed)
        return _get_valid_kwargs(fn, data)

    def failure(exc: Exception) -> Exception:
        # corral clients see the environment's own message (as OpenEnv clients do).
        if isinstance(exc, EnvError):
            return exc
        return EnvError(str(exc), details={"exception": type(exc).__name__})

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
        openenv_runtime = runtime

        def __init__(self) -> None:
            self.inner = make()

        # corral's face
        def state(self) -> State:
            value = self.inner.state
            if isinstance(value, BaseModel):
                return st.model_validate(value.model_dump())
            return value  # type: ignore[no-any-return]

        # OpenEnv's face: the server's OpenEnv routes call these through the session runner
        def openenv_state(self) -> dict[str, Any]:
            value = self.inner.state
            if hasattr(value, "model_dump"):
                return cast(dict[str, Any], value.model_dump())
            return dict(value) if value else {}

        async def openenv_enter_mcp(self) -> None:
            """Kept for the routes' symmetry: the MCP session is entered per operation.

            OpenEnv holds ``mcp_session()`` open for a session's lifetime; its transport
            (anyio) must be left in the task that entered it, and corral runs each call
            in a task of its own, so each operation enters and leaves it instead.
            """

        async def openenv_mcp(self, method: str, params: dict[str, Any]) -> Any:
            """Run ``tools/list`` / ``tools/call`` on this instance, as OpenEnv's ``/mcp``.

            Returns the JSON-RPC result; raises :class:`McpFailure` for an error answer.
            """
            return await _own_task(_openenv_mcp(self, runtime, method, params, managed=True))

        async def openenv_task(self, method: str, *args: Any) -> Any:
            """A Task API method of the environment (NotImplementedError when absent)."""
            fn = getattr(self.inner, method, None)
            if not callable(fn):
                raise NotImplementedError(method)
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        async def close(self) -> None:  # type: ignore[override]
            await asyncio.to_thread(self.inner.close)

    # Each method is async exactly when the OpenEnv class overrides its *_async twin,
    # which is when OpenEnv itself awaits it instead of running the sync one on a thread.
    if reset_is_async:

        async def reset_async(self: Any, seed: int | None = None, /, **options: Any) -> Any:
            kwargs = reset_kwargs(self.inner.reset_async, seed, options)
            try:
                return to_observation(await _own_task(self.inner.reset_async(**kwargs)))
            except Exception as exc:
                raise failure(exc) from exc

        async def openenv_reset_async(self: Any, data: dict[str, Any]) -> dict[str, Any]:
            kwargs = _get_valid_kwargs(self.inner.reset_async, data)
            return runtime.serialize(await _own_task(self.inner.reset_async(**kwargs)))

        OpenEnvAdapter.reset = reset_async  # type: ignore[method-assign,assignment]
        OpenEnvAdapter.openenv_reset = openenv_reset_async  # type: ignore[attr-defined]
    else:

        def reset_sync(self: Any, seed: int | None = None, /, **options: Any) -> Any:
            kwargs = reset_kwargs(self.inner.reset, seed, options)
            try:
                return to_observation(self.inner.reset(**kwargs))
            except Exception as exc:
                raise failure(exc) from exc

        def openenv_reset_sync(self: Any, data: dict[str, Any]) -> dict[str, Any]:
            kwargs = _get_valid_kwargs(self.inner.reset, data)
            return runtime.serialize(self.inner.reset(**kwargs))

        OpenEnvAdapter.reset = reset_sync  # type: ignore[method-assign,assignment]
        OpenEnvAdapter.openenv_reset = openenv_reset_sync  # type: ignore[attr-defined]
    if step_is_async:

        async def step_async(self: Any, action: Action) -> Any:
            await self.openenv_enter_mcp()
            try:
                return to_observation(await _own_task(self.inner.step_async(corral_action(action))))
            except Exception as exc:
                raise failure(exc) from exc

        async def openenv_step_async(
            self: Any, action: Any, kwargs: dict[str, Any] | None = None
        ) -> dict[str, Any]:
            await self.openenv_enter_mcp()
            extra = _get_valid_kwargs(self.inner.step_async, kwargs or {})
            extra.pop("action", None)
            return runtime.serialize(await _own_task(self.inner.step_async(action, **extra)))

        OpenEnvAdapter.step = step_async  # type: ignore[method-assign]
        OpenEnvAdapter.openenv_step = openenv_step_async  # type: ignore[attr-defined]
    else:

        def step_sync(self: Any, action: Action) -> Any:
            try:
                return to_observation(self.inner.step(corral_action(action)))
            except Exception as exc:
                raise failure(exc) from exc

        def openenv_step_sync(
            self: Any, action: Any, kwargs: dict[str, Any] | None = None
        ) -> dict[str, Any]:
            extra = _get_valid_kwargs(self.inner.step, kwargs or {})
            extra.pop("action", None)
            return runtime.serialize(self.inner.step(action, **extra))

        OpenEnvAdapter.step = step_sync  # type: ignore[method-assign]
        OpenEnvAdapter.openenv_step = openenv_step_sync  # type: ignore[attr-defined]

    # OpenEnv 0.10's web hooks become corral's (the web UI's /render), only when the
    # class overrides them: the UI asks which hooks an environment has.
    if "render_web" in overridden:

        def render_html(self: Any, observation: Observation) -> str | None:
            return cast(str | None, self.inner.render_web(_web_observation(observation)))

        OpenEnvAdapter.render_html = render_html  # type: ignore[method-assign]
    if "web_actions" in overridden:

        def web_actions(self: Any, observation: Observation) -> list[tuple[str, Any]]:
            if observation.done:  # OpenEnv's /web offers no actions once the episode ended
                return []
            return list(self.inner.web_actions(_web_observation(observation)))

        OpenEnvAdapter.web_actions = web_actions  # type: ignore[method-assign]

    OpenEnvAdapter.__name__ = OpenEnvAdapter.__qualname__ = f"{env.__name__}Adapter"
    OpenEnvAdapter.__module__ = env.__module__
    return OpenEnvAdapter


_HOOKS = ("reset_async", "step_async", "render_web", "web_actions")
"""OpenEnv ``Environment`` methods whose override changes how the adapter is built."""


def _web_observation(observation: Observation) -> dict[str, Any]:
    """What OpenEnv's ``render_web`` / ``web_actions`` get: the serialized observation's
    fields plus top-level ``reward`` and ``done``."""
    flat = flatten_observation(observation.model_dump(mode="json"))
    return {**flat["observation"], "reward": flat["reward"], "done": flat["done"]}


def _own_task(coro: Any) -> Any:
    """Run an OpenEnv coroutine wholly in a task of its own.

    corral's runner starts a coroutine in the caller's task and finishes it in another
    when it suspends; anyio (under FastMCP's client) requires a cancel scope to be left
    in the task that entered it, so OpenEnv's coroutines get one task from start to end.
    """
    return asyncio.ensure_future(coro)


class McpFailure(Exception):
    """A JSON-RPC error OpenEnv's ``/mcp`` handler answers with: ``code``, ``message``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


async def _openenv_mcp(
    adapter: Any, runtime: OpenEnvRuntime, method: str, params: dict[str, Any], *, managed: bool
) -> Any:
    """OpenEnv's ``tools/list`` / ``tools/call`` on one environment instance.

    Raises:
        McpFailure: what OpenEnv answers with a JSON-RPC error.
    """
    internal, invalid, not_found = -32603, -32602, -32601
    env = adapter.inner
    mcp_client = getattr(env, "mcp_client", None)
    mcp_server = getattr(env, "mcp_server", None)
    step_based = runtime.nested_metadata and runtime.action_cls in runtime.mcp_actions
    mcp_types = runtime.mcp_types
    if managed:
        await adapter.openenv_enter_mcp()

    async def via_step(action: Any) -> Any:
        base = importlib.import_module("openenv.core.env_server.interfaces").Environment
        if _overrides(type(env), "step_async", base):
            return await env.step_async(action)
        return await asyncio.to_thread(env.step, action)

    async def client_op(op: Callable[[], Any]) -> Any:
        assert mcp_client is not None
        if mcp_client.is_connected() and not managed:
            return await op()
        factory = getattr(env, "mcp_session", None)
        if callable(factory):
            async with factory():
                return await op()
        async with mcp_client:
            return await op()

    try:
        if method == "tools/list":
            if mcp_client is None and mcp_server is None:
                if step_based:
                    observation = await via_step(mcp_types.ListToolsAction())
                    if isinstance(observation, mcp_types.ListToolsObservation):
                        return {"tools": [tool.model_dump() for tool in observation.tools]}
                    raise McpFailure(
                        internal,
                        "MCP-style tools/list step returned "
                        f"{type(observation).__name__}, expected ListToolsObservation",
                    )
                raise McpFailure(internal, "Environment does not support MCP")
            if mcp_client is not None:
                tools = await client_op(mcp_client.list_tools)
                return {
                    "tools": [
                        t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in tools
                    ]
                }
            from openenv.core.env_server.mcp_environment import get_server_tools

            return {
                "tools": [
                    {
                        "name": tool.name,
                        "description": tool.description or "",
                        "inputSchema": tool.parameters or {},
                    }
                    for tool in get_server_tools(mcp_server).values()
                ]
            }
        if method == "tools/call":
            tool_name = params.get("name")
            arguments = params.get("arguments", {})
            if not tool_name:
                raise McpFailure(invalid, "Missing 'name' in params")
            if mcp_client is None and mcp_server is None:
                if step_based:
                    observation = await via_step(
                        mcp_types.CallToolAction(tool_name=tool_name, arguments=arguments)
                    )
                    if isinstance(observation, mcp_types.CallToolObservation):
                        return runtime.jsonable(observation)
                    raise McpFailure(
                        internal,
                        "MCP-style tools/call step returned "
                        f"{type(observation).__name__}, expected CallToolObservation",
                    )
                raise McpFailure(internal, "Environment does not support MCP")
            if mcp_client is not None:
                result = await client_op(
                    lambda: mcp_client.call_tool(name=tool_name, arguments=arguments)
                )
            else:
                from openenv.core.env_server.mcp_environment import get_server_tools

                server_tools = get_server_tools(mcp_server)
                if tool_name not in server_tools:
                    raise McpFailure(invalid, f"Tool not found: {tool_name}")
                fn = server_tools[tool_name].fn
                result = fn(**arguments)
                if inspect.isawaitable(result):
                    result = await result
            return runtime.jsonable(result)
        raise McpFailure(not_found, f"Method not found: {method}")
    except McpFailure:
        raise
    except Exception as exc:
        raise McpFailure(internal, str(exc)) from exc


def openenv_target(env: Any, *, forms: str | None = None) -> Any:
    """``env`` ready for ``create_app``: OpenEnv environments and apps adapted, else as is.

    An OpenEnv environment class served by an app beside it (``<package>.server.app``) is
    served with that app's ``create_app`` arguments, as OpenEnv serves it.

    Args:
        env: the loaded target.
        forms: the targets naming the environment's app, for a refusal's message.

    Raises:
        TypeError / ImportError: an OpenEnv environment that cannot be adapted.
    """
    if isinstance(env, OpenEnvApp):
        return from_openenv(env)
    if is_openenv_app(env):
        return from_openenv(spec_from_app(env))
    if is_openenv_environment(env):
        spec = app_spec_for(env)
        return from_openenv(spec if spec is not None else env, forms=forms)
    return env


__all__ = [
    "McpAction",
    "McpFailure",
    "McpObservation",
    "OpenEnvApp",
    "OpenEnvRuntime",
    "app_spec_for",
    "from_openenv",
    "is_openenv_app",
    "is_openenv_environment",
    "openenv_target",
    "spec_from_app",
]
