"""The environment service: turns ``corral/1`` requests into environment calls.

It is transport-agnostic: the WebSocket endpoint (and any other transport) hands it a
:class:`Channel` (the connection's codec, reply queue and negotiated contract) and each
parsed request. Session requests run as tasks, so one connection multiplexes many
sessions; within a session the lifecycle machine keeps requests in order.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import reprlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from corral import __version__
from corral.contract import Contract, Environment, Observation, State, make_wire_safe
from corral.errors import (
    BadObservation,
    CorralError,
    EnvError,
    ErrorCode,
    HandshakeRequired,
    InternalError,
    InvalidAction,
    InvalidArgument,
    StepTimeout,
    TooManySessions,
)
from corral.protocol import batch as b
from corral.protocol import messages as m
from corral.protocol.codecs import Codec
from corral.protocol.handshake import Compat, check_protocol, negotiate
from corral.protocol.session import Op
from corral.server.batching import BatchHandler
from corral.server.config import ServerConfig
from corral.server.rewards import RewardStats
from corral.server.runner import EnvFactory
from corral.server.sessions import Session, SessionManager

log = logging.getLogger("corral.server")


@dataclass(eq=False)
class Channel:
    """One client connection as the service sees it; the sink of its sessions' replies."""

    codec: Codec
    sender: Callable[[dict[str, Any]], None]
    compat: Compat | None = None
    migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    owned: int = 0

    def send(self, message: dict[str, Any]) -> None:
        """Queue ``message`` for this connection."""
        self.sender(message)


def resolve_env(target: Any) -> tuple[type[Environment[Any, Any, Any]], EnvFactory]:
    """Split ``create_app``'s argument into the environment class and a factory.

    ``target`` is an :class:`Environment` subclass, or a zero-argument callable that
    returns an instance (called once here to learn its class).

    Raises:
        TypeError: ``target`` is an instance, or the factory returns a non-environment.
    """
    if isinstance(target, type) and issubclass(target, Environment):
        return target, target
    if isinstance(target, Environment):
        raise TypeError(
            "create_app() takes the environment class or a factory, not an instance: "
            "each session needs its own instance"
        )
    if not callable(target):
        raise TypeError(f"create_app() needs an Environment subclass or factory, got {target!r}")
    probe = target()
    if not isinstance(probe, Environment):
        raise TypeError(f"factory {target!r} returned {type(probe).__name__}, not an Environment")
    env_type = type(probe)
    probe.close()
    return env_type, target


class EnvService:
    """Serves one environment class to many sessions."""

    def __init__(self, target: Any, config: ServerConfig) -> None:
        env_type, factory = resolve_env(target)
        self.env_type = env_type
        self.contract: Contract = env_type.contract()
        for model in (self.contract.action, self.contract.observation, self.contract.state):
            make_wire_safe(model)
        self.fingerprint = self.contract.fingerprint
        self.config = config
        self.instance = uuid.uuid4().hex
        self.started = time.time()
        self.manager = SessionManager(
            factory,
            config,
            auto_reset=env_type.auto_reset,
            thread_affinity=env_type.thread_affinity,
        )
        self._reset_params = _accepted_options(env_type.reset)
        self.connections: dict[str, int] = {}
        """Open WebSocket connections by client address (for the per-client limit)."""
        self.batches = BatchHandler(self)
        self.rewards = RewardStats()
        """Reward and reward-component histograms (``/metrics``)."""

    # -- descriptions -------------------------------------------------------------

    def env_info(self) -> dict[str, Any]:
        """The environment's identity as the handshake and ``/metadata`` give it."""
        return {
            "name": self.contract.name,
            "description": self.env_type.description,
            "contract_version": self.contract.version,
            "fingerprint": self.fingerprint,
            "auto_reset": self.env_type.auto_reset,
        }

    def server_info(self) -> dict[str, Any]:
        """The server's identity; ``instance`` changes on every restart."""
        return {"name": "corral", "version": __version__, "instance": self.instance}

    # -- request handling ---------------------------------------------------------

    def send_error(self, channel: Channel, exc: CorralError, session: str | None = None) -> None:
        """Send ``exc`` as an error reply and count it."""
        self.manager.stats.error(str(exc.code))
        channel.send(
            m.error(
                exc.request_id, str(exc.code), exc.message, details=exc.details, session=session
            )
        )

    async def handle(self, channel: Channel, request: m.Request | b.BatchRequest) -> None:
        """Handle one parsed request; every outcome is a reply on ``channel``."""
        try:
            if isinstance(request, m.Hello):
                self._hello(channel, request)
            elif channel.compat is None:
                raise HandshakeRequired(
                    "send 'hello' (and get 'welcome') first", details={"type": request.type}
                )
            elif isinstance(request, m.Open):
                await self._open(channel, request)
            elif isinstance(request, m.Attach):
                self._attach(channel, request)
            elif isinstance(request, m.Close):
                await self._close(channel, request)
            elif isinstance(request, (b.StepBatch, b.ResetBatch)):
                self.batches.submit(channel, request)
            else:
                self._submit(channel, request)
        except CorralError as exc:
            exc.request_id = request.id
            self.send_error(channel, exc, getattr(request, "session", None))

    def _hello(self, channel: Channel, hello: m.Hello) -> None:
        check_protocol(hello)
        compat = negotiate(
            hello.contract,
            self.contract.version,
            self.fingerprint,
            self.env_type.action_migrations,
        )
        channel.compat = compat
        if compat is Compat.MIGRATED and hello.contract is not None:
            major = int(hello.contract.version.split(".")[0])
            channel.migrate = self.env_type.action_migrations[major]
        channel.send(
            m.welcome(
                hello.id,
                server=self.server_info(),
                env=self.env_info(),
                limits=self.config.limits(),
                compat=str(compat),
                schemas=self.contract.schemas if hello.want_schemas else None,
            )
        )

    async def _open(self, channel: Channel, request: m.Open) -> None:
        session = await self.manager.open(channel, channel.owned)
        channel.owned += 1
        channel.send(m.opened(request.id, session.id, session.token))

    def _attach(self, channel: Channel, request: m.Attach) -> None:
        live = self.manager.sessions.get(request.session)
        previous = live.owner if live is not None else None
        if previous is not channel and channel.owned >= self.config.max_sessions_per_connection:
            raise TooManySessions(
                f"this connection already holds {channel.owned} sessions",
                details={"limit": self.config.max_sessions_per_connection},
            )
        session = self.manager.attach(request.session, request.token, channel)
        if previous is not channel:
            # The session moves here from a dead (or not yet detected dead) connection:
            # the count of each connection must follow it, or a re-attach twice over
            # would wrongly exhaust the per-connection limit.
            channel.owned += 1
            if isinstance(previous, Channel):
                previous.owned -= 1
        channel.send(m.opened(request.id, session.id, session.token, kind="attached"))

    async def _close(self, channel: Channel, request: m.Close) -> None:
        session = self.manager.get(request.session, channel)
        await self.manager.close(session, "closed by the client")
        channel.owned -= 1
        channel.send(m.closed(request.id, session.id))

    def _submit(self, channel: Channel, request: m.SessionRequest) -> None:
        session = self.manager.get(request.session, channel)
        cached = session.cache.get(request.id)
        if cached is not None:
            channel.send(cached)  # a retry of an answered request: at most once
            return
        if session.machine.running == request.id:
            return  # a retry of the running request: its reply will come here
        op = session.machine.begin(request.type, request.id)
        session.task = asyncio.create_task(self._run(channel, session, request, op))

    async def _run(
        self, channel: Channel, session: Session, request: m.SessionRequest, op: Op
    ) -> None:
        timeout = self.config.step_timeout_s
        started = time.perf_counter()
        try:
            if op is Op.STATE:
                state = await session.runner.call("state", timeout=timeout)
                payload = self._dump(channel, state, self.contract.state, "state")
                session.machine.finish(op)
                reply = m.state_reply(request.id, session.id, payload)
            else:
                obs = await self._episode_call(channel, session, request, op, timeout)
                payload = self._dump(channel, obs, self.contract.observation, "observation")
                session.machine.finish(op, done=obs.done)
                reply = m.result(request.id, session.id, payload)
        except StepTimeout as exc:
            exc.request_id = request.id
            self._deliver_error(session, exc)
            await self.manager.close(session, "a call overran the step timeout")
            return
        except CorralError as exc:
            session.machine.abort()
            exc.request_id = request.id
            self._deliver_error(session, exc)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            session.machine.abort()
            error = EnvError(
                f"{type(exc).__name__}: {exc}",
                details={"exception": type(exc).__name__, "op": str(op)},
                request_id=request.id,
            )
            self._deliver_error(session, error)
            return
        self.manager.stats.observe(str(op), time.perf_counter() - started)
        session.deliver(reply)

    async def _episode_call(
        self,
        channel: Channel,
        session: Session,
        request: m.SessionRequest,
        op: Op,
        timeout: float | None,
    ) -> Observation:
        if op is Op.STEP:
            assert isinstance(request, m.Step)
            action = self._load_action(channel, request.action)
            obs = await session.runner.call("step", action, timeout=timeout)
            self.manager.stats.steps += 1
        else:
            seed, options = (
                (request.seed, request.options) if isinstance(request, m.Reset) else (None, {})
            )
            self._check_options(options)
            obs = await session.runner.call("reset", seed, timeout=timeout, **options)
            self.manager.stats.resets += 1
        return self._check_observation(obs, op)

    def _check_observation(self, obs: Any, op: Op) -> Observation:
        if not isinstance(obs, Observation) or not isinstance(obs, self.contract.observation):
            raise BadObservation(
                f"{self.env_type.__name__}.{'step' if op is Op.STEP else 'reset'}() returned "
                f"{type(obs).__name__}, not {self.contract.observation.__name__}",
                details={"returned": type(obs).__name__},
            )
        self.rewards.observe(obs)
        return obs

    def _load_action(self, channel: Channel, raw: Any) -> BaseModel:
        if channel.migrate is not None and isinstance(raw, dict):
            raw = channel.migrate(raw)
        try:
            return channel.codec.load(self.contract.action, raw)
        except ValidationError as exc:
            raise InvalidAction(
                f"invalid {self.contract.action.__name__}: {exc.error_count()} error(s)",
                details={"errors": _errors(exc)},
            ) from None
        except (TypeError, ValueError, RecursionError) as exc:
            # The value could not even be handed to validation (e.g. nested deeper than
            # the JSON encoder goes): the client's action is at fault, not the env.
            raise InvalidAction(
                f"invalid {self.contract.action.__name__}: {type(exc).__name__}: {exc}",
                details={"errors": [{"type": "unreadable", "loc": [], "msg": str(exc)}]},
            ) from None

    def _check_options(self, options: dict[str, Any]) -> None:
        if self._reset_params is None:
            return
        unknown = sorted(set(options) - self._reset_params)
        if unknown:
            raise InvalidArgument(
                f"unknown reset option(s) {unknown}; {self.env_type.__name__}.reset accepts "
                f"{sorted(self._reset_params) or 'no options'}",
                details={"unknown": unknown, "accepted": sorted(self._reset_params)},
            )

    def _dump(self, channel: Channel, value: Any, expected: type[BaseModel], what: str) -> Any:
        if what == "state" and not isinstance(value, State):
            raise BadObservation(
                f"{self.env_type.__name__}.state() returned {type(value).__name__}, not a State"
            )
        try:
            return channel.codec.dump(value)
        except Exception as exc:
            raise BadObservation(
                f"the {what} could not be serialized: {exc}", details={"model": expected.__name__}
            ) from None

    def _deliver_error(self, session: Session, exc: CorralError) -> None:
        self.manager.stats.error(str(exc.code))
        session.deliver(
            m.error(
                exc.request_id, str(exc.code), exc.message, details=exc.details, session=session.id
            )
        )

    async def disconnect(self, channel: Channel, clean: bool) -> None:
        """The channel closed: free its sessions now (clean) or after the resume window."""
        if clean:
            await self.manager.close_owned(channel, "the client disconnected")
        else:
            self.manager.detach_all(channel)

    def internal_error(
        self, channel: Channel, exc: BaseException, request_id: int | None = None
    ) -> None:
        """Report a bug in corral to the client without dropping the connection.

        The reply answers ``request_id`` when given, so the caller is not left waiting.
        """
        log.exception("internal error handling a request", exc_info=exc)
        error = InternalError(f"internal server error: {type(exc).__name__}", request_id=request_id)
        self.send_error(channel, error)


def _short_repr() -> reprlib.Repr:
    """A bounded repr for offending inputs: nesting or size cannot blow up an error reply."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 4, 160, 160
    return short


_SHORT = _short_repr()


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors, reduced to wire-safe values."""
    out = []
    for err in exc.errors(include_url=False):
        item = {"type": err["type"], "loc": list(err["loc"]), "msg": err["msg"]}
        if "input" in err:
            item["input"] = _SHORT.repr(err["input"])[:200]
        out.append(item)
    return out


def _accepted_options(reset: Callable[..., Any]) -> set[str] | None:
    """Reset keyword names the env accepts besides ``seed``; None if it takes ``**kwargs``."""
    params = inspect.signature(reset).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return {
        name
        for name, p in params.items()
        if name not in ("self", "seed")
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }


__all__ = ["Channel", "EnvService", "ErrorCode", "resolve_env"]
