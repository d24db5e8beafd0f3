"""corral environments for TRL's ``GRPOTrainer(environment_factory=...)``.

    WordleTools = environment_factory("corral.envs.wordle:WordleEnv", tool_name="guess")

    def reward(environments, **kwargs):
        return [env.reward for env in environments]

    GRPOTrainer(model, reward_funcs=reward, train_dataset=dataset,
                environment_factory=WordleTools)

TRL builds one instance per rollout with no arguments, calls ``reset(**row)`` with the
dataset row (its return value is appended to the prompt), and offers every public method
of the class as a tool. The generated class has exactly one such method: the
environment's action, named ``tool_name``, with one typed argument per Action field and a
Google-style docstring built from the Action schema (what
``transformers.utils.get_json_schema`` reads). Calling it steps the environment and
returns the observation as text. Reward functions read ``reward`` (the episode's return),
``rewards``, ``done``, ``observation``, ``steps`` and ``state`` (one round trip) from the
instances.

Sessions come from one :class:`SessionPool` per generated class: instances take a
session when constructed and give it back when garbage-collected, so hundreds of rollouts
share one server (and reuse its sessions) instead of starting one each. The source is an
Environment subclass (run in-process, no server), a server URL, or a ``corral serve``
target (``module:Class`` or ``gym:ENV_ID``), for which one local server is started.
"""

from __future__ import annotations

import inspect
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, Union

import orjson
from pydantic import BaseModel

from corral.blocking import run_blocking
from corral.client import AsyncEnvClient, SyncEnvClient
from corral.client.local_server import LocalServer
from corral.contract import Environment, Observation, StepResult

RESERVED = frozenset({"reset", "get_reward", "state", "close"})
"""Names the generated tool may not take (TRL's and corral's own)."""

_HIDDEN_FIELDS = {"done", "truncated", "reward", "metadata"}
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class Session(Protocol):
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
    """An environment instance in this process, behind the :class:`Session` interface."""

    def __init__(self, env_type: type[Environment[Any, Any, Any]]) -> None:
        self.env_type = env_type
        self.env = env_type()

    def _run(self, value: Any) -> Any:
        # The Environment API allows ``async def`` methods; run those on corral's loop.
        return run_blocking(value, None) if inspect.iscoroutine(value) else value

    def reset(self, seed: int | None = None, **options: Any) -> StepResult[Any]:
        """Reset the instance."""
        return StepResult.of(self._run(self.env.reset(seed, **options)))

    def step(self, action: Mapping[str, Any]) -> StepResult[Any]:
        """Validate ``action`` against the Action model and step the instance."""
        model = self.env_type.action_type.model_validate(dict(action))
        return StepResult.of(self._run(self.env.step(model)))

    def state(self) -> BaseModel:
        """The instance's state."""
        state: BaseModel = self._run(self.env.state())
        return state

    def close(self) -> None:
        """Close the instance."""
        close: Callable[[], Any] = self.env.close
        self._run(close())


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
        self._idle: list[Session] = []
        self._lock = threading.Lock()

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

    def acquire(self) -> Session:
        """An idle session, or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if not isinstance(self.source, str):
                session: Session = LocalSession(self.source)
            else:
                client = AsyncEnvClient(self._server_url(), env=self.env, **self.client_kwargs)
                session = SyncEnvClient(client).connect()
            self.created += 1
            return session

    def release(self, session: Session) -> None:
        """Give a session back for the next instance."""
        with self._lock:
            self._idle.append(session)

    @property
    def idle(self) -> int:
        """Sessions waiting for an instance."""
        return len(self._idle)

    def action_schema(self) -> dict[str, Any]:
        """The JSON Schema of the environment's Action model."""
        if not isinstance(self.source, str):
            schema: dict[str, Any] = self.source.action_type.model_json_schema()
            return schema
        session = self.acquire()
        try:
            assert isinstance(session, SyncEnvClient)
            action_type = session.async_client.action_type
            assert action_type is not None
            remote: dict[str, Any] = action_type.model_json_schema()
            return remote
        finally:
            self.release(session)

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
    """The default text of an observation: its own fields as JSON, plus the outcome."""
    fields = observation.model_dump(mode="json", exclude=_HIDDEN_FIELDS)
    text = orjson.dumps(fields).decode()
    if observation.done:
        text += "\nThe episode is over" + (" (truncated)." if observation.truncated else ".")
    return text


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
    title = str(schema.get("title") or "Action")
    stem = title.removesuffix("Action") or "Act"
    name = tool_name or _snake(stem)
    if name in RESERVED or not _IDENTIFIER.match(name) or name.startswith("_"):
        raise ValueError(
            f"tool name {name!r} is reserved or not a Python identifier; pass tool_name=..."
        )
    attrs: dict[str, Any] = {
        "__doc__": f"The {title} tool environment (generated by corral's environment_factory).",
        "_pool": pool,
        "_render": staticmethod(render),
        "_seed_column": seed_column,
        "_option_columns": tuple(option_columns),
        name: _tool_method(name, schema),
    }
    if reward_method:
        attrs["get_reward"] = _get_reward
    generated: type[CorralEnvironment] = type(
        class_name or f"{stem}Environment", (CorralEnvironment,), attrs
    )
    return generated


def _get_reward(self: CorralEnvironment) -> float:
    """The episode's return: the sum of its step rewards."""
    return self.reward


def _snake(text: str) -> str:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    return re.sub(r"[^0-9A-Za-z]+", "_", words).strip("_").lower() or "act"


def _tool_method(name: str, schema: dict[str, Any]) -> Callable[..., str]:
    """The tool: a function with a real signature, annotations and docstring."""
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
        if not _IDENTIFIER.match(field) or field == "self":
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
        lines.append(f"    {field}: {_describe(field, node)}")
    signature = inspect.Signature(params, return_annotation=str)

    def tool(self: CorralEnvironment, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        action = {k: v for k, v in bound.arguments.items() if k != "self"}
        return self._act(action)

    summary = str(schema.get("description") or f"Take one {schema.get('title', 'action')}.")
    summary = " ".join(summary.split())
    doc = summary + "\n\nArgs:\n" + "\n".join(lines) if lines else summary
    doc += "\n\nReturns:\n    What the environment shows after the action."
    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = doc
    tool.__signature__ = signature  # type: ignore[attr-defined]
    tool.__annotations__ = {**annotations, "return": str}
    return tool


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while "$ref" in node and seen < 32:
        ref = str(node["$ref"]).rpartition("/")[2]
        node = {**defs.get(ref, {}), **{k: v for k, v in node.items() if k != "$ref"}}
        seen += 1
    return node


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


def _describe(field: str, node: dict[str, Any]) -> str:
    """The argument's docstring line: its description plus the constraints to respect."""
    text = str(node.get("description") or node.get("title") or field)
    text = " ".join(text.split())
    notes: list[str] = []
    for key, label in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("exclusiveMaximum", "<"),
    ):
        if key in node:
            notes.append(f"{label} {node[key]}")
    if "minLength" in node or "maxLength" in node:
        notes.append(f"length {node.get('minLength', 0)}..{node.get('maxLength', 'any')}")
    if "pattern" in node:
        notes.append(f"matching {node['pattern']}")
    if "properties" in node:
        notes.append(f"an object with fields {sorted(node['properties'])}")
    if "default" in node:
        notes.append(f"default {node['default']!r}")
    return text + (f" ({'; '.join(notes)})" if notes else "")


__all__ = [
    "CorralEnvironment",
    "LocalSession",
    "SessionPool",
    "environment_factory",
    "render_observation",
]
