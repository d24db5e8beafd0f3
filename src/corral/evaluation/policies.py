"""Policies for ``corral eval``: who picks the actions.

A :class:`Policy` makes one *agent* per episode (``policy.agent(seed, task)``); an agent
is a callable taking the observation and returning the action (a model or a dict),
plain or ``async``. An agent may also have ``feedback(message)``, called when its last
action failed (the LLM policy tells the model).

Built in (:func:`load_policy`):

* ``random``: actions drawn from the action's JSON Schema (:class:`SchemaSampler`),
  seeded per episode;
* ``scripted``: the environment's own baseline, ``Environment.scripted_policy(seed)``
  (Wordle: :class:`~corral.envs.wordle.SimplePolicy`);
* ``PATH:NAME``: a function or class from a module (``my_pkg.agents:greedy``) or a file
  (``agents.py:Greedy``); a class is instantiated per episode (with ``seed=`` when its
  constructor takes it) and its ``act`` method (or the instance) is the agent;
* ``llm``: an OpenAI-compatible chat endpoint (:mod:`corral.evaluation.llm`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from corral.contract import Environment
from corral.contract.refs import RefError, SchemaReader
from corral.contract.tasks import TaskRef
from corral.errors import UsageError
from corral.server.target import TargetError, load_target

Agent = Callable[[Any], Any]
"""Observation in, action (model or dict) out; may return an awaitable."""

_PARSER: Any = importlib.import_module("re._parser")  # the stdlib's regex parser


class PolicyError(UsageError, ValueError):
    """A policy could not be loaded or cannot act; the message says how to fix it."""


@dataclass
class Policy:
    """Makes the agent of each episode.

    Attributes:
        name: how reports name it (``random``, ``scripted``, ``pkg.mod:fn``, ``llm:model``).
        make: ``(seed, task) -> agent``.
    """

    name: str
    make: Callable[[int | None, TaskRef | None], Agent]

    def agent(self, seed: int | None, task: TaskRef | None = None) -> Agent:
        """The agent of one episode."""
        return self.make(seed, task)


def load_policy(
    spec: str,
    *,
    action_type: type[BaseModel] | None = None,
    env: type[Environment[Any, Any, Any]] | None = None,
    search_path: Path | None = None,
) -> Policy:
    """The policy named by ``spec`` (see the module docstring; ``llm`` is built by
    :func:`corral.evaluation.llm.llm_policy`, which needs the endpoint).

    Args:
        spec: ``random``, ``scripted`` or ``PATH:NAME``.
        action_type: the environment's Action model (``random`` needs it).
        env: the environment class, for ``scripted``.
        search_path: where ``module:name`` references are imported from (default: cwd).

    Raises:
        PolicyError: the spec names nothing usable.
    """
    if spec == "random":
        if action_type is None:
            raise PolicyError("--policy random needs the action model")
        sampler = SchemaSampler(action_type)
        return Policy("random", lambda seed, task: sampler.agent(seed))
    if spec == "scripted":
        if env is None:
            raise PolicyError(
                "--policy scripted needs the environment class: give TARGET as module:Class "
                "(or --env module:Class with a URL)"
            )
        if env.scripted_policy(0) is None:
            raise PolicyError(
                f"{env.__name__} has no scripted policy (Environment.scripted_policy); "
                "use --policy random or --policy PATH:NAME"
            )
        return Policy("scripted", lambda seed, task: _scripted(env, seed))
    if ":" in spec:
        return _from_reference(spec, search_path)
    raise PolicyError(
        f"unknown policy {spec!r}: use random, scripted, llm (with --llm-url and --model) "
        "or PATH:NAME (a function or class in a module or .py file)"
    )


def _scripted(env: type[Environment[Any, Any, Any]], seed: int | None) -> Agent:
    agent = env.scripted_policy(seed)
    assert agent is not None
    return agent


def _from_reference(spec: str, search_path: Path | None) -> Policy:
    where, _, name = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            obj = _from_file(Path(where), name)
        else:
            obj = load_target(spec, search_path=search_path or Path.cwd())
    except (TargetError, ImportError, OSError, AttributeError) as exc:
        raise PolicyError(f"cannot load policy {spec!r}: {exc}") from None
    if inspect.isclass(obj):
        cls: Callable[..., Any] = obj
        takes_seed = "seed" in inspect.signature(cls).parameters

        def make(seed: int | None, task: TaskRef | None) -> Agent:
            instance = cls(seed=seed) if takes_seed else cls()
            act: Agent = getattr(instance, "act", instance)
            if not callable(act):
                raise PolicyError(f"{spec}: instances have no act() method and are not callable")
            return act

        return Policy(spec, make)
    if callable(obj):
        return Policy(spec, lambda seed, task: obj)
    raise PolicyError(f"policy {spec!r} is a {type(obj).__name__}, not a function or class")


def _from_file(path: Path, name: str) -> Any:
    if not path.is_file():
        raise OSError(f"no such file {path}")
    module_name = f"corral_policy_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


class SchemaSampler:
    """Draws random valid instances of a model from its JSON Schema.

    Covers what action schemas use: ``const``, ``enum``, unions, booleans, bounded
    numbers, strings (lengths, and ``pattern``: a string matching the regex is built
    from it), arrays, nested objects and ``$ref``. Each draw is validated with the
    model; a schema it cannot satisfy falls back to the schema's ``examples``.

    Raises:
        PolicyError: (on :meth:`draw`) nothing valid could be drawn.
    """

    attempts = 50

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self.schema = model.model_json_schema()

    def agent(self, seed: int | None) -> Agent:
        """An agent drawing with its own generator seeded by ``seed``."""
        rng = random.Random(seed)
        return lambda observation: self.draw(rng)

    def draw(self, rng: random.Random) -> BaseModel:
        """One random valid instance."""
        for _ in range(self.attempts):
            value = self._value(self.schema, rng, 0)
            try:
                return self.model.model_validate(value)
            except ValidationError:
                continue
        for example in self.schema.get("examples", []) or []:
            try:
                return self.model.model_validate(example)
            except ValidationError:
                continue
        raise PolicyError(
            f"cannot draw a valid random {self.model.__name__} from its schema; use "
            "--policy PATH:NAME with a policy of your own"
        )

    def _value(self, node: Any, rng: random.Random, depth: int) -> Any:
        if not isinstance(node, Mapping) or depth > 8:
            return None
        if "$ref" in node:
            return self._value(self._resolve(node), rng, depth + 1)
        if "const" in node:
            return node["const"]
        if isinstance(node.get("enum"), list) and node["enum"]:
            return rng.choice(node["enum"])
        for key in ("anyOf", "oneOf"):
            members = node.get(key)
            if isinstance(members, list) and members:
                real = [
                    m for m in members if not (isinstance(m, Mapping) and m.get("type") == "null")
                ]
                return self._value(rng.choice(real or members), rng, depth + 1)
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
            return self._value(node["allOf"][0], rng, depth + 1)
        kind = node.get("type")
        if isinstance(kind, list):
            kind = rng.choice([k for k in kind if k != "null"] or kind)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind in ("integer", "number"):
            return self._number(node, rng, integer=kind == "integer")
        if kind == "string":
            return self._string(node, rng)
        if kind == "array":
            low = int(node.get("minItems", 0))
            high = int(node.get("maxItems", low + 3))
            return [
                self._value(node.get("items", {}), rng, depth + 1)
                for _ in range(rng.randint(low, max(low, high)))
            ]
        if kind == "object" or "properties" in node:
            required = set(node.get("required", []))
            return {
                name: self._value(sub, rng, depth + 1)
                for name, sub in (node.get("properties") or {}).items()
                if name in required or rng.random() < 0.5
            }
        return None

    def _resolve(self, node: Mapping[str, Any]) -> Any:
        """``node`` with its references followed (one rule: :mod:`corral.contract.refs`);
        None, drawing nothing, for one that does not resolve or a cycle."""
        try:
            return SchemaReader(self.schema).deref(node)
        except RefError:
            return None

    @staticmethod
    def _number(node: Mapping[str, Any], rng: random.Random, *, integer: bool) -> float | int:
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        low = (
            float(low)
            if isinstance(low, (int, float))
            else (float(high) - 10 if isinstance(high, (int, float)) else -10.0)
        )
        high = float(high) if isinstance(high, (int, float)) else low + 20.0
        if integer:
            return rng.randint(int(low), max(int(low), int(high)))
        return rng.uniform(low, high)

    @staticmethod
    def _string(node: Mapping[str, Any], rng: random.Random) -> str:
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            try:
                return _from_regex(_PARSER.parse(pattern), rng)
            except (ValueError, TypeError, KeyError, RecursionError, _PARSER.error):
                pass  # an unsupported construct: fall back to plain text
        low = int(node.get("minLength", 1))
        high = int(node.get("maxLength", low + 8))
        size = rng.randint(low, max(low, min(high, low + 8)))
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(size))


_CATEGORY_CHARS = {
    "CATEGORY_DIGIT": "0123456789",
    "CATEGORY_WORD": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
    "CATEGORY_SPACE": " ",
}


def _from_regex(parsed: Any, rng: random.Random) -> str:
    """A string matching a parsed regex (literals, classes, repeats, groups, branches)."""
    out: list[str] = []
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "ANY":
            out.append(rng.choice("abcdefghijklmnopqrstuvwxyz"))
        elif name == "IN":
            out.append(_from_class(arg, rng))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            high = low + 4 if high == _PARSER.MAXREPEAT else high
            out.extend(_from_regex(sub, rng) for _ in range(rng.randint(low, max(low, high))))
        elif name == "SUBPATTERN":
            out.append(_from_regex(arg[-1], rng))
        elif name == "BRANCH":
            out.append(_from_regex(rng.choice(arg[1]), rng))
        elif name == "AT":
            continue  # anchors match by construction
        else:
            raise ValueError(f"unsupported regex construct {name}")
    return "".join(out)


def _from_class(items: Any, rng: random.Random) -> str:
    choices: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            raise ValueError("negated class")
        if name == "LITERAL":
            choices.append(chr(arg))
        elif name == "RANGE":
            choices.extend(chr(c) for c in range(arg[0], arg[1] + 1))
        elif name == "CATEGORY":
            choices.extend(_CATEGORY_CHARS.get(str(arg), ""))
    if not choices:
        raise ValueError("empty class")
    return rng.choice(choices)
