"""``EnvPool``: N sessions over M servers, stepped in batches or asynchronously.

    async with EnvPool(64, "corral.envs.echo:EchoEnv", env=EchoEnv, servers=2) as pool:
        batch = await pool.reset(seed=0)            # session i gets seed 0 + i
        batch = await pool.step([EchoAction(message="hi")] * 64)
        batch.rewards, batch.terminated, batch.obs["message_length"]   # numpy arrays

        await pool.send(actions[:8], session_ids=range(8))   # EnvPool-style async API
        first = await pool.recv(min_results=4)      # whichever sessions finished first

**Target.** A ``"package.module:Class"`` string starts ``servers`` local server processes
(:class:`~corral.client.local_server.LocalServer`); a URL string or a list of URLs uses
running servers; any zero-argument callable returning a
:class:`~corral.client.fleet.ServerHandle` (an object with ``start()``/``stop()``/``alive()``,
like ``LocalServer``) lets another provider start them; so does ``provider=`` (a
:class:`~corral.providers.Provider`, with ``target`` its spec). The servers, connections and
sessions, their health checks and recovery are the pool's :class:`~corral.client.fleet.Fleet`.

**Batches.** Sessions are numbered ``0..n-1`` (their *session ids* in this API) and spread
over the servers and connections as the fleet lays them out. One call to :meth:`step`,
:meth:`reset` or :meth:`send` sends one ``step_batch``/``reset_batch`` message per
connection (split to the server's ``max_batch``), so the server runs each connection's
sessions as one batch. Results come back as a :class:`~corral.client.batch.PoolBatch`.

**Auto-reset** follows Gymnasium's vector ``AutoresetMode`` exactly:

* ``NEXT_STEP`` (default): the step *after* an episode ended resets that session instead
  of stepping it; its action is ignored and it returns the new episode's first observation
  with reward 0, ``terminated = truncated = False`` and the reset's info.
* ``SAME_STEP``: the step that ends an episode also resets the session; it returns the
  final step's reward, ``terminated`` and ``truncated``, the new episode's first
  observation, and the reset's info plus ``final_obs``/``final_info`` (the ended
  episode's last observation and info). The server runs those resets in the step's own
  message (a ``step_batch`` with ``autoreset``: one round trip per step); a server that
  does not know the flag gets a ``reset_batch`` for them right after. A reset that fails
  is that session's error in the batch, and the session is reset at its next step.
* ``DISABLED``: nothing resets automatically; stepping an ended session is an
  ``EPISODE_ENDED`` error; reset chosen sessions with ``reset(mask=...)``.

**Asynchronous API.** :meth:`send` starts steps of some sessions and returns once their
messages are on the wire; :meth:`recv` returns the results of whichever sessions finished
first. The unit of completion is one ``send`` call's message on one connection: sessions
sent together on a connection come back together, so call ``send`` once per group you want
returned independently (EnvPool-style loops send back exactly the ids ``recv`` returned).
A session has at most one step in flight. **Back-pressure:** at most ``max_in_flight``
messages are outstanding per connection; further sends wait for a reply.

**Pipelining.** ``send``/``recv`` let a trainer overlap the environment's work with its
own: split the sessions into groups (halves, say), keep one group stepping on the servers
while the policy runs on the other's observations, and send back exactly the ids ``recv``
returned. A group sent in one call comes back whole, so with equal groups each
``recv(min_results=g, max_results=g)`` returns one group::

    halves = np.array_split(np.arange(pool.n), 2)
    first = await pool.reset()
    for ids in halves:
        await pool.send(policy(first.obs, ids), session_ids=ids)
    while training:
        batch = await pool.recv(min_results=len(halves[0]), max_results=len(halves[0]))
        await pool.send(policy(batch.obs, batch.ids), session_ids=batch.ids)
        learn(batch)                      # runs while the other half is stepping

Results come from the reply columns (see :mod:`corral.client.batch`): a trainer that
reads ``batch.obs`` and the reward/flag arrays never builds a model per session.

**Garbage collection.** The pool leaves the trainer's collector alone unless asked:
``gc.disable()`` and ``gc.freeze()`` act on the whole process (every thread of the
trainer, every other task on its loop), and a batch is in flight most of the time in a
pipelined loop, so a library must not switch them on its own. With ``gc_control=True``
the collector is paused while a batch is encoded, in flight and decoded (no full pass
lands in the middle of a step of 1,024 sessions; it comes back, if it was on, when the
last batch leaves), and what ``start()`` and a full ``reset()`` leave alive (connections,
sessions, schemas, and whatever else the process holds then) is frozen out of later
passes (``gc.freeze``): for a process that mostly runs the pool, it cuts a large batch's
CPU (see docs/performance.md). The pool keeps no reference to a batch it returned, so
memory is bounded by the batches the caller holds.

**Failures.** A session whose server died is replaced with its server when
``replace_dead_servers`` is true (see the fleet): the request in flight fails with
``SESSION_LOST`` or ``CONNECTION_LOST`` and the session is marked for reset; with an
auto-reset mode its next step resets it like an ended episode. A dropped connection to a
live server resumes with the episodes intact.

**Sessions outlive their server** (``recover=True``, the default; issue 29). Every
session keeps an :class:`~corral.protocol.recovery.EpisodeLog` of its episode (its
seed, options and task, each action and a digest of each observation). A session whose
server drains (``going_away``), cannot be reached, leaves the membership, or that is
found lost or unknown after a reconnect is re-homed before its next request (see
:mod:`corral.client.rehoming`): by snapshot where its server still answers and the env
declares one, else by a verified replay of its log, else its episode ends visibly — the
step returns ``truncated=True`` with ``info["corral"] = {"truncated": reason}`` and the
session is fresh for the next step. A request that failed because its session was gone
is sent again to the restored session (the log holds only answered steps, so nothing is
applied twice). ``reset()`` always recovers every session. Auto-resets draw their seed
from the pool's generator so their episodes stay replayable: a reset the pool sends, and
a server's same-step reset too (``SAME_STEP``: each step carries the seed drawn in
advance for the session's next episode, as ``reset_seed``). :meth:`EnvPool.stats`
counts what was re-opened, restored by snapshot or replay, and truncated, and how long
each took; :meth:`EnvPool.fork` branches a session.

The blocking twin is :meth:`EnvPool.sync` (:class:`SyncEnvPool`): same methods, same errors.

**Recording.** With ``record="dir/"`` every exchange's results are recorded where the
engine has them (auto-resets as resets), from the reply's columns; see
:mod:`corral.client.recording`.

This module is one thing over ~1,100 lines: the pool's API, the auto-reset engine under it
and its recording hooks share every piece of per-session state (what is pending, what
needs a reset, what was sent); the servers, the batch type, the recording file and the
typed face live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("EnvPool needs numpy: pip install 'corral[numpy]'") from exc

from corral import runtime
from corral.blocking import BlockingTwin
from corral.client.batch import (
    PoolBatch,
    PoolError,
    ResultTable,
    scalar_dtypes,
    stack_observations,
)
from corral.client.dialers import Dialer
from corral.client.fleet import (
    Fleet,
    Link,
    ServerHandle,
    ServerProvider,
    ServerSource,
    Slot,
    server_source,
)
from corral.client.membership import Membership
from corral.client.recording import Recording, RecordTarget, as_task
from corral.client.rehoming import MOVABLE, Rehoming, cause_of, row_digests
from corral.client.typed import ActT, ObsT, StateT, TypedFace, TypedModels
from corral.contract import Environment
from corral.contract.tasks import TaskRef, with_task
from corral.episodes import EpisodeRecorder, Lineage
from corral.errors import (
    BadObservation,
    ClientClosed,
    ConnectionLost,
    CorralError,
    SessionLost,
)
from corral.protocol.batch import (
    ABSENT,
    BatchItemReply,
    BatchReply,
    ItemError,
    ItemResult,
    ResetBatch,
    ResetItem,
    StepBatch,
    StepItem,
)
from corral.protocol.codecs import get_codec
from corral.protocol.messages import GetState, StateReply
from corral.protocol.recovery import Cause

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import Console

T = TypeVar("T")


class AutoresetMode(enum.Enum):
    """When a session whose episode ended is reset; Gymnasium's modes, names and values.

    ``AutoresetMode(gymnasium_mode.value)`` converts Gymnasium's enum to this one.
    """

    NEXT_STEP = "NextStep"
    SAME_STEP = "SameStep"
    DISABLED = "Disabled"


class EnvPool(TypedFace[ActT, ObsT, StateT]):
    """N sessions over M servers (see module docstring).

    Args:
        n: number of sessions.
        target: ``"module:Class"`` (start local servers), a URL, a list of URLs, or a
            zero-argument callable returning a :class:`~corral.client.fleet.ServerHandle`.
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
        server_dead_after: seconds a server may stay unreachable before it counts as
            dead (None: twice its resume window). A server that stalls and answers
            again sooner keeps its sessions, re-attached; one that exits is dead at once.
        on_error: ``"raise"`` a :class:`PoolError` when sessions fail, or ``"return"``
            the failures in :attr:`PoolBatch.errors`.
        progress: show a progress bar while starting (None: when stderr is a terminal
            and the pool is large).
        console: the rich console for the progress bar.
        check_contract: send the local contract so an incompatible server is refused.
        headers: extra HTTP headers for every connection.
        token: bearer token for servers that require one (default: ``$CORRAL_TOKEN``, or
            the file named by ``$CORRAL_TOKEN_FILE``).
        transport: the client transport, ``"auto"`` (``picows`` when installed, else
            ``asyncio``; ``asyncio`` for a blocking twin), ``"picows"``, ``"asyncio"`` or
            ``"websockets"``.
        dialer: what opens the connections and reaches the servers over HTTP (default:
            the ``transport``'s); :mod:`corral.testing`'s in-process servers give theirs.
        gc_control: opt in to keeping Python's garbage collector out of each batch and
            freezing what start-up and full resets leave alive (process-wide; see
            "Garbage collection" above). False (the default, and whatever it says under
            ``CORRAL_GC=default``) leaves the collector alone.
        provider: start the ``servers`` through this provider (a
            :class:`~corral.providers.Provider`: local process, Docker, Kubernetes, Ray);
            ``target`` is then its spec. The pool stops the servers it started (and
            replaces a dead one) but leaves the provider open.
        record: a directory to record every session's resets and steps into, as one
            episode file (:mod:`corral.client.recording`), closed with the pool.
        recover: re-home sessions whose server drains, fails or leaves (module
            docstring); False: such a session's requests fail with ``SessionLost``.
        membership: where the fleet's URLs come from over time
            (:mod:`corral.client.membership`); ``target`` may be one instead of URLs.
        seed: seeds the auto-resets' seeds, so a pool given the same seed plays the same
            episodes (None: from the OS; a reset with seeds reseeds them from this and
            its own). Auto-resets are seeded when this is given or ``recover`` is on;
            else they leave the environment's generator going on (a local Gymnasium or
            SB3 vector env's episodes, exactly).
    """

    def __init__(
        self,
        n: int,
        target: str | Sequence[str] | Callable[[], ServerHandle] | Any,
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
        server_dead_after: float | None = None,
        on_error: Literal["raise", "return"] = "raise",
        progress: bool | None = None,
        console: Console | None = None,
        check_contract: bool = True,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        transport: str = "auto",
        dialer: Dialer | None = None,
        gc_control: bool = False,
        provider: ServerProvider | None = None,
        record: RecordTarget | None = None,
        recover: bool = True,
        membership: Membership | None = None,
        seed: int | None = None,
    ) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"EnvPool needs n >= 1 sessions, got {n!r}")
        if sessions_per_connection < 1 or max_in_flight < 1:
            raise ValueError("sessions_per_connection and max_in_flight must be >= 1")
        if on_error not in ("raise", "return"):
            raise ValueError(f"on_error must be 'raise' or 'return', got {on_error!r}")
        self.n = n
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        self.codec_name = codec
        self.timeout = timeout
        self.on_error = on_error
        self.typed: TypedModels[ActT, ObsT, StateT] = TypedModels(
            env, action_type, observation_type, state_type, check_contract=check_contract
        )
        if isinstance(target, Membership) and not isinstance(target, (str, list, tuple)):
            membership, target = target, None
        source: ServerSource
        if target is None:  # the membership's first answer, at start()
            source, num_servers = [], 0
        else:
            source, num_servers = server_source(
                target, servers, server_args, startup_timeout, provider
            )
        if token is None and provider is not None:
            token = getattr(provider, "token", None)  # its servers require the provider's
        self.fleet = Fleet(
            n,
            source,
            num_servers,
            self.typed,
            codec=codec,
            timeout=timeout,
            connect_timeout=connect_timeout,
            sessions_per_connection=sessions_per_connection,
            max_in_flight=max_in_flight,
            health_interval=health_interval,
            replace_dead_servers=replace_dead_servers,
            dead_after=server_dead_after,
            headers=headers,
            token=token,
            progress=progress,
            console=console,
            transport=transport,
            dialer=dialer,
            membership=membership,
        )
        self.rehoming = Rehoming(self.fleet, self._request, timeout) if recover else None
        self.fleet.rehome = recover
        """Re-homes sessions that must leave their server (None: ``recover=False``)."""
        self._seed = seed
        self._rng = random.Random(seed)
        self._seeding = recover or seed is not None
        """Auto-resets are seeded from ``_rng``: their episodes can be replayed, and
        repeated by a pool given the same ``seed`` or reset with the same seeds (else the
        environment's own generator goes on, as Gymnasium's vector envs do)."""
        self._ready: deque[ResultTable] = deque()
        """Results of ``send`` groups, in the order they completed (``recv`` takes them)."""
        self._ready_count = 0
        self._arrived = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        self._codec = get_codec(codec)
        self._columns = self._codec.binary
        """Ask servers for columnar batch replies (the binary codec; JSON stays in rows)."""
        self._dtypes: dict[str, Any] | None = None
        self._gc_control = gc_control and runtime.gc_control_enabled()
        self.recording = None if record is None else Recording(record, "pool")
        """Where this pool records its episodes (``record=``), if anywhere."""
        self._recorder: EpisodeRecorder | None = None
        self._next_task: dict[str, int] = {}
        """The next index of each split ``reset(tasks=split)`` hands out."""

    # -- lifecycle ----------------------------------------------------------------

    @property
    def num_envs(self) -> int:
        """Number of sessions (Gymnasium's name for it)."""
        return self.n

    def __len__(self) -> int:
        return self.n

    @property
    def num_servers(self) -> int:
        """How many servers the pool uses."""
        return self.fleet.num_servers

    @property
    def server_urls(self) -> list[str]:
        """The URL of each server, in order."""
        return self.fleet.urls

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
            await self.fleet.start()
            if self._gc_control:
                runtime.freeze_survivors()  # connections, sessions, schemas: long-lived
        except BaseException:
            await self._teardown()
            raise
        return self

    async def close(self) -> None:
        """Close every session and connection, and stop the servers this pool started."""
        if self._closed:
            return
        self._closed = True
        await self._teardown()

    async def _teardown(self) -> None:
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        if self.recording is not None:
            self.recording.close()
        await self.fleet.close()

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
        tasks: str | Sequence[TaskRef | tuple[str, int]] | None = None,
    ) -> PoolBatch[ObsT]:
        r"""Start new episodes; returns the first observations.

        Args:
            seed: an int (session ``ids[k]`` gets ``seed + k``, as Gymnasium does), one
                seed per session, or None.
            options: reset options for every session, or one mapping per session.
            ids: the sessions to reset (default: all); or ``mask``, a bool per session.
            tasks: the tasks to play, spread over the sessions: a list of
                ``(split, index)`` pairs or :class:`TaskRef`\ s (session ``ids[k]`` gets
                ``tasks[k % len(tasks)]``), or a split's name, meaning its consecutive
                tasks (this pool's next unplayed index of that split onwards, so repeated
                resets walk the split; an index past its end fails that session with
                ``INVALID_ARGUMENT``). Each travels as the ``split``/``index`` reset
                options, which the server checks against the environment's tasks.
        """
        slots = self._select(ids, mask)
        busy = [s.index for s in slots if s.pending]
        if busy:
            raise ValueError(f"sessions {busy} have a step in flight; recv() their results first")
        seeds = _per_session(seed, len(slots), "seed", lambda s, k: s + k)
        if any(given is not None for given in seeds):
            # A seeded reset makes what follows it repeatable too: the auto-resets' seeds
            # come from the pool's seed and this reset's (as an environment's own
            # generator would go on from its seed), not from the OS.
            self._rng.seed(f"{self._seed}:{seeds}")
        for slot in slots:
            slot.next_seed = None  # drawn again, from the generator as it is now
        opts = _per_session(options, len(slots), "options", None)
        refs = self._spread(tasks, len(slots))
        items = []
        for k, slot in enumerate(slots):
            given = dict(opts[k]) if opts[k] is not None else {}
            items.append((slot, (seeds[k], with_task(given, refs[k]))))
        with self._gc_pause():
            sent, clock = time.time(), time.perf_counter()
            table = await self._exchange(ResetBatch.type, items, [s.index for s in slots])
            if self.recording is not None:
                inputs = {slot.index: given for slot, given in items}
                self._record(table, "reset", inputs, sent, clock)
            for slot in slots:
                if slot.index not in table.errors:
                    slot.needs_reset = False
            batch = self._deliver(table)
        if self._gc_control and len(slots) == self.n:
            runtime.freeze_survivors()  # a reset wave: its state lives for the episodes
        return batch

    def _spread(
        self, tasks: str | Sequence[TaskRef | tuple[str, int]] | None, count: int
    ) -> list[TaskRef | None]:
        """One task (or None) per session of a reset of ``count`` sessions."""
        if tasks is None:
            return [None] * count
        if isinstance(tasks, str):
            start = self._next_task.get(tasks, 0)
            self._next_task[tasks] = start + count
            return [TaskRef(split=tasks, index=start + k) for k in range(count)]
        refs = [as_task(t) for t in tasks]
        if not refs:
            raise ValueError("reset(tasks=[]) has no task to spread over the sessions")
        return [refs[k % len(refs)] for k in range(count)]

    def _record(
        self, table: ResultTable, op: str, inputs: Mapping[int, Any], sent: float, clock: float
    ) -> None:
        """Record an exchange's results (see :meth:`Recording.pool_rows`)."""
        assert self.recording is not None
        if self._recorder is None:
            links = [link for server in self.fleet.servers for link in server.links]
            env = links[0].connection.welcome.get("env", {}) if links else {}
            url = self.fleet.urls[0] if self.fleet.urls else None
            models = (self.action_type, self.observation_type, self.state_type)
            self._recorder = self.recording.recorder(env, url, models)
        latency = time.perf_counter() - clock
        self.recording.pool_rows(self._recorder, table, op, inputs, sent, latency)

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
        if any(s.pending for s in self.fleet.slots):
            raise ValueError("step() while send() results are pending: recv() them first")
        with self._gc_pause():
            payloads = self.typed.encode_actions(actions, self._codec)
            return self._deliver(await self._step_slots(self.fleet.slots, payloads))

    async def state(self, ids: Sequence[int] | None = None) -> list[StateT]:
        """The current state of each session in ``ids`` (default: all), typed."""
        slots = self._select(ids, None)

        moving = [s for s in slots if s.move is not None or s.lost is not None]
        if moving and self.rehoming is not None:
            await self.rehoming.rehome(moving)

        async def one(slot: Slot) -> StateT:
            await self.fleet.wait_ready(slot.server)
            error = self.fleet.unusable(slot)
            if error is not None:
                raise error
            assert slot.link is not None
            connection = slot.link.connection
            request = GetState(connection.next_id(), slot.session)
            reply = await connection.request(request, timeout=self.timeout)
            assert isinstance(reply, StateReply)
            return self.typed.state(reply.state, self._codec)

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
        payloads = self.typed.encode_actions(actions, self._codec)
        groups: dict[tuple[int, int], list[tuple[Slot, Any]]] = {}
        for slot, payload in zip(slots, payloads, strict=True):
            groups.setdefault((slot.server.index, id(slot.link)), []).append((slot, payload))
        for group in groups.values():
            link = group[0][0].link
            gate = link.gate if link is not None else None
            if gate is not None:
                await gate.acquire()  # back-pressure happens here, in the caller
            for slot, _ in group:
                slot.pending = True
            task = asyncio.create_task(self._complete(group, gate))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        # One loop turn, in which the completions write their messages: "sent" on return
        # (a blocking caller's loop stops once this returns, and the messages would wait
        # for the loop's next run: the next call, or the keeper's thread after its grace).
        await asyncio.sleep(0)

    async def _complete(
        self, group: list[tuple[Slot, Any]], gate: asyncio.Semaphore | None
    ) -> None:
        try:
            table = await self._step_slots([s for s, _ in group], [p for _, p in group])
        except Exception as exc:  # never lose a session: fail it instead
            error = exc if isinstance(exc, CorralError) else ConnectionLost(f"{exc!r}")
            table = ResultTable.failed([s.index for s, _ in group], error)
        finally:
            if gate is not None:
                gate.release()
        self._ready.append(table)
        self._ready_count += table.count
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
        pending = sum(s.pending for s in self.fleet.slots)
        want = pending if min_results is None else min_results
        if want > pending:
            raise ValueError(f"recv(min_results={want}) but only {pending} sessions are in flight")
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._ready_count < want:
            self._arrived.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            await runtime.wait_event(self._arrived, remaining)
        ready = self._ready_count
        count = ready if max_results is None else min(max_results, ready)
        taken: list[ResultTable] = []
        left = count
        while left > 0:
            table = self._ready.popleft()
            if table.count > left:  # the rest stays ready, first in line
                table, rest = table.split(left)
                self._ready.appendleft(rest)
            taken.append(table)
            left -= table.count
        self._ready_count -= count
        order: list[int] = []
        for table in taken:
            order += list(table.errors)
            order += table.ids
        for index in order:
            self.fleet.slots[index].pending = False
        with self._gc_pause():
            return self._deliver(ResultTable.concat(taken, order) if taken else ResultTable())

    # -- the engine ---------------------------------------------------------------

    async def _step_slots(self, slots: list[Slot], payloads: list[Any]) -> ResultTable:
        """Step ``slots`` (auto-resetting per the mode); the results in slot order."""
        mode = self.autoreset_mode
        order = [s.index for s in slots]
        # A server being recovered may come back replaced, its sessions to be reset: what
        # each session needs is decided once it is back, not before.
        await self._recovered([s for s in slots if s.move is None])
        if mode is AutoresetMode.DISABLED or not any(s.needs_reset for s in slots):
            resets: list[Slot] = []
            steps = list(zip(slots, payloads, strict=True))
        else:
            resets = [s for s in slots if s.needs_reset]
            steps = [(s, p) for s, p in zip(slots, payloads, strict=True) if not s.needs_reset]
        auto: list[tuple[Slot, Any]] = [(s, (self.auto_seed(), {})) for s in resets]
        if mode is AutoresetMode.SAME_STEP and self._seeding:
            # The seed of each session's next episode, drawn before any step that may end
            # the current one is sent: it goes with every such step (a re-sent step
            # carries the same) until the server's same-step reset uses it.
            for slot in slots:
                if slot.next_seed is None:
                    slot.next_seed = self._rng.getrandbits(31)
        sent, clock = time.time(), time.perf_counter()
        if not resets:  # most steps: one exchange, awaited as it is
            parts = [await self._exchange(StepBatch.type, steps)] if steps else []
        else:
            exchanges = [self._exchange(ResetBatch.type, auto)]
            if steps:
                exchanges.insert(0, self._exchange(StepBatch.type, steps))
            parts = await _all(exchanges)
        if self.recording is not None:
            if steps:
                self._record(parts[0], "step", {s.index: p for s, p in steps}, sent, clock)
            if resets:
                self._record(parts[-1], "reset", {s.index: p for s, p in auto}, sent, clock)
        if resets:
            reset_part = parts[-1]
            for index in reset_part.ids:
                self.fleet.slots[index].needs_reset = False
                reset_part.flags[index] = (0.0, False, False)
        table = ResultTable.concat(parts, order)
        for index, error in table.errors.items():
            if isinstance(error, (SessionLost, ConnectionLost)):
                # the episode is gone or in an unknown state
                self.fleet.slots[index].needs_reset = True
        ended = [i for i in table.done_ids() if i not in table.flags]
        if not ended or mode is AutoresetMode.DISABLED:
            return table
        if mode is AutoresetMode.NEXT_STEP:
            for index in ended:
                self.fleet.slots[index].needs_reset = True
            return table
        return await self._reset_finals(table, ended, sent, clock)

    async def _reset_finals(
        self, table: ResultTable, ended: list[int], sent: float, clock: float
    ) -> ResultTable:
        """SAME_STEP: the new episodes of the sessions whose episode just ended, in the
        same call: the resets the server ran with the steps (``sent``/``clock``: when
        they were sent), and a second round trip for those it did not (a server that
        does not know ``autoreset``)."""
        fresh = table.resets
        table.resets = {}
        slots = self.fleet.slots
        # The server's own resets ran with the seeds sent with the steps (None: unseeded,
        # not replayable); each seeded one is used up, the next episode draws its own.
        seeds = {index: slots[index].next_seed for index in fresh}
        for index, row in fresh.items():
            if isinstance(row, dict):
                slot = slots[index]
                slot.log.reset(seeds[index], {}, None, row)
                slot.ended = False
                slot.next_seed = None
        if fresh and self.recording is not None:
            served = [i for i in ended if i in fresh]
            inputs: dict[int, Any] = {i: (seeds[i], {}) for i in served}
            self._record(_table_of(fresh, served), "reset", inputs, sent, clock)
        missing = [i for i in ended if i not in fresh]
        if missing:
            sent, clock = time.time(), time.perf_counter()
            auto: list[tuple[Slot, Any]] = [
                (slots[i], (self._take_seed(slots[i]), {})) for i in missing
            ]
            done = await self._exchange(ResetBatch.type, auto)
            if self.recording is not None:
                self._record(done, "reset", {s.index: p for s, p in auto}, sent, clock)
            fresh = {**fresh, **done.errors}
            for k, index in enumerate(done.ids):
                fresh[index] = done.row(k)
        position = {sid: k for k, sid in enumerate(table.ids)}
        for index in ended:
            k = position[index]
            final = table.row(k)
            row = fresh[index]
            if isinstance(row, CorralError):
                self.fleet.slots[index].needs_reset = True  # retried on its next step
                table.errors[index] = row
                continue
            for name, values in table.fields.items():
                values[k] = row.get(name, ABSENT)
                table.sparse = table.sparse or name not in row
            reward = final.get("reward")
            truncated = final.get("truncated") is True
            table.flags[index] = (
                float(reward) if isinstance(reward, (int, float)) else 0.0,
                final.get("done") is True and not truncated,
                truncated,
            )
            metadata = final.get("metadata")
            table.finals[index] = final  # typed when the batch's infos are read
            table.extra[index] = {
                "final_info": dict(metadata) if isinstance(metadata, dict) else {}
            }
        if any(i in table.errors for i in ended):  # drop the rows of failed resets
            keep = [k for k, sid in enumerate(table.ids) if sid not in table.errors]
            table.ids = [table.ids[k] for k in keep]
            table.fields = {n: [v[k] for k in keep] for n, v in table.fields.items()}
        return table

    async def _exchange(
        self, kind: str, items: list[tuple[Slot, Any]], order: list[int] | None = None
    ) -> ResultTable:
        """:meth:`_exchange_once`, with the sessions that must move re-homed first and
        the ones found gone re-homed and sent again (module docstring); each session's
        episode log fed with the results (as each reply arrives, see :meth:`_request`)."""
        rehoming = self.rehoming
        if rehoming is None:
            return await self._exchange_once(kind, items, order)
        fresh = kind == ResetBatch.type
        order = [s.index for s, _ in items] if order is None else order
        moving = [s for s, _ in items if s.move is not None or s.lost is not None]
        if fresh:  # a session that stayed for its episode's end leaves at the next reset
            for slot, _ in items:
                if slot.stays and slot.move is None:
                    slot.move = Cause.GOING_AWAY
                    moving.append(slot)
        truncated, stuck = await rehoming.rehome(moving, fresh=fresh) if moving else ({}, {})
        sending = [(s, p) for s, p in items if s.index not in truncated and s.index not in stuck]
        table = await self._exchange_once(kind, sending, log=True) if sending else ResultTable()
        table.errors.update(stuck)
        for _ in range(_REHOME_ROUNDS):
            failed = [s for s, _ in sending if isinstance(table.errors.get(s.index), MOVABLE)]
            if not failed:
                break
            for slot in failed:
                slot.move = slot.move or cause_of(table.errors[slot.index])
            lost, stuck = await rehoming.rehome(failed, fresh=fresh)
            truncated.update(lost)
            for slot in failed:
                if slot.index not in stuck:
                    del table.errors[slot.index]
            table.errors.update(stuck)
            sending = [(s, p) for s, p in sending if s in failed and s.index not in lost]
            sending = [(s, p) for s, p in sending if s.index not in stuck]
            if sending:
                again = await self._exchange_once(kind, sending, log=True)
                table = ResultTable.concat([table, again], order)
        if truncated and kind == StepBatch.type:
            table = ResultTable.concat([table, await self._truncated(truncated)], order)
        return ResultTable.concat([table], order)

    def _log(self, kind: str, items: list[tuple[Slot, Any]], table: ResultTable) -> None:
        """Feed each session's episode log the results of ``items`` (one reply's)."""
        ids = table.ids
        if len(ids) == len(items) and ids == [slot.index for slot, _ in items]:
            position = None  # no item failed: row k is item k's
        else:
            position = {index: k for k, index in enumerate(ids)}
        if kind == ResetBatch.type:
            for k, (slot, (seed, options)) in enumerate(items):
                if position is not None:
                    k = position.get(slot.index, -1)
                if k >= 0:
                    slot.log.reset(seed, options, None, table.row(k))
                    slot.ended = False
            return
        done = table.fields.get("done")
        digests: list[int] | None = None
        for k, (slot, payload) in enumerate(items):
            if position is not None:
                k = position.get(slot.index, -1)
            if k >= 0:  # the hot path: no row is built
                log = slot.log
                # A digest (an encoding of the observation) only for an episode a replay
                # can repeat: an unseeded one (a reset with no seed) records nothing.
                if log.why_not is None:
                    if digests is None:  # every row's at once, columns converted once
                        digests = row_digests(table)
                    log.step_digested(payload, digests[k])
                slot.ended = done is not None and done[k] is True

    async def _truncated(self, truncated: dict[int, str]) -> ResultTable:
        """The rows of steps whose episode ended truncated: each session, fresh now, is
        reset (a seeded, replayable episode) and its step returns that observation with
        ``truncated`` and the reason in ``info["corral"]``."""
        items: list[tuple[Slot, Any]] = [
            (self.fleet.slots[i], (self.auto_seed(), {})) for i in truncated
        ]
        table = await self._exchange(ResetBatch.type, items)
        next_step = self.autoreset_mode is AutoresetMode.NEXT_STEP
        for index in table.ids:
            table.flags[index] = (0.0, False, True)
            table.extra[index] = {"corral": {"truncated": truncated[index]}}
            # NEXT_STEP: the step after a truncated one starts the next episode
            self.fleet.slots[index].needs_reset = next_step
        return table

    def auto_seed(self) -> int | None:
        """The seed of an auto-reset: drawn, so that its episode can be replayed or
        repeated (None with neither recovery nor a pool ``seed``: the environment's own
        generator goes on). A vector env that resets ended sessions itself, on a pool
        without auto-reset, seeds those resets with it (Gymnasium's ``RemoteVectorEnv``)."""
        return self._rng.getrandbits(31) if self._seeding else None

    def _take_seed(self, slot: Slot) -> int | None:
        """The seed of the auto-reset the pool sends ``slot`` itself in place of a
        same-step reset (a server that does not know ``autoreset``): the one its steps
        carried, so the episode is the same whoever resets it."""
        seed = slot.next_seed if slot.next_seed is not None else self.auto_seed()
        slot.next_seed = None
        return seed

    def stats(self) -> dict[str, Any]:
        """What the pool did to keep its sessions: re-homing counts and times
        (``reopened``, ``restored_by_snapshot``, ``restored_by_replay``, ``truncated``,
        ...), sessions per server id (``servers``), reconnects."""
        links = [link for server in self.fleet.servers for link in server.links]
        out: dict[str, Any] = self.rehoming.stats.as_dict() if self.rehoming else {}
        out["servers"] = self.fleet.spread()
        out["reconnects"] = sum(link.connection.reconnects for link in links)
        out["redialed_for_spread"] = self.fleet.misplaced
        return out

    async def fork(self, index: int, n: int) -> list[int]:
        """Branch session ``index``: ``n`` new sessions in its exact current state (by
        one snapshot restored ``n`` times where the environment declares one, else by a
        verified replay of its episode), spread over the servers. The pool grows by
        ``n``: the new sessions are ``pool.n - n .. pool.n - 1`` (returned), and from
        then on ``step`` takes one action for each. They evolve independently; each
        remembers its parent and the step it branched at (:meth:`lineage`).

        Raises:
            ValueError: ``n`` < 1, ``index`` out of range, or a step of it in flight.
            SnapshotUnsupported: the environment can be neither snapshotted nor
                replayed (an unseeded reset, a log past its bounds): the message says why.
        """
        self._require_started()
        if n < 1:
            raise ValueError(f"fork(index, n) needs n >= 1, got {n}")
        if not 0 <= index < self.n:
            raise ValueError(f"session id {index} is out of range 0..{self.n - 1}")
        source = self.fleet.slots[index]
        if source.pending:
            raise ValueError(f"session {index} has a step in flight; recv() it first")
        rehoming = self.rehoming or Rehoming(self.fleet, self._request, self.timeout)
        if source.move is not None or source.lost is not None:
            await rehoming.rehome([source])
        made = await rehoming.fork(source, n, self.n)
        children = [child for child, _ in made]
        self.fleet.slots += children
        self.fleet.n = self.n = self.n + n
        if self.recording is not None:  # each child's episode starts with its lineage
            if self._recorder is None:
                self._record(ResultTable(), "reset", {}, time.time(), time.perf_counter())
            assert self._recorder is not None
            parent = Lineage(
                episode=self._recorder.episode_of(f"pool-{index}"),
                session=f"pool-{index}",
                step=source.log.steps,
            )
            for child, observation in made:
                self._recorder.reset(
                    f"pool-{child.index}",
                    seed=source.log.seed,
                    options=source.log.options,
                    task=source.log.task,
                    observation=observation,
                    t=time.time(),
                    parent=parent,
                )
        return [child.index for child in children]

    def lineage(self, index: int) -> tuple[int, int] | None:
        """``(parent index, step)`` of a session made by :meth:`fork`, else None."""
        return self.fleet.slots[index].parent

    async def _exchange_once(
        self,
        kind: str,
        items: list[tuple[Slot, Any]],
        order: list[int] | None = None,
        *,
        log: bool = False,
    ) -> ResultTable:
        """Send ``items`` as batch messages (one per connection and chunk); their results
        in ``order`` (default: the items'). ``log``: feed the episode logs the results.

        Waits out the recovery of a server first; a session that cannot be reached is
        an error for that session only.
        """
        ready = await self._recovered([slot for slot, _ in items])
        unusable = ResultTable()
        groups: dict[int, tuple[Link, list[tuple[Slot, Any]]]] = {}
        last: Link | None = None
        entries: list[tuple[Slot, Any]] = []
        for entry in items:
            slot = entry[0]
            link = slot.link
            # What fleet.unusable checks, first inline (this runs per session per step).
            if link is None or slot.lost is not None or not (ready or slot.server.ready.is_set()):
                error = self.fleet.unusable(slot)
                assert error is not None
                unusable.errors[slot.index] = error
                continue
            if link is not last:  # a link's sessions are mostly next to each other
                group = groups.get(id(link))
                if group is None:
                    group = groups[id(link)] = (link, [])
                last, entries = link, group[1]
            entries.append(entry)
        requests = [
            self._request(link, kind, group[i : i + link.batch_limit], log=log)
            for link, group in groups.values()
            for i in range(0, len(group), link.batch_limit)
        ]
        parts = await _all(requests)
        if unusable.errors:
            parts.append(unusable)
        return ResultTable.concat(parts, [s.index for s, _ in items] if order is None else order)

    async def _recovered(self, slots: list[Slot]) -> bool:
        """Wait out the recovery of the servers of ``slots``; True when every server of
        the fleet was ready from the start (nothing to check per session)."""
        if all(server.ready.is_set() for server in self.fleet.servers):
            return True
        recovering = {s.server.index: s.server for s in slots if not s.server.ready.is_set()}
        await asyncio.gather(*(self.fleet.wait_ready(server) for server in recovering.values()))
        return False

    async def _request(
        self, link: Link, kind: str, chunk: list[tuple[Slot, Any]], *, log: bool = False
    ) -> ResultTable:
        """Send ``chunk`` on ``link`` as one batch message; its results (``log``: fed to
        the episode logs as the reply arrives, off the round's tail while other
        connections' replies are still on their way)."""
        table = await self._request_once(link, kind, chunk)
        if log:
            self._log(kind, chunk, table)
        return table

    async def _request_once(
        self, link: Link, kind: str, chunk: list[tuple[Slot, Any]]
    ) -> ResultTable:
        connection = link.connection
        message: StepBatch | ResetBatch
        if kind == StepBatch.type:
            # SAME_STEP: the server resets an ended episode in the same message, with the
            # seed drawn for the session's next episode (see _step_slots).
            autoreset = self.autoreset_mode is AutoresetMode.SAME_STEP
            if autoreset:
                steps = tuple([StepItem(s.session, p, s.next_seed) for s, p in chunk])
            else:
                steps = tuple([StepItem(s.session, p) for s, p in chunk])
            message = StepBatch(connection.next_id(), steps, self._columns, autoreset)
        else:
            resets = tuple([ResetItem(s.session, seed, opts) for s, (seed, opts) in chunk])
            message = ResetBatch(connection.next_id(), resets, self._columns)
        try:
            reply = await connection.request(message, timeout=self.timeout)
            assert isinstance(reply, BatchReply)
            reply.check(len(chunk))
        except CorralError as exc:
            if isinstance(exc, ConnectionLost):
                self.fleet.suspect(link.server)
            elif isinstance(exc, ClientClosed) and not self._closed:
                # The pool closed this connection itself, replacing a dead server: the
                # request's episode is lost, and the caller must hear it as such.
                reason = link.server.dead or "server died"
                exc = SessionLost(
                    f"the server is gone ({reason}); this episode was lost",
                    details={"reason": reason, "server": link.server.url},
                )
            return ResultTable.failed([s.index for s, _ in chunk], exc)
        columns = reply.columns
        if columns is not None:
            errors = columns.errors
            if not errors:
                table = ResultTable(
                    [s.index for s, _ in chunk], columns.fields, sparse=columns.sparse
                )
            else:
                table = ResultTable(
                    [s.index for k, (s, _) in enumerate(chunk) if k not in errors],
                    columns.fields,
                    sparse=columns.sparse,
                )
                for k, error in errors.items():
                    table.errors[chunk[k][0].index] = error.exception(reply.id)
            for k, reset in columns.resets.items():
                table.resets[chunk[k][0].index] = _row_of(reset, reply.id, "same-step reset")
            return table
        outcomes: dict[int, dict[str, Any] | CorralError] = {}
        served: dict[int, dict[str, Any] | CorralError] = {}
        for (slot, _), item in zip(chunk, reply.results, strict=True):
            outcome = outcomes[slot.index] = _row_of(item, reply.id, "batch item")
            same_step = item.reset if isinstance(item, ItemResult) else None
            if same_step is not None and isinstance(outcome, dict):
                served[slot.index] = _row_of(same_step, reply.id, "same-step reset")
        table = _table_of(outcomes, [slot.index for slot, _ in chunk])
        table.resets = served
        return table

    # -- selecting and delivering -------------------------------------------------

    def _gc_pause(self) -> contextlib.AbstractContextManager[None]:
        return runtime.GC_PAUSE if self._gc_control else contextlib.nullcontext()

    def _require_started(self) -> None:
        if self._closed:
            raise ClientClosed("this pool was closed")
        if not self._started or not self.fleet.servers:
            raise RuntimeError(
                "start the pool first: `async with EnvPool(...)` or `await pool.start()`"
            )

    def _select(
        self,
        ids: Sequence[int] | np.ndarray[Any, Any] | None,
        mask: Sequence[bool] | np.ndarray[Any, Any] | None,
    ) -> list[Slot]:
        self._require_started()
        if ids is not None and mask is not None:
            raise ValueError("pass ids or mask, not both")
        if mask is not None:
            flags = np.asarray(mask, dtype=bool)
            if flags.shape != (self.n,):
                raise ValueError(f"mask must hold {self.n} booleans, got shape {flags.shape}")
            return [self.fleet.slots[i] for i in np.flatnonzero(flags)]
        if ids is None:
            return list(self.fleet.slots)
        chosen = [int(i) for i in ids]
        bad = [i for i in chosen if not 0 <= i < self.n]
        if bad:
            raise ValueError(f"session ids {bad} are out of range 0..{self.n - 1}")
        if len(set(chosen)) != len(chosen):
            raise ValueError("session ids must not repeat")
        return [self.fleet.slots[i] for i in chosen]

    def _decode(self, raws: list[Any]) -> list[ObsT]:
        return self.typed.observations(raws, self._codec)

    def _deliver(self, table: ResultTable) -> PoolBatch[ObsT]:
        if self._dtypes is None:
            self._dtypes = scalar_dtypes(self.typed.observation_type)
        batch = PoolBatch(table, self._decode, self._dtypes)
        if table.errors and self.on_error == "raise":
            raise PoolError(table.errors, batch)
        return batch


async def _all(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """``asyncio.gather``, without a task per awaitable when there is just one."""
    if len(awaitables) == 1:
        return [await awaitables[0]]
    return list(await asyncio.gather(*awaitables))


def _table_of(outcomes: Mapping[int, dict[str, Any] | CorralError], ids: list[int]) -> ResultTable:
    """The table of sessions ``ids``' wire observations or errors (in ``ids``' order)."""
    ok: list[int] = []
    rows: list[dict[str, Any]] = []
    errors: dict[int, CorralError] = {}
    for index in ids:
        outcome = outcomes[index]
        if isinstance(outcome, CorralError):
            errors[index] = outcome
        else:
            ok.append(index)
            rows.append(outcome)
    table = ResultTable.from_rows(ok, rows)
    table.errors = errors
    return table


def _row_of(item: BatchItemReply, request_id: int, what: str) -> dict[str, Any] | CorralError:
    """An item of a batch reply, or its same-step reset (``what``): the wire observation,
    or its error."""
    if isinstance(item, ItemError):
        return item.exception(request_id)
    if isinstance(item.observation, dict):
        return item.observation
    return BadObservation(f"the server sent a {what} without an observation")


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


_MARGIN = 5.0
"""Seconds a blocking call waits beyond its own bound before giving up."""

_REHOME_ROUNDS = 3
"""Times a request whose sessions were found gone is re-homed and sent again (a second
server may fail meanwhile; a third time, the failure is the caller's)."""


class SyncEnvPool(BlockingTwin[EnvPool[ActT, ObsT, StateT]], Generic[ActT, ObsT, StateT]):
    """The blocking twin of :class:`EnvPool`: same methods, same errors.

    ``reset``, ``step``, ``send`` and ``recv`` are taskless blocking calls (see
    :mod:`corral.blocking`): nothing under them needs a current task.
    """

    @property
    def num_envs(self) -> int:
        """Number of sessions."""
        return self._async.n

    def __len__(self) -> int:
        return self._async.n

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """The pool's auto-reset mode."""
        return self._async.autoreset_mode

    def _wait(self) -> float | None:
        # A call may wait out a server's recovery, then send again: three timeouts.
        timeout = self._async.timeout
        return None if timeout is None else timeout * 3 + _MARGIN

    def _enter(self) -> None:
        self.start()

    def start(self) -> Self:
        """Start servers and open sessions; see :meth:`EnvPool.start`."""
        self._call(self._async.start(), None)
        return self

    def reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        ids: Sequence[int] | None = None,
        mask: Sequence[bool] | np.ndarray[Any, Any] | None = None,
        tasks: str | Sequence[TaskRef | tuple[str, int]] | None = None,
    ) -> PoolBatch[ObsT]:
        """Start new episodes; see :meth:`EnvPool.reset`."""
        coro = self._async.reset(seed, options, ids=ids, mask=mask, tasks=tasks)
        return self._call(coro, taskless=True)

    def step(self, actions: Sequence[ActT | Mapping[str, Any]]) -> PoolBatch[ObsT]:
        """Step every session; see :meth:`EnvPool.step`."""
        return self._call(self._async.step(actions), taskless=True)

    def state(self, ids: Sequence[int] | None = None) -> list[StateT]:
        """States of sessions; see :meth:`EnvPool.state`."""
        return self._call(self._async.state(ids))

    def send(
        self,
        actions: Sequence[ActT | Mapping[str, Any]],
        session_ids: Sequence[int] | np.ndarray[Any, Any] | None = None,
    ) -> None:
        """Start steps without waiting; see :meth:`EnvPool.send`."""
        self._call(self._async.send(actions, session_ids), taskless=True)

    def recv(
        self,
        min_results: int | None = None,
        timeout: float | None = None,
        *,
        max_results: int | None = None,
    ) -> PoolBatch[ObsT]:
        """Results of whichever sessions finished first; see :meth:`EnvPool.recv`."""
        coro = self._async.recv(min_results, timeout, max_results=max_results)
        return self._call(coro, ... if timeout is None else timeout + _MARGIN, taskless=True)

    def close(self) -> None:
        """Close sessions and connections, stop started servers."""
        self._call(self._async.close(), 60.0)


__all__ = [
    "AutoresetMode",
    "EnvPool",
    "PoolBatch",
    "PoolError",
    "ServerHandle",
    "SyncEnvPool",
    "stack_observations",
]
