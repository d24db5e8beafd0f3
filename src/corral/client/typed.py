"""The typed face of the clients: the contract's three models, actions out, replies in.

:class:`AsyncEnvClient <corral.client.env_client.AsyncEnvClient>` and
:class:`EnvPool <corral.client.pool.EnvPool>` both hold one :class:`TypedModels`. The
models come from the environment class (``env=``), from the classes given one by one
(``action_type=`` / ``observation_type=`` / ``state_type=``), or, for whatever is still
missing at connect time, from the schemas the server publishes in its ``welcome``
(:meth:`TypedModels.adopt_schemas`). No per-environment parsing code anywhere.

Actions are validated locally before they are sent, so a bad action fails at once with
:class:`~corral.errors.InvalidAction` and nothing crosses the wire; observations and
states are validated into their models, and one that does not match the contract is
:class:`~corral.errors.BadObservation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import annotated_types
from pydantic import BaseModel, ValidationError

from corral.contract import Action, Environment, Observation, State
from corral.contract.schema import compact_schema, fingerprint, model_schemas
from corral.errors import BadObservation, InvalidAction, validation_message
from corral.protocol.codecs import Codec, list_adapter
from corral.protocol.messages import ContractRef

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)

DEFAULT_CONTRACT_VERSION = "1.0.0"
"""The contract version sent with models given one by one (no environment class)."""


class TypedModels(Generic[ActT, ObsT, StateT]):
    """The Action, Observation and State models of one client or pool.

    Args:
        env: the environment class, to take the models (and contract version) from it.
        action_type / observation_type / state_type: the models, given one by one
            (each overrides the one of ``env``).
        check_contract: send the local contract at connect time, so that an
            incompatible server refuses the connection (``CONTRACT_MISMATCH``).
    """

    def __init__(
        self,
        env: type[Environment[ActT, ObsT, StateT]] | None = None,
        action_type: type[ActT] | None = None,
        observation_type: type[ObsT] | None = None,
        state_type: type[StateT] | None = None,
        *,
        check_contract: bool = True,
    ) -> None:
        self.contract_version = DEFAULT_CONTRACT_VERSION
        if env is not None:
            action_type = action_type or env.action_type  # type: ignore[assignment]
            observation_type = observation_type or env.observation_type  # type: ignore[assignment]
            state_type = state_type or env.state_type  # type: ignore[assignment]
            self.contract_version = env.contract_version
        self.action_type: type[ActT] | None = action_type
        self.observation_type: type[ObsT] | None = observation_type
        self.state_type: type[StateT] | None = state_type
        self.check_contract = check_contract
        self._contract: ContractRef | None = None
        self._env = env

    @property
    def incomplete(self) -> bool:
        """Some model is still unknown: ask the server for its schemas at connect."""
        return None in (self.action_type, self.observation_type, self.state_type)

    def local_contract(self) -> ContractRef | None:
        """The contract to send in ``hello``: None unless checked and every model is known."""
        if not self.check_contract or self.incomplete:
            return None
        if self._contract is None:  # the schemas are costly to build: once per face
            assert self.action_type and self.observation_type and self.state_type
            models = (self.action_type, self.observation_type, self.state_type)
            schemas = model_schemas(*models)
            compact = {name: compact_schema(schema) for name, schema in schemas.items()}
            env = self._env
            if env is not None and models == (
                env.action_type,
                env.observation_type,
                env.state_type,
            ):
                # the env's own contract: its reset options are fingerprinted too
                fp = env.contract().fingerprint
            else:
                fp = fingerprint(schemas)
            self._contract = ContractRef(self.contract_version, fp, compact)
        return self._contract

    def adopt_schemas(self, schemas: dict[str, Any]) -> None:
        """Build the models still missing from the server's published ``schemas``."""
        from corral.contract.dynamic import contract_models

        action, observation, state = contract_models(schemas)
        self.action_type = self.action_type or action  # type: ignore[assignment]
        self.observation_type = self.observation_type or observation  # type: ignore[assignment]
        self.state_type = self.state_type or state  # type: ignore[assignment]

    # -- out: actions ---------------------------------------------------------------

    def action(self, action: ActT | Mapping[str, Any], index: int | None = None) -> BaseModel:
        """``action`` as a validated Action model (a model of another class or a dict too).

        Raises:
            InvalidAction: it fails validation; ``index`` (a position in a batch) is
                named in the message and ``details``.
        """
        action_type = self.action_type
        assert action_type is not None
        if isinstance(action, action_type):
            return action
        raw = action.model_dump() if isinstance(action, BaseModel) else dict(action)
        try:
            return action_type.model_validate(raw)
        except ValidationError as exc:
            where = "" if index is None else f"action {index}: "
            details: dict[str, Any] = {} if index is None else {"index": index}
            details["errors"] = exc.errors(include_url=False, include_context=False)
            raise InvalidAction(
                validation_message(f"{where}invalid {action_type.__name__}", exc),
                details=details,
            ) from None

    def encode_actions(
        self, actions: Sequence[ActT | Mapping[str, Any]], codec: Codec
    ) -> list[Any]:
        """The wire objects of ``actions``, validated first (nothing is sent if one fails)."""
        dump = codec.dump
        action_type = self.action_type
        if action_type is not None:
            fields = int_fields(action_type)
            if fields is not None:
                payloads = _plain_ints(actions, fields)
                if payloads is not None:
                    return payloads
            if all(type(a) is action_type for a in actions):
                # Models of exactly the contract's type are valid as they are: one
                # serializer call for the batch (a trainer's 100,000 actions are dumped
                # before the round's first message can leave).
                return codec.dump_many(action_type, list(actions))
        if action_type is not None and all(type(a) is dict for a in actions):
            # Plain dicts (what the Gymnasium and SB3 adapters send): one validation call
            # for the batch, as for observations; a bad one is named below, by index.
            with contextlib.suppress(ValidationError):
                models = list_adapter(action_type).validate_python(actions)
                return codec.dump_many(action_type, models)  # all of exactly that type
        return [dump(self.action(action, k)) for k, action in enumerate(actions)]

    # -- in: observations and states -----------------------------------------------

    def load(self, model: type[Any], obj: Any, codec: Codec) -> Any:
        """Validate a wire object into ``model``.

        Raises:
            BadObservation: it does not match the contract.
        """
        try:
            return codec.load(model, obj)
        except ValidationError as exc:
            raise BadObservation(
                f"the server sent a {model.__name__} that does not match the contract: {exc}"
            ) from None

    def observation(self, raw: Any, codec: Codec) -> ObsT:
        """A typed observation from its wire object."""
        assert self.observation_type is not None
        obs: ObsT = self.load(self.observation_type, raw, codec)
        return obs

    def observations(self, raws: list[Any], codec: Codec) -> list[ObsT]:
        """Many observations: in one validation call on the binary codec
        (:meth:`Codec.load_many`), else one by one."""
        if raws and self.observation_type is not None:
            with contextlib.suppress(ValidationError):  # a bad one is named below
                observations: list[ObsT] = codec.load_many(self.observation_type, raws)
                return observations
        return [self.observation(raw, codec) for raw in raws]

    def state(self, raw: Any, codec: Codec) -> StateT:
        """A typed state from its wire object."""
        assert self.state_type is not None
        state: StateT = self.load(self.state_type, raw, codec)
        return state


IntField = tuple[str, int | None, int | None]
"""A field's name and inclusive bounds (None: unbounded)."""


@functools.lru_cache(maxsize=64)
def int_fields(model: type[BaseModel]) -> tuple[IntField, ...] | None:
    """The fields of ``model`` when it is only plain, bounded integers: no validator,
    serializer, computed field, post-init hook, alias or exclusion, no constraint but
    bounds. Such a model's dump of a validated dict with exactly those keys and ``int``
    values in bounds is that dict, so a batch of them is encoded without the model
    (a Discrete action, as the Gymnasium and SB3 adapters send it). None otherwise."""
    decorators = model.__pydantic_decorators__
    if (
        any(getattr(decorators, f.name) for f in dataclasses.fields(decorators))
        or model.__pydantic_post_init__ is not None
        or model.model_computed_fields
        or not model.model_fields
    ):
        return None
    fields: list[IntField] = []
    for name, info in model.model_fields.items():
        if info.annotation is not int or info.exclude or info.alias not in (None, name):
            return None
        if info.validation_alias is not None or info.serialization_alias is not None:
            return None
        low: int | None = None
        high: int | None = None
        for bound in info.metadata:
            if isinstance(bound, annotated_types.Ge) and type(bound.ge) is int:
                low = bound.ge if low is None else max(low, bound.ge)
            elif isinstance(bound, annotated_types.Gt) and type(bound.gt) is int:
                low = bound.gt + 1 if low is None else max(low, bound.gt + 1)
            elif isinstance(bound, annotated_types.Le) and type(bound.le) is int:
                high = bound.le if high is None else min(high, bound.le)
            elif isinstance(bound, annotated_types.Lt) and type(bound.lt) is int:
                high = bound.lt - 1 if high is None else min(high, bound.lt - 1)
            else:
                return None
        fields.append((name, low, high))
    return tuple(fields)


def _plain_ints(
    actions: Sequence[Any], fields: tuple[IntField, ...]
) -> list[dict[str, int]] | None:
    """The wire objects of ``actions`` when each is a dict of exactly ``fields`` with
    ``int`` values in bounds (what validating and dumping them would give), else None."""
    payloads: list[dict[str, int]] = []
    count = len(fields)
    for action in actions:
        if type(action) is not dict or len(action) != count:
            return None
        payload: dict[str, int] = {}
        for name, low, high in fields:
            value = action.get(name)
            if type(value) is not int:
                return None
            if (low is not None and value < low) or (high is not None and value > high):
                return None
            payload[name] = value
        payloads.append(payload)
    return payloads


class TypedFace(Generic[ActT, ObsT, StateT]):
    """The models of a client or a pool as its own attributes (read from its ``typed``)."""

    typed: TypedModels[ActT, ObsT, StateT]

    @property
    def action_type(self) -> type[ActT] | None:
        """The Action model (None until known: given, or read from the server)."""
        return self.typed.action_type

    @property
    def observation_type(self) -> type[ObsT] | None:
        """The Observation model (None until known)."""
        return self.typed.observation_type

    @property
    def state_type(self) -> type[StateT] | None:
        """The State model (None until known)."""
        return self.typed.state_type
