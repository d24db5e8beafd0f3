"""corral environments for TRL's ``GRPOTrainer(environment_factory=...)``.

    WordleTools = environment_factory("corral.envs.wordle:WordleEnv", tool_name="guess")

    def reward(environments, **kwargs):
        return [env.reward for env in environments]

    GRPOTrainer(model, reward_funcs=reward, train_dataset=dataset,
                environment_factory=WordleTools)

TRL builds one instance per rollout with no arguments, calls ``reset(**row)`` with the
dataset row (its return value is appended to the prompt), and offers every public method
of the class as a tool. The generated class has the environment's action, named
``tool_name``, with one typed argument per Action field and a Google-style docstring
built from the Action schema (what ``transformers.utils.get_json_schema`` reads); calling
it steps the environment and returns the observation as text. Beside it, each of the
environment's ``@tool`` methods (:mod:`corral.contract.tools`) is a method of the same
name, typed and documented from the tool's input schema and description; calling it runs
the tool on the rollout's own environment instance and returns its result as text (a
string as it is, anything else as JSON; a failure as ``error: ...``, for the model to
read). Remote sessions of an environment with tools are stateful HTTP sessions
(``POST /sessions``), since corral's WebSocket protocol carries no tool calls: the
episode's steps and its tool calls then reach one instance. Reward functions read
``reward`` (the episode's return), ``rewards``, ``done``, ``observation``, ``steps`` and
``state`` (one round trip) from the instances.

Sessions come from one :class:`SessionPool` per generated class: instances take a
session when constructed and give it back when garbage-collected, so hundreds of rollouts
share one server (and reuse its sessions) instead of starting one each. The source is an
Environment subclass (run in-process, no server), a server URL, or a ``corral serve``
target (``module:Class`` or ``gym:ENV_ID``), for which one local server is started.

One module (~650 lines) because the generated class, its tool methods and the sources they
run against are one factory whose pieces TRL sees as a single class.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, Union

import httpx
from pydantic import BaseModel, ValidationError

from corral.adapters.action_tool import (
    IDENTIFIER,
    RESERVED,
    action_stem,
    action_summary,
    action_title,
    action_tool_name,
    describe_field,
)
from corral.auth import bearer_header
from corral.blocking import run_blocking
from corral.client import AsyncEnvClient, SyncEnvClient
from corral.client.connection import http_url
from corral.client.local_server import LocalServer
from corral.client.typed import TypedModels
from corral.contract import Environment, Observation, StepResult
from corral.contract.readable import observation_text, readable_json
from corral.contract.refs import RefError, SchemaReader
from corral.contract.tools import tools_of
from corral.errors import ConnectionLost, CorralError, error_from_wire, validation_message
from corral.protocol.jsonrpc import rpc_request, tools_list_result
from corral.protocol.openenv import unflatten_observation
from corral.server.openenv import SESSION_HEADER

_TAKEN = RESERVED | {"reward", "rewards", "done", "observation", "steps"}
"""Names an environment tool may not take: TRL's, corral's and the instance's attributes."""


class ToolSession(Protocol):
    """One episode-at-a-time session: what the generated class drives."""

    def reset(self, seed: int | None = None, **options: Any) -> StepResult[Any]:
        """Start an episode."""
        ...

    def step(self, action: Mapping[str, Any]) -> StepResult[Any]:
        """Apply an action."""
        ...

    def state(self) -> BaseModel:
        """The environment's state."""
        ...

    def close(self) -> None:
        """Release the session."""
        ...


class LocalSession:
    """An environment instance in this process, behind the :class:`ToolSession` interface."""

    def __init__(self, env_type: type[Environment[Any, Any, Any]]) -> None:
        self.env_type = env_type
        self.env = env_type()
        # The remote client's own validation: an invalid action is the same one-line
        # InvalidAction in process as over the wire.
        self._models: TypedModels[Any, Any, Any] = TypedModels(env_type)

    def _run(self, value: Any) -> Any:
        # The Environment API allows ``async def`` methods; run those on corral's loop.
        return run_blocking(value, None) if inspect.iscoroutine(value) else value

    def reset(self, seed: int | None = None, **options: Any) -> StepResult[Any]:
        """Reset the instance."""
        return StepResult.of(self._run(self.env.reset(seed, **options)))

    def step(self, action: Mapping[str, Any]) -> StepResult[Any]:
        """Validate ``action`` against the Action model and step the instance.

        Raises:
            InvalidAction: ``action`` fails validation (the message a remote client gives).
        """
        model = self._models.action(action)
        return StepResult.of(self._run(self.env.step(model)))

    def state(self) -> BaseModel:
        """The instance's state."""
        state: BaseModel = self._run(self.env.state())
        return state

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run the tool ``name`` on the instance; its result as text."""
        spec = tools_of(self.env_type)[name]
        try:
            args, kwargs = spec.bind(arguments)
            value = spec.dump_result(self._run(getattr(self.env, spec.method)(*args, **kwargs)))
        except ValidationError as exc:
            return f"error: {validation_message(f'invalid arguments for tool {name!r}', exc)}"
        except Exception as exc:  # the tool's own failure is for the model to read
            return f"error: {type(exc).__name__}: {exc}"
        return value if isinstance(value, str) else readable_json(value)

    def close(self) -> None:
        """Close the instance."""
        close: Callable[[], Any] = self.env.close
        self._run(close())


class HttpSession:
    """A stateful HTTP session of a corral server (``POST /sessions``): ``reset``,
    ``step``, ``state`` and the environment's tools run on one environment instance.

    Args:
        url: the server.
        observation_type / state_type: the models replies are read into.
        token: the server's bearer token, if it has one.
        timeout: seconds each request may take.
    """

    def __init__(
        self,
        url: str,
        observation_type: type[Observation],
        state_type: type[BaseModel],
        *,
        token: str | None = None,
        timeout: float | None = 300.0,
    ) -> None:
        self.observation_type = observation_type
        self.state_type = state_type
        headers = bearer_header(token) if token else {}
        self.http = httpx.Client(base_url=http_url(url), headers=headers, timeout=timeout)
        self.id = str(self._json("POST", "/sessions")["session_id"])
        self.http.headers[SESSION_HEADER] = self.id

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        reply = self.http.request(method, path, json=body)
        data = reply.json() if reply.content else {}
        if reply.is_error:
            if isinstance(data, dict) and "code" in data:
                raise error_from_wire(data)
            raise ConnectionLost(f"{method} {path} answered HTTP {reply.status_code}")
        return data

    def reset(self, seed: int | None = None, **options: Any) -> StepResult[Any]:
        """Start an episode."""
        reply = self._json("POST", "/reset", {"seed": seed, **options})
        return StepResult.of(self.observation_type.model_validate(unflatten_observation(reply)))

    def step(self, action: Mapping[str, Any]) -> StepResult[Any]:
        """Apply an action."""
        reply = self._json("POST", "/step", {"action": dict(action)})
        return StepResult.of(self.observation_type.model_validate(unflatten_observation(reply)))

    def state(self) -> BaseModel:
        """The environment's state."""
        return self.state_type.model_validate(self._json("GET", "/state"))

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run the tool ``name`` on this session's instance; its result as text."""
        call = rpc_request(1, "tools/call", {"name": name, "arguments": dict(arguments)})
        reply = self._json("POST", "/mcp", call)
        if "error" in reply:
            return f"error: {reply['error'].get('message', reply['error'])}"
        result = reply.get("result") or {}
        if not result.get("isError") and "data" in result:
            # The tool's JSON value (arrays in their wire form), shown as the model reads it.
            value = result["data"]
            return value if isinstance(value, str) else readable_json(value)
        text = "\n".join(
            str(part.get("text", ""))
            for part in result.get("content", [])
            if isinstance(part, dict)
        )
        return f"error: {text}" if result.get("isError") else text

    def close(self) -> None:
        """Close the session on the server and the HTTP client."""
        with contextlib.suppress(httpx.HTTPError, CorralError):
            self._json("DELETE", f"/sessions/{self.id}")
        self.http.close()


class SessionPool:
    """Sessions shared by all instances of a generated class (see the module docstring).

    Args:
        source: an Environment subclass, a server URL (``http://``/``ws://``), or a
            ``corral serve`` target started once in a local server.
        env: the environment class whose models remote clients use (default: models built
            from the server's schemas).
        client_kwargs: more :class:`AsyncEnvClient` arguments for remote sessions.
    """

    def __init__(
        self,
        source: type[Environment[Any, Any, Any]] | str,
        *,
        env: type[Environment[Any, Any, Any]] | None = None,
        server_args: list[str] | None = None,
        **client_kwargs: Any,
    ) -> None:
        if isinstance(source, str) and not source:
            raise ValueError("the environment source is empty; pass a class, URL or target")
        if not isinstance(source, str) and not (
            isinstance(source, type) and issubclass(source, Environment)
        ):
            raise TypeError(
                f"environment_factory() needs an Environment subclass, a server URL or a "
                f"'module:Class' target, got {source!r}"
            )
        self.source = source
        self.env = env
        self.server_args = server_args
        self.client_kwargs = client_kwargs
        self.server: LocalServer | None = None
        self.created = 0
        self._idle: list[ToolSession] = []
        self._lock = threading.Lock()
        self._models: tuple[type[BaseModel], type[Observation], type[BaseModel]] | None = None
        self._tools: list[dict[str, Any]] | None = None

    @property
    def url(self) -> str | None:
        """The server the sessions are on (None for in-process sessions)."""
        if isinstance(self.source, str) and "://" in self.source:
            return self.source
        return self.server.url if self.server is not None else None

    def _server_url(self) -> str:
        assert isinstance(self.source, str)
        if "://" in self.source:
            return self.source
        if self.server is None or not self.server.running:
            self.server = LocalServer(self.source, server_args=self.server_args)
            run_blocking(self.server.start(), None)
        assert self.server.url is not None
        return self.server.url

    def acquire(self) -> ToolSession:
        """An idle session, or a new one (an HTTP session when the environment has tools)."""
        tools = self.tools()
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if not isinstance(self.source, str):
                session: ToolSession = LocalSession(self.source)
            elif tools:
                _, observation, state = self.models()
                session = HttpSession(
                    self._server_url(),
                    observation,
                    state,
                    token=self.client_kwargs.get("token"),
                    timeout=self.client_kwargs.get("timeout", 300.0),
                )
            else:
                client = AsyncEnvClient(self._server_url(), env=self.env, **self.client_kwargs)
                session = SyncEnvClient(client).connect()
            self.created += 1
            return session

    def models(self) -> tuple[type[BaseModel], type[Observation], type[BaseModel]]:
        """The environment's Action, Observation and State models (for a remote source
        without ``env``: built from the server's schemas, asked once)."""
        if self._models is None:
            if not isinstance(self.source, str) or self.env is not None:
                found = self.env or self.source
                assert not isinstance(found, str)
                self._models = (found.action_type, found.observation_type, found.state_type)
            else:
                client = AsyncEnvClient(self._server_url(), **self.client_kwargs)
                probe = SyncEnvClient(client).connect()
                try:
                    remote = probe.async_client
                    assert remote.action_type and remote.observation_type and remote.state_type
                    self._models = (remote.action_type, remote.observation_type, remote.state_type)
                finally:
                    probe.close()
        return self._models

    def tools(self) -> list[dict[str, Any]]:
        """The environment's tools as ``tools/list`` describes them (``name``,
        ``description``, ``inputSchema``); asked of the server once for remote sources."""
        if self._tools is None:
            if not isinstance(self.source, str):
                self._tools = list(tools_list_result(tools_of(self.source))["tools"])
            else:
                self._tools = self._remote_tools()
        return self._tools

    def _remote_tools(self) -> list[dict[str, Any]]:
        token = self.client_kwargs.get("token")
        headers = bearer_header(token) if token else {}
        try:
            reply = httpx.post(
                http_url(self._server_url()) + "/mcp",
                json=rpc_request(1, "tools/list"),
                headers=headers,
                timeout=30.0,
            )
            listed = reply.json().get("result", {}).get("tools", [])
        except (httpx.HTTPError, ValueError, AttributeError):
            return []  # a server without the tools route (an OpenEnv server): no tools
        return [t for t in listed if isinstance(t, dict) and isinstance(t.get("name"), str)]

    def release(self, session: ToolSession) -> None:
        """Give a session back for the next instance."""
        with self._lock:
            self._idle.append(session)

    @property
    def idle(self) -> int:
        """Sessions waiting for an instance."""
        return len(self._idle)

    def action_schema(self) -> dict[str, Any]:
        """The JSON Schema of the environment's Action model."""
        schema: dict[str, Any] = self.models()[0].model_json_schema()
        return schema

    def close(self) -> None:
        """Close the idle sessions and stop the local server (sessions still held by
        instances are closed by the server stopping)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for session in idle:
            session.close()
        if self.server is not None:
            self.server.stop_now()


def render_observation(observation: Observation) -> str:
    """The default text of an observation (:func:`corral.contract.readable.observation_text`):
    its own fields as JSON with arrays as numbers, plus a line when the episode is over."""
    return observation_text(observation)


class CorralEnvironment:
    """Base of the classes :func:`environment_factory` generates (one tool method each).

    Attributes:
        reward: the episode's return so far.
        rewards: each step's reward.
        done: the episode has ended.
        observation: the last observation.
        steps: actions taken this episode.
    """

    _pool: SessionPool
    _render: Callable[[Observation], str]
    _seed_column: str | None
    _option_columns: tuple[str, ...]

    def __init__(self) -> None:
        session = type(self)._pool.acquire()
        self._session = session
        weakref.finalize(self, type(self)._pool.release, session)
        self.reward = 0.0
        self.rewards: list[float] = []
        self.done = False
        self.observation: Observation | None = None
        self.steps = 0

    def reset(self, **kwargs: Any) -> str:
        """Start an episode from a dataset row; returns the first observation as text.

        The row's ``seed`` column (see ``seed_column``) seeds the episode and the
        ``option_columns`` become reset options; other columns (``prompt``...) are ignored.
        """
        cls = type(self)
        seed = kwargs.get(cls._seed_column) if cls._seed_column else None
        if seed is not None and not isinstance(seed, int):
            raise TypeError(f"the {cls._seed_column!r} column must hold integers, got {seed!r}")
        options = {k: kwargs[k] for k in cls._option_columns if k in kwargs}
        result = self._session.reset(seed, **options)
        self.reward, self.rewards, self.done, self.steps = 0.0, [], result.done, 0
        self.observation = result.observation
        return cls._render(result.observation)

    def _act(self, action: dict[str, Any]) -> str:
        if self.done:
            raise RuntimeError("the episode is over: no more actions are accepted")
        result = self._session.step(action)
        reward = 0.0 if result.reward is None else float(result.reward)
        self.rewards.append(reward)
        self.reward += reward
        self.steps += 1
        self.done = result.done
        self.observation = result.observation
        return type(self)._render(result.observation)

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        session = self._session
        assert isinstance(session, LocalSession | HttpSession)  # the pool's choice with tools
        return session.call_tool(name, arguments)

    @property
    def state(self) -> BaseModel:
        """The environment's current State (one round trip for remote sessions)."""
        return self._session.state()


def environment_factory(
    source: type[Environment[Any, Any, Any]] | str,
    *,
    env: type[Environment[Any, Any, Any]] | None = None,
    tool_name: str | None = None,
    render: Callable[[Observation], str] = render_observation,
    seed_column: str | None = "seed",
    option_columns: Sequence[str] = (),
    reward_method: bool = False,
    class_name: str | None = None,
    **client_kwargs: Any,
) -> type[CorralEnvironment]:
    """A class for ``GRPOTrainer(environment_factory=...)`` (see the module docstring).

    Args:
        source: an Environment subclass (in-process), a server URL, or a ``corral serve``
            target (one local server is started and shared).
        env: for remote sources, the environment class whose models to use.
        tool_name: the tool's name (default: the Action model's name without ``Action``,
            in snake case, e.g. ``wordle``).
        render: turns an observation into the text the model reads.
        seed_column: the dataset column seeding each episode (None: never seed).
        option_columns: dataset columns passed as reset options.
        reward_method: also define ``get_reward()`` (the episode's return), which TRL
            then uses as a reward source of its own.
        class_name: the generated class's name (default: from the Action model).
        client_kwargs: more :class:`AsyncEnvClient` arguments for remote sessions.

    Raises:
        TypeError / ValueError: a bad source, a reserved or invalid tool name, or an
            Action field whose name cannot be a Python argument.
    """
    pool = SessionPool(source, env=env, **client_kwargs)
    schema = pool.action_schema()
    title, stem = action_title(schema), action_stem(schema)
    name = action_tool_name(schema, tool_name)
    attrs: dict[str, Any] = {
        "__doc__": f"The {title} tool environment (generated by corral's environment_factory).",
        "_pool": pool,
        "_render": staticmethod(render),
        "_seed_column": seed_column,
        "_option_columns": tuple(option_columns),
        name: _tool_method(name, schema),
    }
    for spec in pool.tools():
        tool_name_ = str(spec["name"])
        if tool_name_ in attrs or tool_name_ in _TAKEN or not IDENTIFIER.match(tool_name_):
            raise ValueError(
                f"the environment's tool {tool_name_!r} cannot be a method of the TRL class "
                f"(reserved, taken by the action tool {name!r}, or not a Python identifier); "
                "rename it with @tool(name=...) or pass tool_name=..."
            )
        attrs[tool_name_] = _env_tool_method(spec)
    if reward_method:
        attrs["get_reward"] = _get_reward
    generated: type[CorralEnvironment] = type(
        class_name or f"{stem}Environment", (CorralEnvironment,), attrs
    )
    return generated


def _get_reward(self: CorralEnvironment) -> float:
    """The episode's return: the sum of its step rewards."""
    return self.reward


def _tool_method(name: str, schema: dict[str, Any]) -> Callable[..., str]:
    """The action tool: a function with a real signature, annotations and docstring."""
    return _typed_method(
        name,
        schema,
        action_summary(schema),
        "What the environment shows after the action.",
        lambda self, arguments: self._act(arguments),
    )


def _env_tool_method(spec: dict[str, Any]) -> Callable[..., str]:
    """An environment ``@tool`` as a method, from its ``tools/list`` descriptor."""
    name = str(spec["name"])
    schema = spec.get("inputSchema") or {}
    return _typed_method(
        name,
        schema,
        str(spec.get("description") or f"The environment's {name} tool."),
        "The tool's result (JSON unless it is text).",
        lambda self, arguments: self._call_tool(name, arguments),
    )


def _typed_method(
    name: str,
    schema: dict[str, Any],
    summary: str,
    returns: str,
    call: Callable[[CorralEnvironment, dict[str, Any]], str],
) -> Callable[..., str]:
    """A function with a real signature, annotations and a Google-style docstring built
    from the JSON Schema of its arguments object, calling ``call(self, arguments)``."""
    defs: dict[str, Any] = schema.get("$defs", {})
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    params: list[inspect.Parameter] = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    annotations: dict[str, Any] = {}
    lines: list[str] = []
    order = [p for p in properties if p in required] + [p for p in properties if p not in required]
    for field in order:
        if not IDENTIFIER.match(field) or field == "self":
            raise ValueError(
                f"Action field {field!r} cannot be a tool argument (not a Python identifier)"
            )
        node = _resolve(properties[field], defs)
        annotation = _annotation(node, defs)
        default = inspect.Parameter.empty if field in required else node.get("default")
        params.append(
            inspect.Parameter(
                field,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=default,
                annotation=annotation,
            )
        )
        annotations[field] = annotation
        lines.append(f"    {field}: {describe_field(field, node)}")
    signature = inspect.Signature(params, return_annotation=str)

    def tool(self: CorralEnvironment, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return call(self, {k: v for k, v in bound.arguments.items() if k != "self"})

    summary = " ".join(summary.split())
    doc = summary + "\n\nArgs:\n" + "\n".join(lines) if lines else summary
    doc += f"\n\nReturns:\n    {returns}"
    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = doc
    tool.__signature__ = signature  # type: ignore[attr-defined]
    tool.__annotations__ = {**annotations, "return": str}
    return tool


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its references followed (one rule: :mod:`corral.contract.refs`);
    one that does not resolve, or a cycle, leaves the node's other keywords alone."""
    try:
        return dict(SchemaReader.of_defs(defs).deref(node))
    except RefError:
        return {k: v for k, v in node.items() if k != "$ref"}


_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _annotation(node: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A type hint ``get_json_schema`` turns back into (close to) ``node``."""
    node = _resolve(node, defs)
    ndarray = node.get("x-corral-ndarray")
    if isinstance(ndarray, dict):
        dtype = str(ndarray.get("dtype") or "")
        leaf: Any = {"f": float, "b": bool}.get(dtype[1:2], int) if dtype else float
        for _ in ndarray.get("shape") or [None]:
            leaf = list[leaf]
        return leaf
    if "const" in node:
        return Literal[node["const"]]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return Literal[tuple(node["enum"])]
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            members = [_annotation(m, defs) for m in node[key]]
            return Union[tuple(members)]  # noqa: UP007 - built at run time
    kind = node.get("type")
    if isinstance(kind, list):
        return Union[tuple(_annotation({**node, "type": k}, defs) for k in kind)]  # noqa: UP007
    if kind == "null":
        return type(None)
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        prefix = node.get("prefixItems")
        if prefix:
            return tuple.__class_getitem__(tuple(_annotation(p, defs) for p in prefix))
        items = node.get("items")
        return list[_annotation(items, defs)] if isinstance(items, dict) else list  # type: ignore[misc]
    if kind == "object":
        return dict[str, Any]
    return Any


__all__ = [
    "CorralEnvironment",
    "LocalSession",
    "SessionPool",
    "environment_factory",
    "render_observation",
]
