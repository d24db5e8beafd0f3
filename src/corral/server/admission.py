"""Admission: a request's payload into an environment call, and the call's result back out.

The same steps for a single request and for every item of a batch, so the two paths
cannot drift apart:

* :meth:`Admission.call` turns an admitted operation into the runner call to make:
  the wire action loaded into the Action model (after the action migration of a client
  of an older contract major; ``INVALID_ACTION`` with pydantic's errors otherwise), or
  the reset seed and options, checked against the keywords ``reset`` takes and the
  names no ``reset(seed, **options)`` call can carry (non-string keys, ``seed``,
  ``self``): every option problem is ``INVALID_ARGUMENT``, the client's fault, never
  ``ENV_ERROR``. The options reach the runner as one mapping, never as its own
  keywords, so a name the runner uses (``method``, ``timeout``) is the environment's;
* :meth:`Admission.result` and :meth:`Admission.state` check that the environment
  returned its contract's model and dump it with the connection's codec
  (``BAD_OBSERVATION``); a non-finite reward (NaN, ±inf) is ``BAD_OBSERVATION`` on
  every codec, since JSON cannot carry it (it would arrive as ``null``, msgpack as
  NaN): a reward is the same number whatever the wire, or an error;
* :meth:`Admission.actions` and :meth:`Admission.results` do the same for a batch's
  items at once: one validator or serializer call for the whole batch when every item
  passes (the common case), item by item otherwise, so each item still gets its own
  answer and the same errors;
* :meth:`Admission.failure` maps whatever a call raised to the error to send: corral's
  own errors as they are, anything the environment raised as ``ENV_ERROR``.

A ``snapshot`` is a call like ``state`` (its value is sealed by
:class:`~corral.protocol.snapshot.SnapshotSeal`); the observation a ``restore`` returns
is checked and dumped as a step's, without counting its reward again (the step that
first returned it was counted, on whichever server ran it).

Every error that leaves here as an answer is plain data, without its traceback
(:func:`~corral.server.env_failures.as_data`): a refused action's frames hold the
action, and must not outlive the refusal (issue 30.1).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from corral.contract import Environment, Observation, State
from corral.contract.options import (
    accepted_reset_options,
    check_reset_options,
    validate_reset_options,
)
from corral.contract.schema import Contract
from corral.contract.tasks import TaskBounds, with_task
from corral.errors import (
    BadObservation,
    CorralError,
    InvalidAction,
    InvalidArgument,
    validation_errors,
    validation_message,
)
from corral.protocol.batch import ResetItem, StepItem
from corral.protocol.fields import clip
from corral.protocol.messages import GetState, Reset, Step, TakeSnapshot
from corral.protocol.server import Peer
from corral.protocol.session import Op, SessionState
from corral.server.env_failures import as_data, env_failure
from corral.server.rewards import RewardStats

Payload = Reset | Step | GetState | TakeSnapshot | ResetItem | StepItem
"""What an environment call is made from: a single request, or one item of a batch."""

_STEPS = (Step, StepItem)
_RESETS = (Reset, ResetItem)
_NO_OPTIONS: dict[str, Any] = {}
"""The keywords of every step call: shared, never written (the runner only reads it)."""

RunnerCall = tuple[str, tuple[Any, ...], Any]
"""``(method, args, kwargs)`` of one environment call."""


_METHODS = {Op.STEP: "step", Op.RESTORE: "restore"}
"""The environment method that returned an observation, by operation (else ``reset``)."""


def _method(op: Op) -> str:
    return _METHODS.get(op, "reset")


RESERVED_OPTIONS = frozenset({"seed", "self"})
"""Option names no ``reset(self, seed, **options)`` call can carry: they are its own
positional parameters (the seed has its own field in the request). Nothing of the
runner's is here: options reach it as a mapping (:meth:`~corral.server.runner.Runner.call`)."""


def check_passable(options: dict[Any, Any]) -> None:
    """Refuse reset options no ``reset(seed, **options)`` call can carry.

    Raises:
        InvalidArgument: a key is not a string, or is one of :data:`RESERVED_OPTIONS`.
    """
    bad = [k for k in options if not isinstance(k, str)]
    if bad:
        raise InvalidArgument(
            f"reset option names must be strings; got {len(bad)} that are not "
            f"(first: {type(bad[0]).__name__} {clip(repr(bad[0]))})",
            details={"option": clip(repr(bad[0])), "reason": "not a string"},
        )
    reserved = sorted(RESERVED_OPTIONS.intersection(options))
    if reserved:
        raise InvalidArgument(
            f"reset option(s) {reserved} cannot be passed as options: they are reset's "
            "own parameters (send the seed in the reset's 'seed' field)",
            details={"reserved": reserved},
        )


def _check_finite(observation: Observation, env: str, method: str) -> None:
    """Refuse a non-finite reward or reward component (the rule on every codec).

    Raises:
        BadObservation: naming the field and its value.
    """
    reward = observation.reward
    components = observation.reward_components
    if not components and (reward is None or math.isfinite(reward)):
        return  # the common case, without building the list below (every batch item)
    named = [("reward", reward)] if reward is not None and not math.isfinite(reward) else []
    named += [(f"reward_components.{k}", v) for k, v in components.items() if not math.isfinite(v)]
    if named:
        field, value = named[0]
        raise BadObservation(
            f"{env}.{method}() returned a non-finite {field} ({value!r}); rewards must be "
            "finite numbers on every codec (JSON cannot carry NaN or infinity)",
            details={"field": field, "value": repr(value)},
        )


class Admission:
    """The payload and result rules of one environment class (see the module docstring)."""

    def __init__(
        self,
        env_type: type[Environment[Any, Any, Any]],
        contract: Contract,
        factory: Callable[[], Environment[Any, Any, Any]] | None = None,
    ) -> None:
        self.env_name = env_type.__name__
        self.contract = contract
        self.reset_options = accepted_reset_options(env_type.reset)
        """Keywords ``reset`` takes besides ``seed`` (None: any)."""
        self.tasks = TaskBounds(factory) if factory is not None and env_type.has_tasks() else None
        """The tasks face's splits and sizes, checked before a reset with a task runs."""
        self.rewards = RewardStats()
        """Every returned observation's reward and components, single call or batch item."""
        self._exact: type[Observation] | None = (
            contract.observation if issubclass(contract.observation, Observation) else None
        )
        """The contract's observation class when it is an Observation: a value of exactly
        this class needs no ``isinstance`` checks (the batch path's common case)."""
        self.debug = False
        """Send environment tracebacks to clients (``ServerConfig.debug``)."""

    def call(self, peer: Peer, op: Op, payload: Payload) -> RunnerCall:
        """The runner call ``(method, args, kwargs)`` for ``op`` on ``payload``.

        Raises:
            InvalidAction: the action does not load into the Action model.
            InvalidArgument: a reset option the environment does not take.
        """
        if op is Op.STEP:
            assert isinstance(payload, _STEPS)
            return "step", (self.action(peer, payload.action),), _NO_OPTIONS
        if op is Op.STATE:
            return "state", (), {}
        if op is Op.SNAPSHOT:
            return "snapshot", (), {}
        # A reset, or a step that auto-resets an ended episode (no seed, no options).
        if isinstance(payload, _RESETS):
            options = payload.options
            if isinstance(payload, Reset) and payload.task is not None:
                options = with_task(options, payload.task)
                if self.tasks is None:
                    raise InvalidArgument(
                        f"{self.env_name} publishes no tasks: reset it without a task",
                        details={"reason": "no_tasks"},
                    )
            check_passable(options)
            check_reset_options(options, self.reset_options, self.env_name)
            validate_reset_options(self.contract.reset_options, options, self.env_name)
            if self.tasks is not None:
                self.tasks.check(options)
            return "reset", (payload.seed,), options
        return self.auto_reset()

    @staticmethod
    def auto_reset(seed: int | None = None) -> RunnerCall:
        """The runner call of an auto-reset (:data:`Op.AUTO_RESET`): ``reset`` with no
        options, whatever the request that caused it carried, and no seed but the one a
        ``step_batch`` item gives its same-step reset (``reset_seed``)."""
        return "reset", (seed,), {}

    def action(self, peer: Peer, raw: Any) -> BaseModel:
        """Load a wire action into the Action model, migrating it first if need be.

        Raises:
            InvalidAction: with pydantic's errors (see :func:`corral.errors.validation_errors`).
        """
        model = self.contract.action
        if peer.migrate is not None and isinstance(raw, dict):
            # A copy: the request's payload is also its key in the reply cache, which a
            # migration editing the map in place would change under a retry.
            raw = peer.migrate(copy.deepcopy(raw))
        try:
            return peer.codec.load(model, raw)
        except ValidationError as exc:
            raise InvalidAction(
                validation_message(f"invalid {model.__name__}", exc),
                details={"errors": validation_errors(exc)},
            ) from None
        except (TypeError, ValueError, RecursionError) as exc:
            # The value could not even be handed to validation (e.g. nested deeper than
            # the JSON encoder goes): the client's action is at fault, not the env.
            raise InvalidAction(
                f"invalid {model.__name__}: {type(exc).__name__}: {exc}",
                details={"errors": [{"type": "unreadable", "loc": [], "msg": str(exc)}]},
            ) from None

    def calls(self, peer: Peer, work: list[tuple[Op, Payload]]) -> list[RunnerCall | CorralError]:
        """:meth:`call` of each of a batch's admitted items: the runner call, or the error
        of that item; the steps' actions are loaded together (:meth:`actions`)."""
        raws = [payload.action for op, payload in work if op is Op.STEP]  # type: ignore[union-attr]
        actions = iter(self.actions(peer, raws))
        out: list[RunnerCall | CorralError] = []
        for op, payload in work:
            if op is Op.STEP:
                action = next(actions)
                out.append(
                    action if isinstance(action, CorralError) else ("step", (action,), _NO_OPTIONS)
                )
                continue
            try:
                out.append(self.call(peer, op, payload))
            except CorralError as exc:
                out.append(as_data(exc))  # an outcome now: no frames (and payloads) held
        return out

    def actions(self, peer: Peer, raws: list[Any]) -> list[BaseModel | CorralError]:
        """:meth:`action` of each of a batch's wire actions: the loaded model, or the
        ``InvalidAction`` of that item.

        One validator call for the whole list when the client needs no migration;
        if any item fails it, each is loaded on its own to answer exactly as one by one.
        """
        if peer.migrate is None and raws:
            try:
                loaded: list[BaseModel | CorralError] = list(
                    peer.codec.load_many(self.contract.action, raws)
                )
            except Exception:  # some item is invalid: learn which, and why, item by item
                pass
            else:
                return loaded
        out: list[BaseModel | CorralError] = []
        for raw in raws:
            try:
                out.append(self.action(peer, raw))
            except CorralError as exc:
                out.append(as_data(exc))  # an outcome now: no frames (and payloads) held
        return out

    def results(
        self, peer: Peer, values: list[Any], ops: list[Op]
    ) -> list[tuple[Any, bool] | CorralError]:
        """:meth:`result` of each of a batch's returned values (``ops[i]`` produced
        ``values[i]``): ``(wire object, done)``, or the ``BadObservation`` of that item.

        The models of the contract's exact class are dumped in one serializer call
        (each on its own if that fails, to find the culprit), and the rewards are
        counted once for the batch.
        """
        model = self.contract.observation
        exact = self._exact
        out: list[Any] = [None] * len(values)  # every slot is filled below
        good: list[int] = []
        rewards: list[float | None] = []
        isfinite = math.isfinite
        for index, value in enumerate(values):
            if type(value) is not exact and (
                not isinstance(value, Observation) or not isinstance(value, model)
            ):
                out[index] = self._not_observation(value, ops[index])
                continue
            reward = value.reward
            if value.reward_components or not (reward is None or isfinite(reward)):
                try:
                    _check_finite(value, self.env_name, _method(ops[index]))
                except BadObservation as exc:
                    out[index] = exc
                    continue
            good.append(index)
            rewards.append(reward)  # finite or None: _check_finite refused the others
        ok = [values[i] for i in good]
        wires: list[Any] | None = None
        if all(type(value) is model for value in ok):
            try:
                wires = peer.codec.dump_many(model, ok)
            except Exception:  # some item cannot be dumped: find it below, one by one
                wires = None
        counted: list[float] = []
        components: list[Observation] = []
        for position, index in enumerate(good):
            value = values[index]
            if wires is not None:
                wire = wires[position]
            else:
                try:
                    wire = self._dump(peer, value, model, "observation")
                except BadObservation as exc:
                    out[index] = exc
                    continue
            out[index] = (wire, value.done)
            # The rewards read above, counted once dumped (a value that cannot be sent
            # was not returned to anyone); no second pass over the models' attributes.
            reward = rewards[position]
            if reward is not None:
                counted.append(reward)
            if value.reward_components:
                components.append(value)
        self.rewards.observe_many(counted, components)
        return out

    def _not_observation(self, value: Any, op: Op) -> BadObservation:
        model = self.contract.observation
        returned = type(value).__name__
        return BadObservation(
            f"{self.env_name}.{_method(op)}() returned {returned}, not {model.__name__}",
            details={"returned": type(value).__name__},
        )

    def result(self, peer: Peer, value: Any, op: Op) -> tuple[Any, bool]:
        """The observation ``reset``/``step`` returned, as ``(wire object, done)``.

        Raises:
            BadObservation: not the contract's Observation, or it cannot be dumped.
        """
        wire = self.observation(peer, value, op)
        self.rewards.observe(value)
        return wire, value.done

    def observation(self, peer: Peer, value: Any, op: Op) -> Any:
        """The observation ``op``'s method returned, checked and dumped (the reward not
        counted: :meth:`result` counts it; a restore's was counted when first returned).

        Raises:
            BadObservation: not the contract's Observation, or it cannot be dumped.
        """
        model = self.contract.observation
        if not isinstance(value, Observation) or not isinstance(value, model):
            raise self._not_observation(value, op)
        _check_finite(value, self.env_name, _method(op))
        return self._dump(peer, value, model, "observation")

    def state(self, peer: Peer, value: Any) -> Any:
        """The state ``state()`` returned, as a wire object.

        Raises:
            BadObservation: not a State, or it cannot be dumped.
        """
        if not isinstance(value, State):
            raise BadObservation(
                f"{self.env_name}.state() returned {type(value).__name__}, not a State"
            )
        return self._dump(peer, value, self.contract.state, "state")

    @staticmethod
    def _dump(peer: Peer, value: BaseModel, model: type[BaseModel], what: str) -> Any:
        try:
            return peer.codec.dump(value)
        except Exception as exc:
            raise BadObservation(
                f"the {what} could not be serialized: {exc}", details={"model": model.__name__}
            ) from None

    def failure(self, exc: BaseException, op: Op, session: SessionState) -> CorralError:
        """The error to answer a call of ``session`` that raised ``exc`` with (logged when
        the environment raised it; see :mod:`corral.server.env_failures`)."""
        return env_failure(exc, op, session, debug=self.debug)
