"""``EnvPool``: N sessions over M servers, stepped in batches or asynchronously.

    async with EnvPool(64, "corral.envs.echo:EchoEnv", env=EchoEnv, servers=2) as pool:
        batch = await pool.reset(seed=0)            # session i gets seed 0 + i
        batch = await pool.step([EchoAction(message="hi")] * 64)
        batch.rewards, batch.terminated, batch.obs["message_length"]   # numpy arrays

        await pool.send(actions[:8], session_ids=range(8))   # EnvPool-style async API
        first = await pool.recv(min_results=4)      # whichever sessions finished first

**Target.** A ``"package.module:Class"`` string starts ``servers`` local server processes
(:class:`~corral.client.launcher.LocalServer`); a URL string or a list of URLs uses running
servers; any zero-argument callable returning a :class:`ServerHandle` (an object with
``start()``/``stop()``/``running``, like ``LocalServer``) lets another provider start them.

**Layout.** Sessions are numbered ``0..n-1`` (their *session ids* in this API); server ``j``
of ``M`` holds the contiguous block ``j*n//M .. (j+1)*n//M - 1``, and each server's block is
split over connections of at most ``sessions_per_connection`` sessions (capped by the
server's ``max_sessions_per_connection`` and ``max_batch``). One call to :meth:`step`,
:meth:`reset` or :meth:`send` sends one ``step_batch``/``reset_batch`` message per
connection, so the server runs each connection's sessions as one batch.

**Results.** A :class:`PoolBatch` holds, for the sessions ``ids`` it covers (in order):
``observations`` (typed models), ``rewards`` (float64; ``None`` → 0.0), ``terminated`` and
``truncated`` (bool), ``infos`` (each observation's ``metadata``), and ``obs``: the
observations stacked field by field (see :func:`stack_observations`). A session that failed
is left out and listed in ``errors``; with ``on_error="raise"`` (the default) any failure
raises :class:`PoolError`, which carries the partial batch.

**Auto-reset** follows Gymnasium's vector ``AutoresetMode`` exactly:

* ``NEXT_STEP`` (default): the step *after* an episode ended resets that session instead
  of stepping it; its action is ignored and it returns the new episode's first observation
  with reward 0, ``terminated = truncated = False`` and the reset's info.
* ``SAME_STEP``: the step that ends an episode also resets the session; it returns the
  final step's reward, ``terminated`` and ``truncated``, the new episode's first
  observation, and the reset's info plus ``final_obs``/``final_info`` (the ended
  episode's last observation and info).
* ``DISABLED``: nothing resets automatically; stepping an ended session is an
  ``EPISODE_ENDED`` error; reset chosen sessions with ``reset(mask=...)``.

**Asynchronous API.** :meth:`send` starts steps of some sessions and returns once their
messages are on the wire; :meth:`recv` returns the results of whichever sessions finished
first. The unit of completion is one ``send`` call's message on one connection: sessions
sent together on a connection come back together, so call ``send`` once per group you want
returned independently (EnvPool-style loops send back exactly the ids ``recv`` returned).
A session has at most one step in flight. **Back-pressure:** at most ``max_in_flight``
messages are outstanding per connection; further sends wait for a reply.

**Health.** Every ``health_interval`` seconds (and whenever a connection fails) the pool
checks its servers. A dead server the pool started is replaced when
``replace_dead_servers`` is true: a new one is started, its sessions are opened again and
marked for reset (their episodes are gone: the request that was in flight failed with
``CONNECTION_LOST``); with an auto-reset mode their next step resets them like an ended
episode. A connection that dropped while its server lives is re-established and its
sessions re-attached with their resume tokens, episodes intact.

The blocking twin is :meth:`EnvPool.sync` (:class:`SyncEnvPool`): same methods, same errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, Self, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("EnvPool needs numpy: pip install 'corral[numpy]'") from exc

from corral.auth import bearer_header, resolve_token
from corral.client.connection import Connection, http_url
from corral.client.loop import run_blocking
from corral.contract import Action, Environment, Observation, State, StepResult
from corral.contract.schema import fingerprint, model_schemas
from corral.errors import (
    BadObservation,
    ClientClosed,
    ConnectionLost,
    CorralError,
    InvalidAction,
    RequestTimeout,
    SessionLost,
    error_from_wire,
)
from corral.protocol import batch as b
from corral.protocol.codecs import get_codec
from corral.protocol.messages import ContractRef

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

log = logging.getLogger("corral.client")

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)
T = TypeVar("T")

_RESERVED = frozenset({"done", "truncated", "reward", "metadata"})
"""Observation fields reported as rewards/terminated/truncated/infos rather than in ``obs``."""


class AutoresetMode(enum.Enum):
    """When a session whose episode ended is reset; Gymnasium's modes, names and values.

    ``AutoresetMode(gymnasium_mode.value)`` converts Gymnasium's enum to this one.
    """

    NEXT_STEP = "NextStep"
    SAME_STEP = "SameStep"
    DISABLED = "Disabled"


class ServerHandle(Protocol):
    """A server the pool starts and stops (e.g. :class:`~corral.client.LocalServer`)."""

    async def start(self) -> str:
        """Start the server; return its URL once it is ready."""
        ...

    async def stop(self) -> None:
        """Stop the server (idempotent)."""
        ...

    @property
    def running(self) -> bool:
        """False once the server is known to be gone."""
        ...


class PoolError(CorralError):
    """Some sessions of a pool call failed.

    Attributes:
        errors: ``{session id: error}`` for every failed session.
        batch: the results of the sessions that did not fail.
    """

    def __init__(self, errors: dict[int, CorralError], batch: PoolBatch[Any]) -> None:
        first = next(iter(errors.values()))
        shown = "; ".join(f"session {i}: {e}" for i, e in list(errors.items())[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(
            f"{len(errors)} of {len(errors) + len(batch)} sessions failed: {shown}{more}",
            details={"failed": sorted(errors)},
            code=str(first.code),
        )
        self.errors = errors
        self.batch = batch


def stack_observations(observations: Sequence[BaseModel]) -> dict[str, Any]:
    """Stack observations field by field (``done``/``truncated``/``reward``/``metadata`` aside).

    Per field, across the observations: numpy arrays of one shape and dtype are stacked
    into one array of shape ``(k, *shape)``; bools become a bool array, ints an int64 array,
    ints and floats a float64 array; anything else (strings, nested models, ``None``,
    arrays of differing shapes) stays a list of the values, in order.
    """
    if not observations:
        return {}
    names = [n for n in type(observations[0]).model_fields if n not in _RESERVED]
    stacked: dict[str, Any] = {}
    for name in names:
        values = [getattr(o, name) for o in observations]
        stacked[name] = _stack(values)
    return stacked


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, np.ndarray):
        if all(
            isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        ):
            return np.stack(values)
        return values
    kinds = {type(v) for v in values}
    if kinds == {bool}:
        return np.array(values, dtype=bool)
    if kinds == {int}:
        return np.array(values, dtype=np.int64)
    if kinds <= {int, float}:
        return np.array(values, dtype=np.float64)
    return values


class PoolBatch(Generic[ObsT]):
    """Results of some sessions of a pool, in the order of ``ids`` (see module docstring).

    Everything is built on first access: observations are validated into their model
    when ``observations`` or ``obs`` is read (rewards and flags are read without it), and
    the numpy arrays when first used, so a batch costs only what its reader uses.
    """

    def __init__(
        self,
        ids: list[int],
        raw: list[dict[str, Any]],
        infos: list[dict[str, Any]],
        rewards: list[float],
        terminated: list[bool],
        truncated: list[bool],
        decode: Callable[[list[Any]], list[ObsT]],
        errors: dict[int, CorralError] | None = None,
    ) -> None:
        self._ids = ids
        self._rewards = rewards
        self._terminated = terminated
        self._truncated = truncated
        self.infos = infos
        """Each observation's ``metadata`` (plus ``final_obs``/``final_info`` in SAME_STEP)."""
        self.errors: dict[int, CorralError] = errors or {}
        """``{session id: error}`` for the sessions left out of this batch."""
        self._raw = raw
        self._decode = decode

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"PoolBatch(ids={self._ids!r}, errors={sorted(self.errors)!r})"

    @cached_property
    def ids(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Session ids of this batch's results, in order."""
        return np.array(self._ids, dtype=np.int64)

    @cached_property
    def rewards(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Each session's reward (``None`` from the environment is 0.0)."""
        return np.array(self._rewards, dtype=np.float64)

    @cached_property
    def terminated(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The episode reached a terminal state (Gymnasium's meaning)."""
        return np.array(self._terminated, dtype=bool)

    @cached_property
    def truncated(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The episode was cut short (Gymnasium's meaning)."""
        return np.array(self._truncated, dtype=bool)

    @cached_property
    def observations(self) -> list[ObsT]:
        """The typed observations.

        Raises:
            BadObservation: the server sent one that does not match the contract.
        """
        return self._decode(self._raw)

    @cached_property
    def obs(self) -> dict[str, Any]:
        """The observations stacked field by field (see :func:`stack_observations`)."""
        return stack_observations(self.observations)

    def results(self) -> list[StepResult[ObsT]]:
        """One :class:`~corral.contract.StepResult` per session of this batch, in order.

        The flags are the pool's (auto-resets included) and a missing reward is 0.0, as
        in :attr:`rewards`.
        """
        return [
            StepResult(
                observation=obs,
                reward=self._rewards[k],
                terminated=self._terminated[k],
                truncated=self._truncated[k],
                info=self.infos[k],
            )
            for k, obs in enumerate(self.observations)
        ]

    @property
    def dones(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """``terminated | truncated``."""
        dones: np.ndarray[Any, np.dtype[np.bool_]] = self.terminated | self.truncated
        return dones


@dataclass(eq=False)
class _Server:
    index: int
    handle: ServerHandle | None
    url: str
    connections: list[_Conn] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    dead: str | None = None
    recovering: asyncio.Task[None] | None = None


@dataclass(eq=False)
class _Conn:
    server: _Server
    connection: Connection
    slots: list[_Slot]
    gate: asyncio.Semaphore
    batch_limit: int


@dataclass(eq=False)
class _Slot:
    index: int
    server: _Server
    conn: _Conn | None = None
    session: str = ""
    token: str = ""
    needs_reset: bool = False
    pending: bool = False
    lost: str | None = None


@dataclass(slots=True)
class _Outcome:
    """One session's result: its raw observation, or the error it failed with.

    ``flags`` overrides the (reward, terminated, truncated) the observation carries, for
    auto-resets: the observation is the new episode's, the flags are not.
    """

    raw: dict[str, Any] | None = None
    error: CorralError | None = None
    flags: tuple[float, bool, bool] | None = None


class EnvPool(Generic[ActT, ObsT, StateT]):
    """N sessions over M servers (see module docstring).

    Args:
        n: number of sessions.
        target: ``"module:Class"`` (start local servers), a URL, a list of URLs, or a
            zero-argument callable returning a :class:`ServerHandle`.
        env: the environment class, to take the models (and contract) from it.
        action_type / observation_type / state_type: the models, given one by one (by
            default they are built from the server's published schemas).
        servers: servers to start (default 1); not allowed with URLs.
        server_args: extra ``corral serve`` options for started local servers.
        sessions_per_connection: sessions multiplexed on one connection.
        codec: ``"msgpack"`` (default) or ``"json"``.
        autoreset_mode: an :class:`AutoresetMode` (or its name or value).
        timeout: seconds to wait for each batch reply (None: no limit).
        connect_timeout: seconds to connect and complete each handshake.
        startup_timeout: seconds a started server has to become ready.
        max_in_flight: messages outstanding per connection before ``send`` waits.
        health_interval: seconds between health checks (None: only on failures).
        replace_dead_servers: replace a dead server this pool started.
        on_error: ``"raise"`` a :class:`PoolError` when sessions fail, or ``"return"``
            the failures in :attr:`PoolBatch.errors`.
        progress: show a progress bar while starting (None: when stderr is a terminal
            and the pool is large).
        console: the rich console for the progress bar.
        check_contract: send the local contract so an incompatible server is refused.
        headers: extra HTTP headers for every connection.
        token: bearer token for servers that require one (default: ``$CORRAL_TOKEN``, or
            the file named by ``$CORRAL_TOKEN_FILE``).
    """

    def __init__(
        self,
        n: int,
        target: str | Sequence[str] | Callable[[], ServerHandle],
        *,
        env: type[Environment[ActT, ObsT, StateT]] | None = None,
        action_type: type[ActT] | None = None,
        observation_type: type[ObsT] | None = None,
        state_type: type[StateT] | None = None,
        servers: int | None = None,
        server_args: Sequence[str] | None = None,
        sessions_per_connection: int = 256,
        codec: str = "msgpack",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        startup_timeout: float = 60.0,
        max_in_flight: int = 4,
        health_interval: float | None = 5.0,
        replace_dead_servers: bool = True,
        on_error: Literal["raise", "return"] = "raise",
        progress: bool | None = None,
        console: Console | None = None,
        check_contract: bool = True,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"EnvPool needs n >= 1 sessions, got {n!r}")
        if sessions_per_connection < 1 or max_in_flight < 1:
            raise ValueError("sessions_per_connection and max_in_flight must be >= 1")
        if on_error not in ("raise", "return"):
            raise ValueError(f"on_error must be 'raise' or 'return', got {on_error!r}")
        self.n = n
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        self._urls, self._factory = _targets(target, servers, server_args, startup_timeout)
        self.num_servers = len(self._urls) if self._urls is not None else servers or 1
        self.codec_name = codec
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.sessions_per_connection = sessions_per_connection
        self.max_in_flight = max_in_flight
        self.health_interval = health_interval
        self.replace_dead_servers = replace_dead_servers
        self.on_error = on_error
        self.check_contract = check_contract
        self.headers = dict(headers or {})
        self.token = resolve_token(token)
        self._progress_wanted = progress
        self._console = console
        self._contract_version = "1.0.0"
        if env is not None:
            action_type = action_type or env.action_type  # type: ignore[assignment]
            observation_type = observation_type or env.observation_type  # type: ignore[assignment]
            state_type = state_type or env.state_type  # type: ignore[assignment]
            self._contract_version = env.contract_version
        self.action_type: type[ActT] | None = action_type
        self.observation_type: type[ObsT] | None = observation_type
        self.state_type: type[StateT] | None = state_type
        self._servers: list[_Server] = []
        self._slots: list[_Slot] = []
        self._ready: deque[tuple[int, _Outcome, dict[str, Any] | None]] = deque()
        self._arrived = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._monitor: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._codec = get_codec(codec)

    # -- lifecycle ----------------------------------------------------------------

    @property
    def num_envs(self) -> int:
        """Number of sessions (Gymnasium's name for it)."""
        return self.n

    def __len__(self) -> int:
        return self.n

    @property
    def server_urls(self) -> list[str]:
        """The URL of each server, in order."""
        return [s.url for s in self._servers]

    async def start(self) -> Self:
        """Start (or reach) the servers, connect, and open every session.

        Raises:
            ServerStartError / ConnectionLost / CapacityReached / ContractMismatch: a
                server could not be started or reached, or refused the pool.
        """
        if self._closed:
            raise ClientClosed("this pool was closed")
        if self._started:
            return self
        self._started = True
        try:
            with self._progress() as bar:
                await self._start_servers(bar)
                await self._open_all(bar)
        except BaseException:
            await self._teardown()
            raise
        if self.health_interval is not None:
            self._monitor = asyncio.create_task(self._monitor_forever(), name="corral-pool-health")
        return self

    async def _start_servers(self, bar: _Bar) -> None:
        task = bar.add("starting servers", self.num_servers) if self._factory else None
        layout = _blocks(self.n, self.num_servers)

        async def one(index: int) -> _Server:
            handle = self._factory() if self._factory is not None else None
            url = await handle.start() if handle is not None else self._urls[index]  # type: ignore[index]
            bar.advance(task)
            return _Server(index, handle, http_url(url))

        started = await asyncio.gather(
            *(one(j) for j in range(self.num_servers)), return_exceptions=True
        )
        self._servers = [s for s in started if isinstance(s, _Server)]
        failure = next((s for s in started if isinstance(s, BaseException)), None)
        if failure is not None:
            raise failure
        self._slots = [_Slot(i, self._servers[j]) for j, block in enumerate(layout) for i in block]

    async def _open_all(self, bar: _Bar) -> None:
        task = bar.add("opening sessions", self.n)
        await asyncio.gather(*(self._open_server(s, bar, task) for s in self._servers))

    async def _open_server(self, server: _Server, bar: _Bar, task: TaskID | None) -> None:
        slots = [s for s in self._slots if s.server is server]
        server.connections = []
        first = await self._connect(server)
        limits = first.welcome.get("limits", {})
        per = min(
            self.sessions_per_connection,
            int(limits.get("max_sessions_per_connection", self.sessions_per_connection)),
        )
        batch_limit = int(limits.get("max_batch", per))
        groups = [slots[i : i + per] for i in range(0, len(slots), per)]
        connections = [first] + [await self._connect(server) for _ in groups[1:]]
        for connection, group in zip(connections, groups, strict=True):
            conn = _Conn(
                server, connection, group, asyncio.Semaphore(self.max_in_flight), batch_limit
            )
            server.connections.append(conn)
            for slot in group:
                slot.conn = conn

        async def open_one(slot: _Slot) -> None:
            assert slot.conn is not None
            opened = await slot.conn.connection.request({"type": "open"}, timeout=self.timeout)
            slot.session, slot.token, slot.lost = opened["session"], opened["token"], None
            bar.advance(task)

        await asyncio.gather(*(open_one(s) for s in slots))
        server.dead = None
        server.ready.set()

    async def _connect(self, server: _Server) -> Connection:
        connection = Connection(
            server.url,
            codec=self.codec_name,
            connect_timeout=self.connect_timeout,
            headers=self.headers,
            token=self.token,
        )
        need_schemas = None in (self.action_type, self.observation_type, self.state_type)
        welcome = await connection.connect(self._local_contract(), want_schemas=need_schemas)
        if need_schemas:
            self._adopt_schemas(welcome.get("schemas") or {})
        return connection

    def _local_contract(self) -> ContractRef | None:
        if not self.check_contract or None in (
            self.action_type,
            self.observation_type,
            self.state_type,
        ):
            return None
        assert self.action_type and self.observation_type and self.state_type
        schemas = model_schemas(self.action_type, self.observation_type, self.state_type)
        return ContractRef(version=self._contract_version, fingerprint=fingerprint(schemas))

    def _adopt_schemas(self, schemas: dict[str, Any]) -> None:
        from corral.contract.dynamic import contract_models

        action, observation, state = contract_models(schemas)
        self.action_type = self.action_type or action  # type: ignore[assignment]
        self.observation_type = self.observation_type or observation  # type: ignore[assignment]
        self.state_type = self.state_type or state  # type: ignore[assignment]

    def _progress(self) -> _Bar:
        wanted = self._progress_wanted
        if wanted is None:
            wanted = sys.stderr.isatty() and (self.n >= 64 or self.num_servers > 1)
        return _Bar(wanted, self._console)

    async def close(self) -> None:
        """Close every session and connection, and stop the servers this pool started."""
        if self._closed:
            return
        self._closed = True
        await self._teardown()

    async def _teardown(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for server in self._servers:
            if server.recovering is not None:
                server.recovering.cancel()
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        await asyncio.gather(*(self._close_server(s) for s in self._servers))

    async def _close_server(self, server: _Server) -> None:
        for conn in server.connections:
            with contextlib.suppress(Exception):
                await conn.connection.close()
        if server.handle is not None:
            with contextlib.suppress(Exception):
                await server.handle.stop()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def sync(self) -> SyncEnvPool[ActT, ObsT, StateT]:
        """A blocking twin of this pool: same methods, same errors."""
        return SyncEnvPool(self)

    # -- the batched API ----------------------------------------------------------

    async def reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        ids: Sequence[int] | None = None,
        mask: Sequence[bool] | np.ndarray[Any, Any] | None = None,
    ) -> PoolBatch[ObsT]:
        """Start new episodes; returns the first observations.

        Args:
            seed: an int (session ``ids[k]`` gets ``seed + k``, as Gymnasium does), one
                seed per session, or None.
            options: reset options for every session, or one mapping per session.
            ids: the sessions to reset (default: all); or ``mask``, a bool per session.
        """
        slots = self._select(ids, mask)
        busy = [s.index for s in slots if s.pending]
        if busy:
            raise ValueError(f"sessions {busy} have a step in flight; recv() their results first")
        seeds = _per_session(seed, len(slots), "seed", lambda s, k: s + k)
        opts = _per_session(options, len(slots), "options", None)
        items = [
            (slot, (seeds[k], dict(opts[k]) if opts[k] is not None else {}))
            for k, slot in enumerate(slots)
        ]
        outcomes = await self._exchange(b.RESET_BATCH, items)
        for slot in slots:
            if outcomes[slot.index].error is None:
                slot.needs_reset = False
        return self._deliver([(s.index, outcomes[s.index], None) for s in slots])

    async def step(self, actions: Sequence[ActT | Mapping[str, Any]]) -> PoolBatch[ObsT]:
        """Step every session with its action (``actions[i]`` for session ``i``).

        Raises:
            ValueError: ``actions`` does not hold one action per session, or ``send``
                results are still waiting for ``recv``.
            InvalidAction: an action fails local validation (nothing is sent).
            PoolError: some sessions failed (with ``on_error="raise"``).
        """
        self._require_started()
        if len(actions) != self.n:
            raise ValueError(f"step() needs {self.n} actions (one per session), got {len(actions)}")
        if any(s.pending for s in self._slots):
            raise ValueError("step() while send() results are pending: recv() them first")
        results = await self._step_slots(self._slots, self._encode_all(actions))
        return self._deliver(results)

    async def state(self, ids: Sequence[int] | None = None) -> list[StateT]:
        """The current state of each session in ``ids`` (default: all), typed."""
        slots = self._select(ids, None)
        state_type = self.state_type
        assert state_type is not None

        async def one(slot: _Slot) -> StateT:
            await self._wait_ready(slot.server)
            error = self._unusable(slot)
            if error is not None:
                raise error
            assert slot.conn is not None
            reply = await slot.conn.connection.request(
                {"type": "state", "session": slot.session}, timeout=self.timeout
            )
            state: StateT = self._load(state_type, reply["state"])
            return state

        return list(await asyncio.gather(*(one(s) for s in slots)))

    # -- the asynchronous API -----------------------------------------------------

    async def send(
        self,
        actions: Sequence[ActT | Mapping[str, Any]],
        session_ids: Sequence[int] | np.ndarray[Any, Any] | None = None,
    ) -> None:
        """Start stepping ``session_ids`` (default: all) with ``actions``; do not wait.

        Returns once the messages are sent (waiting while a connection already has
        ``max_in_flight`` messages outstanding). Collect results with :meth:`recv`.

        Raises:
            ValueError: lengths differ, an id is unknown, repeated or still pending.
            InvalidAction: an action fails local validation (nothing is sent).
        """
        slots = self._select(session_ids, None)
        if len(actions) != len(slots):
            raise ValueError(f"send() got {len(actions)} actions for {len(slots)} sessions")
        busy = [s.index for s in slots if s.pending]
        if busy:
            raise ValueError(
                f"sessions {busy} still have a step in flight; recv() their results first"
            )
        payloads = self._encode_all(actions)
        groups: dict[tuple[int, int], list[tuple[_Slot, Any]]] = {}
        for slot, payload in zip(slots, payloads, strict=True):
            groups.setdefault((slot.server.index, id(slot.conn)), []).append((slot, payload))
        for group in groups.values():
            conn = group[0][0].conn
            gate = conn.gate if conn is not None else None
            if gate is not None:
                await gate.acquire()  # back-pressure happens here, in the caller
            for slot, _ in group:
                slot.pending = True
            task = asyncio.create_task(self._complete(group, gate))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _complete(
        self, group: list[tuple[_Slot, Any]], gate: asyncio.Semaphore | None
    ) -> None:
        try:
            results = await self._step_slots([s for s, _ in group], [p for _, p in group])
        except Exception as exc:  # never lose a session: fail it instead
            error = exc if isinstance(exc, CorralError) else ConnectionLost(f"{exc!r}")
            results = [(s.index, _Outcome(error=error), None) for s, _ in group]
        finally:
            if gate is not None:
                gate.release()
        self._ready.extend(results)
        self._arrived.set()

    async def recv(
        self,
        min_results: int | None = None,
        timeout: float | None = None,
        *,
        max_results: int | None = None,
    ) -> PoolBatch[ObsT]:
        """Results of sessions sent with :meth:`send`, whichever finished first.

        Waits until at least ``min_results`` results are ready (default: every session
        in flight), then returns all ready results (at most ``max_results``), in the order
        they arrived. After ``timeout`` seconds it returns what is ready, maybe nothing.

        Raises:
            ValueError: ``min_results`` exceeds the sessions in flight.
            PoolError: some returned sessions failed (with ``on_error="raise"``).
        """
        self._require_started()
        pending = sum(s.pending for s in self._slots)
        want = pending if min_results is None else min_results
        if want > pending:
            raise ValueError(f"recv(min_results={want}) but only {pending} sessions are in flight")
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._ready) < want:
            self._arrived.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        count = len(self._ready) if max_results is None else min(max_results, len(self._ready))
        taken = [self._ready.popleft() for _ in range(count)]
        for index, _, _ in taken:
            self._slots[index].pending = False
        return self._deliver(taken)

    # -- the engine ---------------------------------------------------------------

    async def _step_slots(
        self, slots: list[_Slot], payloads: list[Any]
    ) -> list[tuple[int, _Outcome, dict[str, Any] | None]]:
        """Step ``slots`` (auto-resetting per the mode); one result per slot, in order."""
        mode = self.autoreset_mode
        resets = [s for s in slots if s.needs_reset and mode is not AutoresetMode.DISABLED]
        reset_ids = {s.index for s in resets}
        steps = [(s, p) for s, p in zip(slots, payloads, strict=True) if s.index not in reset_ids]
        exchanges = []
        if steps:
            exchanges.append(self._exchange(b.STEP_BATCH, steps))
        if resets:
            exchanges.append(self._exchange(b.RESET_BATCH, [(s, (None, {})) for s in resets]))
        outcomes: dict[int, _Outcome] = {}
        for part in await _all(exchanges):
            outcomes.update(part)
        finals: dict[int, _Outcome] = {}
        for slot in slots:
            outcome = outcomes[slot.index]
            if outcome.error is not None:
                if isinstance(outcome.error, (SessionLost, ConnectionLost)):
                    slot.needs_reset = True  # the episode is gone or in an unknown state
            elif slot.index in reset_ids:
                slot.needs_reset = False
                outcome.flags = (0.0, False, False)
            elif _done(outcome.raw):
                if mode is AutoresetMode.SAME_STEP:
                    finals[slot.index] = outcome
                elif mode is AutoresetMode.NEXT_STEP:
                    slot.needs_reset = True
        extra: dict[int, dict[str, Any]] = {}
        if finals:
            fresh = await self._exchange(
                b.RESET_BATCH, [(self._slots[i], (None, {})) for i in finals]
            )
            for index, final in finals.items():
                reset = fresh[index]
                if reset.error is not None:
                    self._slots[index].needs_reset = True  # retried on its next step
                    outcomes[index] = reset
                    continue
                assert final.raw is not None
                reset.flags = _flags(final.raw)
                outcomes[index] = reset
                extra[index] = {
                    "final_obs": self._decode(final.raw),
                    "final_info": _metadata(final.raw),
                }
        return [(s.index, outcomes[s.index], extra.get(s.index)) for s in slots]

    async def _exchange(self, kind: str, items: list[tuple[_Slot, Any]]) -> dict[int, _Outcome]:
        """Send ``items`` as batch messages (one per connection and chunk); gather outcomes.

        Waits out the recovery of a server first; a session that cannot be reached is
        an error for that session only.
        """
        recovering = {s.server.index: s.server for s, _ in items if not s.server.ready.is_set()}
        if recovering:
            await asyncio.gather(*(self._wait_ready(server) for server in recovering.values()))
        results: dict[int, _Outcome] = {}
        groups: dict[int, tuple[_Conn, list[tuple[_Slot, Any]]]] = {}
        for slot, payload in items:
            error = self._unusable(slot)
            if error is not None:
                results[slot.index] = _Outcome(error=error)
                continue
            assert slot.conn is not None
            groups.setdefault(id(slot.conn), (slot.conn, []))[1].append((slot, payload))
        requests = [
            self._request(conn, kind, group[i : i + conn.batch_limit])
            for conn, group in groups.values()
            for i in range(0, len(group), conn.batch_limit)
        ]
        for part in await _all(requests):
            results.update(part)
        return results

    async def _request(
        self, conn: _Conn, kind: str, chunk: list[tuple[_Slot, Any]]
    ) -> dict[int, _Outcome]:
        if kind == b.STEP_BATCH:
            message = b.step_batch([(s.session, p) for s, p in chunk])
        else:
            message = b.reset_batch([(s.session, seed, opts) for s, (seed, opts) in chunk])
        try:
            reply = await conn.connection.request(message, timeout=self.timeout)
            results = b.read_batch_reply(reply, len(chunk))
        except CorralError as exc:
            if isinstance(exc, ConnectionLost):
                self._suspect(conn.server)
            elif isinstance(exc, ClientClosed) and not self._closed:
                # The pool closed this connection itself, replacing a dead server: the
                # request's episode is lost, and the caller must hear it as such.
                exc = SessionLost(
                    "the server died and is being replaced; this episode was lost",
                    details={"reason": "server died", "server": conn.server.url},
                )
            return {s.index: _Outcome(error=exc) for s, _ in chunk}
        outcomes: dict[int, _Outcome] = {}
        for (slot, _), item in zip(chunk, results, strict=True):
            error = item.get("error")
            observation = item.get("observation")
            if error is not None:
                wire = error if isinstance(error, dict) else {}
                outcomes[slot.index] = _Outcome(error=error_from_wire(wire, reply["id"]))
            elif isinstance(observation, dict):
                outcomes[slot.index] = _Outcome(observation)
            else:
                outcomes[slot.index] = _Outcome(
                    error=BadObservation("the server sent a batch item without an observation")
                )
        return outcomes

    async def _wait_ready(self, server: _Server) -> None:
        """Wait (bounded) while ``server`` is being recovered; never raises."""
        recovering = server.recovering
        if server.ready.is_set() or recovering is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(recovering), self._recovery_wait())

    def _unusable(self, slot: _Slot) -> SessionLost | None:
        """Why ``slot`` cannot be sent to now, or None."""
        server = slot.server
        if not server.ready.is_set():
            return SessionLost(
                f"session {slot.index}'s server {server.url} is gone: {server.dead}",
                details={"session": slot.index, "reason": server.dead},
            )
        if slot.lost is not None or slot.conn is None:
            return SessionLost(
                f"session {slot.index} is gone: {slot.lost}",
                details={"session": slot.index, "reason": slot.lost},
            )
        return None

    def _recovery_wait(self) -> float:
        return 120.0 if self.timeout is None else self.timeout + 60.0

    # -- health and recovery ------------------------------------------------------

    async def _monitor_forever(self) -> None:
        assert self.health_interval is not None
        async with httpx.AsyncClient(
            timeout=2.0, trust_env=False, headers=self._http_headers()
        ) as http:
            while True:
                await asyncio.sleep(self.health_interval)
                for server in self._servers:
                    if server.recovering is None and not await self._healthy(server, http):
                        self._suspect(server)

    async def _healthy(self, server: _Server, http: httpx.AsyncClient) -> bool:
        if server.handle is not None and not server.handle.running:
            return False
        if any(_failed(c.connection) for c in server.connections):
            return False  # gave up reconnecting (a reconnect in progress is left to finish)
        try:
            return (await http.get(f"{server.url}/health")).status_code == 200
        except httpx.HTTPError:
            return False

    def _suspect(self, server: _Server) -> None:
        """Something failed on ``server``: recover it in the background (once at a time)."""
        if self._closed or server.recovering is not None:
            return
        server.ready.clear()
        server.recovering = asyncio.create_task(self._recover(server))

    async def _recover(self, server: _Server) -> None:
        try:
            alive = await self._alive(server)
            if alive:
                await self._reattach(server)
            elif server.handle is not None and self.replace_dead_servers:
                await self._replace(server)
            else:
                server.dead = "the server does not answer its health check"
                for slot in self._slots_of(server):
                    slot.lost = server.dead
                    slot.needs_reset = True
        except Exception as exc:
            server.dead = f"recovery failed: {exc}"
            log.warning("could not recover server %s: %s", server.url, exc)
        finally:
            server.recovering = None

    async def _alive(self, server: _Server) -> bool:
        if server.handle is not None and not server.handle.running:
            return False
        async with httpx.AsyncClient(
            timeout=2.0, trust_env=False, headers=self._http_headers()
        ) as http:
            try:
                return (await http.get(f"{server.url}/health")).status_code == 200
            except httpx.HTTPError:
                return False

    def _http_headers(self) -> dict[str, str]:
        """Headers of the health checks: the pool's, plus the bearer token if any."""
        return {**self.headers, **(bearer_header(self.token) if self.token else {})}

    def _slots_of(self, server: _Server) -> list[_Slot]:
        return [s for s in self._slots if s.server is server]

    async def _reattach(self, server: _Server) -> None:
        """Reconnect dropped connections of a live server and re-attach their sessions."""
        for conn in server.connections:
            if not _failed(conn.connection):
                continue
            old = conn.connection
            with contextlib.suppress(Exception):
                await old.close()
            conn.connection = await self._connect(server)
            # Request ids go on from the old connection's: the server remembers replies
            # of re-attached sessions by id, and a reused id would fetch an old reply.
            conn.connection.tracker = old.tracker
            for slot in conn.slots:
                try:
                    attached = await conn.connection.request(
                        {"type": "attach", "session": slot.session, "token": slot.token},
                        timeout=self.timeout,
                    )
                    slot.token = attached["token"]
                except CorralError:
                    opened = await conn.connection.request({"type": "open"}, timeout=self.timeout)
                    slot.session, slot.token = opened["session"], opened["token"]
                    slot.needs_reset = True
                slot.lost = None
        server.dead = None
        server.ready.set()

    async def _replace(self, server: _Server) -> None:
        """Start a new server in place of a dead one and open its sessions again."""
        log.warning("server %s died; starting a replacement", server.url)
        await self._close_server(server)
        assert self._factory is not None
        server.handle = self._factory()
        server.url = http_url(await server.handle.start())
        await self._open_server(server, _Bar(False, None), None)
        for slot in self._slots_of(server):
            slot.needs_reset = True

    # -- encoding and decoding ----------------------------------------------------

    def _require_started(self) -> None:
        if self._closed:
            raise ClientClosed("this pool was closed")
        if not self._started or not self._servers:
            raise RuntimeError(
                "start the pool first: `async with EnvPool(...)` or `await pool.start()`"
            )

    def _select(
        self,
        ids: Sequence[int] | np.ndarray[Any, Any] | None,
        mask: Sequence[bool] | np.ndarray[Any, Any] | None,
    ) -> list[_Slot]:
        self._require_started()
        if ids is not None and mask is not None:
            raise ValueError("pass ids or mask, not both")
        if mask is not None:
            flags = np.asarray(mask, dtype=bool)
            if flags.shape != (self.n,):
                raise ValueError(f"mask must hold {self.n} booleans, got shape {flags.shape}")
            return [self._slots[i] for i in np.flatnonzero(flags)]
        if ids is None:
            return list(self._slots)
        chosen = [int(i) for i in ids]
        bad = [i for i in chosen if not 0 <= i < self.n]
        if bad:
            raise ValueError(f"session ids {bad} are out of range 0..{self.n - 1}")
        if len(set(chosen)) != len(chosen):
            raise ValueError("session ids must not repeat")
        return [self._slots[i] for i in chosen]

    def _encode_all(self, actions: Sequence[ActT | Mapping[str, Any]]) -> list[Any]:
        assert self.action_type is not None
        action_type = self.action_type
        dump = self._codec.dump
        encoded = []
        for k, action in enumerate(actions):
            if not isinstance(action, action_type):
                raw = action.model_dump() if isinstance(action, BaseModel) else dict(action)
                try:
                    action = action_type.model_validate(raw)
                except ValidationError as exc:
                    raise InvalidAction(
                        f"action {k}: invalid {action_type.__name__}: {exc.error_count()} error(s)",
                        details={
                            "index": k,
                            "errors": exc.errors(include_url=False, include_context=False),
                        },
                    ) from None
            encoded.append(dump(action))
        return encoded

    def _load(self, model: type[Any], obj: Any) -> Any:
        try:
            return self._codec.load(model, obj)
        except ValidationError as exc:
            raise BadObservation(
                f"the server sent a {model.__name__} that does not match the contract: {exc}"
            ) from None

    def _decode(self, raw: Any) -> ObsT:
        assert self.observation_type is not None
        obs: ObsT = self._load(self.observation_type, raw)
        return obs

    def _decode_all(self, raws: list[Any]) -> list[ObsT]:
        """Validate many observations: in one call on the binary codec, else one by one."""
        if raws and self._codec.binary and self.observation_type is not None:
            with contextlib.suppress(ValidationError):  # a bad one is named below
                observations: list[ObsT] = _list_adapter(self.observation_type).validate_python(
                    raws
                )
                return observations
        return [self._decode(raw) for raw in raws]

    def _deliver(
        self, results: list[tuple[int, _Outcome, dict[str, Any] | None]]
    ) -> PoolBatch[ObsT]:
        ids: list[int] = []
        raws: list[dict[str, Any]] = []
        infos: list[dict[str, Any]] = []
        rewards: list[float] = []
        terminated: list[bool] = []
        truncated: list[bool] = []
        errors: dict[int, CorralError] = {}
        for index, outcome, extra in results:
            raw = outcome.raw
            if outcome.error is not None or raw is None:
                errors[index] = outcome.error or BadObservation("no observation")
                continue
            ids.append(index)
            raws.append(raw)
            info = _metadata(raw)
            infos.append({**info, **extra} if extra else info)
            reward, term, trunc = outcome.flags or _flags(raw)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
        batch = PoolBatch(
            ids, raws, infos, rewards, terminated, truncated, self._decode_all, errors
        )
        if errors and self.on_error == "raise":
            raise PoolError(errors, batch)
        return batch


@functools.cache
def _list_adapter(model: type[BaseModel]) -> TypeAdapter[list[Any]]:
    """Validates a list of ``model`` in one call (several times faster than one by one)."""
    return TypeAdapter(list[model])  # type: ignore[valid-type]


async def _all(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """``asyncio.gather``, without a task per awaitable when there is just one."""
    if len(awaitables) == 1:
        return [await awaitables[0]]
    return list(await asyncio.gather(*awaitables))


def _failed(connection: Connection) -> bool:
    """True for a connection that is down and no longer reconnecting by itself."""
    return not connection.connected and not connection.reconnecting


def _flags(raw: dict[str, Any]) -> tuple[float, bool, bool]:
    """(reward, terminated, truncated) of a raw observation; a missing reward is 0.0."""
    reward = raw.get("reward")
    truncated = raw.get("truncated") is True
    return (
        float(reward) if isinstance(reward, (int, float)) else 0.0,
        raw.get("done") is True and not truncated,
        truncated,
    )


def _done(raw: dict[str, Any] | None) -> bool:
    return raw is not None and raw.get("done") is True


def _metadata(raw: dict[str, Any]) -> dict[str, Any]:
    meta = raw.get("metadata")
    return dict(meta) if isinstance(meta, dict) else {}


def _autoreset_mode(mode: AutoresetMode | str | Any) -> AutoresetMode:
    if isinstance(mode, AutoresetMode):
        return mode
    text = getattr(mode, "value", mode)  # Gymnasium's own AutoresetMode converts by value
    for member in AutoresetMode:
        if text in (member.value, member.name, member.name.lower()):
            return member
    raise ValueError(
        f"unknown autoreset_mode {mode!r}; use AutoresetMode.NEXT_STEP, SAME_STEP or DISABLED"
    )


def _blocks(n: int, servers: int) -> list[range]:
    """Contiguous session ranges, one per server."""
    return [range(j * n // servers, (j + 1) * n // servers) for j in range(servers)]


def _targets(
    target: str | Sequence[str] | Callable[[], ServerHandle],
    servers: int | None,
    server_args: Sequence[str] | None,
    startup_timeout: float,
) -> tuple[list[str] | None, Callable[[], ServerHandle] | None]:
    if servers is not None and servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if isinstance(target, str) and "://" not in target:
        if ":" not in target:
            raise ValueError(
                f"target {target!r} is neither a URL nor an environment reference "
                "'package.module:Class'"
            )
        from corral.client.launcher import LocalServer

        args = list(server_args or [])
        return None, lambda: LocalServer(target, server_args=args, startup_timeout=startup_timeout)
    if servers is not None:
        raise ValueError("servers= is for targets the pool starts; a URL list says how many")
    if isinstance(target, str):
        return [target], None
    if callable(target):
        return None, target
    urls = list(target)
    if not urls or not all(isinstance(u, str) for u in urls):
        raise ValueError("target must be a non-empty list of server URLs")
    return urls, None


def _per_session(
    value: Any, count: int, name: str, spread: Callable[[int, int], Any] | None
) -> list[Any]:
    """One value per session: ``value`` repeated, spread (an int seed), or a sequence."""
    if value is None or isinstance(value, Mapping):
        return [value] * count
    if isinstance(value, (bool, str, bytes)):
        raise ValueError(f"{name} must be {'an int, ' if spread else ''}a sequence or None")
    if isinstance(value, int):
        if spread is None:
            raise ValueError(f"{name} must be a mapping, a sequence of mappings or None")
        return [spread(value, k) for k in range(count)]
    values = list(value)
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} entries for {count} sessions")
    return values


class _Bar:
    """A rich progress bar on stderr, or nothing."""

    def __init__(self, enabled: bool, console: Console | None) -> None:
        self._progress: Progress | None = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._progress = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console or Console(stderr=True),
                transient=True,
            )

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def add(self, description: str, total: int) -> TaskID | None:
        if self._progress is None:
            return None
        return self._progress.add_task(description, total=total)

    def advance(self, task: TaskID | None) -> None:
        if self._progress is not None and task is not None:
            self._progress.advance(task)


_MARGIN = 5.0


class SyncEnvPool(Generic[ActT, ObsT, StateT]):
    """The blocking twin of :class:`EnvPool`: same methods, same errors."""

    def __init__(self, pool: EnvPool[ActT, ObsT, StateT]) -> None:
        self._pool = pool

    @property
    def async_pool(self) -> EnvPool[ActT, ObsT, StateT]:
        """The async pool this twin drives."""
        return self._pool

    @property
    def num_envs(self) -> int:
        """Number of sessions."""
        return self._pool.n

    def __len__(self) -> int:
        return self._pool.n

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """The pool's auto-reset mode."""
        return self._pool.autoreset_mode

    def _wait(self, extra: float | None = None) -> float | None:
        timeout = self._pool.timeout
        if timeout is None:
            return None
        return timeout * 3 + _MARGIN + (extra or 0.0)

    def _run(self, coro: Any, wait: float | None) -> Any:
        try:
            return run_blocking(coro, wait)
        except TimeoutError as exc:
            if isinstance(exc, RequestTimeout):
                raise
            raise RequestTimeout(str(exc)) from None

    def start(self) -> Self:
        """Start servers and open sessions; see :meth:`EnvPool.start`."""
        self._run(self._pool.start(), None)
        return self

    def reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        ids: Sequence[int] | None = None,
        mask: Sequence[bool] | np.ndarray[Any, Any] | None = None,
    ) -> PoolBatch[ObsT]:
        """Start new episodes; see :meth:`EnvPool.reset`."""
        batch: PoolBatch[ObsT] = self._run(
            self._pool.reset(seed, options, ids=ids, mask=mask), self._wait()
        )
        return batch

    def step(self, actions: Sequence[ActT | Mapping[str, Any]]) -> PoolBatch[ObsT]:
        """Step every session; see :meth:`EnvPool.step`."""
        batch: PoolBatch[ObsT] = self._run(self._pool.step(actions), self._wait())
        return batch

    def state(self, ids: Sequence[int] | None = None) -> list[StateT]:
        """States of sessions; see :meth:`EnvPool.state`."""
        states: list[StateT] = self._run(self._pool.state(ids), self._wait())
        return states

    def send(
        self,
        actions: Sequence[ActT | Mapping[str, Any]],
        session_ids: Sequence[int] | np.ndarray[Any, Any] | None = None,
    ) -> None:
        """Start steps without waiting; see :meth:`EnvPool.send`."""
        self._run(self._pool.send(actions, session_ids), self._wait())

    def recv(
        self,
        min_results: int | None = None,
        timeout: float | None = None,
        *,
        max_results: int | None = None,
    ) -> PoolBatch[ObsT]:
        """Results of whichever sessions finished first; see :meth:`EnvPool.recv`."""
        wait = None if timeout is None else timeout + _MARGIN
        batch: PoolBatch[ObsT] = self._run(
            self._pool.recv(min_results, timeout, max_results=max_results),
            wait if timeout is not None else self._wait(),
        )
        return batch

    def close(self) -> None:
        """Close sessions and connections, stop started servers."""
        run_blocking(self._pool.close(), 60.0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = [
    "AutoresetMode",
    "EnvPool",
    "PoolBatch",
    "PoolError",
    "ServerHandle",
    "SyncEnvPool",
    "stack_observations",
]
