"""The pool's fleet: its servers, their connections and sessions, health and recovery.

**Servers.** A fleet takes its servers from a *source*: a list of URLs of running
servers, or a factory of :class:`ServerHandle` objects it starts and stops itself (a
:class:`~corral.client.local_server.LocalServer` per ``"package.module:Class"`` target;
any provider fits behind a handle, :class:`ProviderServer`, which ``EnvPool(...,
provider=...)`` makes: ``start()`` returns the URL, ``alive()`` asks the provider,
``stop()`` releases the server).

**Layout.** Sessions are numbered ``0..n-1``; server ``j`` of ``M`` holds the contiguous
block ``j*n//M .. (j+1)*n//M - 1``, and each server's block is split over connections
(:class:`Link`) of at most ``sessions_per_connection`` sessions (capped by the server's
``max_sessions_per_connection``). Each link carries a gate of ``max_in_flight`` messages
(the pool's back-pressure) and the server's ``max_batch``.

**Health.** Every ``health_interval`` seconds (and whenever the pool reports a failure,
:meth:`Fleet.suspect`) the fleet checks a server: its handle is alive, none of its
connections gave up reconnecting, and ``/health`` answers. A server that fails the check
is recovered in the background, once at a time. **A stalled server is not a dead one**:
a server that stops answering (paused, swapping, a GC storm, a network partition) is
probed every ``probe_interval`` seconds while its sessions wait (steps to it wait too,
bounded); it is declared dead only when

* its process is gone (the handle says so: a server the fleet started), or
* it stayed unreachable past ``dead_after`` seconds, a deadline that must be longer
  than the server's resume window (default: twice that window, 60 s with the server's
  default 30 s), so that a server coming back within its window always finds its
  sessions re-attached.

Then:

* answering again: its dropped connections are replaced and their sessions re-attached
  with their resume tokens, episodes intact (a session the server no longer has is
  opened afresh and marked ``needs_reset``); requests in flight get their replies (the
  server's reply cache answers a re-sent one at most once);
* dead, started by the fleet, and ``replace_dead_servers``: a new server is started in
  its place; its sessions move with their episodes, as below, when the pool re-homes,
  else they are opened again on it and marked ``needs_reset``;
* dead otherwise: its sessions are lost (:meth:`Fleet.unusable` says why).

A dead server's connections are closed at once, so its requests in flight fail with
``SessionLost`` (never silently, never a wait for their timeout). The fleet's
connections give up reconnecting by themselves only after ``dead_after``: the fleet,
not a socket's backoff, decides when a server is gone.

**Sessions that move** (issue 29; the pool applies the remedies, see
:mod:`corral.client.rehoming`). A session must leave its server when the server sends
``going_away`` (it drains), when a connection cannot be re-dialed at all (refused:
nothing listens there, or the front door cannot reach that server — *unreachable*, at
once, no ``dead_after`` wait), or when the membership (:mod:`corral.client.membership`,
:meth:`Fleet.refresh`) no longer lists its server. The fleet marks such sessions
(:attr:`Slot.move`) and places them elsewhere (:meth:`Fleet.place`): on the server, by
``welcome.server.id``, holding the fewest sessions that is neither leaving nor draining.
Behind one front door several entries of the URL list are the same URL: each connection
is balanced by the door and counted by the server it lands on, and one that lands where
the others already are is dialed again (:meth:`Fleet.connect`), so ``[door] * 2`` puts
half the sessions on each of two servers.

This module is one thing over ~900 lines: the servers' handles (local, provider, URL),
their connections, the health and recovery loop, and where a session may go (placement,
membership, drains) share the fleet's state; splitting them would pass that state around
instead. What is done to a session that moves is :mod:`corral.client.rehoming`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from corral import runtime
from corral.auth import bearer_header, resolve_token
from corral.client.connection import Connection, http_url
from corral.client.dialers import Dialer, dialer_for
from corral.client.health import answers
from corral.client.membership import Membership
from corral.client.typed import TypedModels
from corral.errors import ConnectionLost, CorralError, RequestTimeout, SessionLost
from corral.protocol.client import ReconnectPolicy
from corral.protocol.messages import GoingAway, Open, Opened
from corral.protocol.recovery import Cause, EpisodeLog

if TYPE_CHECKING:
    import httpx
    from rich.console import Console
    from rich.progress import Progress, TaskID

log = logging.getLogger("corral.client")


class ServerHandle(Protocol):
    """A server the fleet starts and stops (such as a :class:`LocalServer`)."""

    async def start(self) -> str:
        """Start the server; return its URL once it is ready."""
        ...

    async def stop(self) -> None:
        """Stop the server (idempotent)."""
        ...

    async def alive(self) -> bool:
        """False once the server is known to be gone (its process or container ended)."""
        ...


class ServerProvider(Protocol):
    """What the pool needs of a provider (:class:`~corral.providers.Provider` has it):
    start a server for a spec, stop it, say whether it still runs."""

    async def start(self, spec: Any) -> Any: ...
    async def stop(self, endpoint: Any) -> None: ...
    async def alive(self, endpoint: Any) -> bool: ...


class ProviderServer:
    """A :class:`ServerHandle` over a provider: one server of ``spec`` that the pool
    owns (started with the fleet, stopped with it or when it is replaced).

    The provider stays the caller's: the pool stops what it started, never the
    provider itself.
    """

    def __init__(self, provider: ServerProvider, spec: Any) -> None:
        self.provider = provider
        self.spec = spec
        self.endpoint: Any = None

    async def start(self) -> str:
        """Start the server through the provider; its URL once it is ready."""
        self.endpoint = await self.provider.start(self.spec)
        return str(self.endpoint.url)

    async def stop(self) -> None:
        """Stop the server (idempotent)."""
        endpoint, self.endpoint = self.endpoint, None
        if endpoint is not None:
            await self.provider.stop(endpoint)

    async def alive(self) -> bool:
        """What the provider says of the server's process, container, Pod or actor."""
        return self.endpoint is not None and bool(await self.provider.alive(self.endpoint))


ServerSource = list[str] | Callable[[], ServerHandle]
"""Where a fleet's servers come from: running servers' URLs, or a factory of handles."""


def server_source(
    target: str | Sequence[str] | Callable[[], ServerHandle] | Any,
    servers: int | None,
    server_args: Sequence[str] | None,
    startup_timeout: float,
    provider: ServerProvider | None = None,
) -> tuple[ServerSource, int]:
    """The source of ``EnvPool``'s ``target`` and how many servers it gives.

    With a ``provider``, ``target`` is what its ``start`` takes (a ``"module:Class"``
    reference, a project path, a ``ServerSpec``) and each server is a
    :class:`ProviderServer`.

    Raises:
        ValueError: the target is neither a URL, a list of URLs, an environment
            reference nor a callable, or ``servers`` does not fit it.
    """
    if servers is not None and servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if provider is not None:
        if server_args:
            raise ValueError("server_args= is for local servers; give a provider its spec")
        if (isinstance(target, str) and "://" in target) or isinstance(target, (list, tuple)):
            raise ValueError("provider= starts servers: give it a spec, not URLs")
        return (lambda: ProviderServer(provider, target)), servers or 1
    if isinstance(target, str) and "://" not in target:
        if ":" not in target and not Path(target).exists():  # an environment directory
            raise ValueError(
                f"target {target!r} is neither a URL nor an environment reference "
                "'package.module:Class'"
            )
        from corral.client.local_server import LocalServer

        args = list(server_args or [])
        return (
            lambda: LocalServer(target, server_args=args, startup_timeout=startup_timeout)
        ), servers or 1
    if callable(target):
        return target, servers or 1
    if servers is not None:
        raise ValueError("servers= is for targets the pool starts; a URL list says how many")
    if isinstance(target, str):
        return [target], 1
    urls = list(target)
    if not urls or not all(isinstance(u, str) for u in urls):
        raise ValueError("target must be a non-empty list of server URLs")
    return urls, len(urls)


@dataclass(eq=False)
class FleetServer:
    """One server of the fleet and what the fleet knows about it."""

    index: int
    handle: ServerHandle | None
    url: str
    links: list[Link] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while the server is usable; cleared while it is being recovered."""
    dead: str | None = None
    """Why the server is gone, when it could not be recovered."""
    recovering: asyncio.Task[None] | None = None
    leaving: bool = False
    """The membership no longer lists it: no new sessions; its sessions move."""


@dataclass(eq=False)
class Link:
    """One connection to a server and the sessions it carries."""

    server: FleetServer
    connection: Connection
    slots: list[Slot]
    gate: asyncio.Semaphore
    """At most ``max_in_flight`` messages outstanding on this connection."""
    batch_limit: int
    """The server's ``max_batch``: items per batch message."""
    capacity: int = 256
    """Sessions this connection may carry (the server's limit per connection)."""

    @property
    def server_id(self) -> str | None:
        """The id of the server holding this link's sessions (``welcome.server.id``)."""
        return self.connection.server_id

    @property
    def usable(self) -> bool:
        """It may take a session: not closed, gave up, draining, or full."""
        connection = self.connection
        return (
            not connection.protocol.closed
            and not _failed(connection)
            and connection.going_away is None
            and len(self.slots) < self.capacity
        )


@dataclass(eq=False)
class Slot:
    """Session ``index`` of the pool: where it lives and what its episode needs."""

    index: int
    server: FleetServer
    link: Link | None = None
    session: str = ""
    needs_reset: bool = False
    """The episode is gone or ended: the next step resets it (per the autoreset mode)."""
    pending: bool = False
    """A step sent with ``EnvPool.send`` waits for ``recv``."""
    lost: str | None = None
    """Why the session is gone for good."""
    log: EpisodeLog = field(default_factory=EpisodeLog)
    """The current episode, as a verified replay needs it."""
    ended: bool = False
    """The current episode ended (nothing to restore if it moves)."""
    move: Cause | None = None
    """It must leave its server, for this reason (the pool re-homes it before its next
    request)."""
    stays: bool = False
    """It finishes its episode where it is (neither snapshot nor replay can move it)."""
    parent: tuple[int, int] | None = None
    """A forked session's source: (its index, the step it was forked at)."""
    next_seed: int | None = None
    """The seed of its next episode, given in advance to the server that resets it in
    the step that ends the current one (``AutoresetMode.SAME_STEP``; None: not drawn
    yet, or the pool draws none)."""


class Fleet:
    """The servers, connections and sessions of one pool (see the module docstring).

    Args:
        n: number of sessions.
        source: the servers (see :func:`server_source`).
        num_servers: how many servers the source gives.
        typed: the pool's models (the handshake sends their contract or fetches schemas).
        codec / connect_timeout / headers / token: of every connection.
        timeout: seconds for each ``open``/``attach`` request.
        sessions_per_connection / max_in_flight: the layout (module docstring).
        health_interval: seconds between health checks (None: only when suspected).
        replace_dead_servers: start a new server in place of a dead one it started.
        dead_after: seconds a server may stay unreachable before it counts as dead
            (None: twice the server's resume window); must exceed that window.
        probe_interval: seconds between probes of a server being recovered.
        progress / console: the progress bar while starting (None: when stderr is a
            terminal and the fleet is large).
        transport / dialer: what opens every connection and reaches the servers over
            HTTP (the health checks): ``dialer``, else the ``transport``'s.
        membership: where the server URLs come from over time (read at each health
            check and by :meth:`refresh`); ``source`` is its first answer.
    """

    def __init__(
        self,
        n: int,
        source: ServerSource,
        num_servers: int,
        typed: TypedModels[Any, Any, Any],
        *,
        codec: str,
        timeout: float | None,
        connect_timeout: float,
        sessions_per_connection: int,
        max_in_flight: int,
        health_interval: float | None,
        replace_dead_servers: bool,
        headers: Mapping[str, str] | None,
        token: str | None,
        progress: bool | None,
        console: Console | None,
        dead_after: float | None = None,
        probe_interval: float = 0.5,
        transport: str = "auto",
        dialer: Dialer | None = None,
        membership: Membership | None = None,
    ) -> None:
        if dead_after is not None and dead_after <= 0:
            raise ValueError(f"dead_after must be > 0 or None, got {dead_after}")
        if probe_interval <= 0:
            raise ValueError(f"probe_interval must be > 0, got {probe_interval}")
        self.n = n
        self.source = source
        self.num_servers = num_servers
        self.typed = typed
        self.codec = codec
        self.dialer = dialer if dialer is not None else dialer_for(transport)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.sessions_per_connection = sessions_per_connection
        self.max_in_flight = max_in_flight
        self.health_interval = health_interval
        self.replace_dead_servers = replace_dead_servers
        self.dead_after_wanted = dead_after
        self.dead_after = dead_after if dead_after is not None else 60.0
        """Seconds unreachable before a server counts as dead (resolved at the first
        handshake, from the server's resume window, when not given)."""
        self.probe_interval = probe_interval
        self.headers = dict(headers or {})
        self.token = resolve_token(token)
        self.servers: list[FleetServer] = []
        self.slots: list[Slot] = []
        self.closed = False
        self._progress_wanted = progress
        self._console = console
        self._monitor: asyncio.Task[None] | None = None
        self.deaths: list[tuple[str, str, float]] = []
        """Servers declared dead: ``(url, reason, seconds from suspicion to the verdict)``."""
        self.membership = membership
        self.rehome = False
        """The pool re-homes sessions (see :mod:`corral.client.rehoming`): sessions that
        cannot stay are marked to move rather than reset or lost."""
        self.draining: dict[str, object] = {}
        """Server id → the instance that said ``going_away`` (a new instance of the same
        id, after a restart, takes sessions again)."""
        self.known: set[str] = set()
        """Every server id a connection of the fleet landed on so far."""
        self.misplaced = 0
        """Connections dialed again because the door put them where others already were."""
        self._placing = asyncio.Lock()
        self._url_locks: dict[str, asyncio.Lock] = {}
        """One per URL: the entries of one front door open their first link in turn."""
        self._closing: set[asyncio.Task[None]] = set()
        """Closes running in the background (retired links, sessions that left)."""
        self._per_connection = sessions_per_connection

    @property
    def urls(self) -> list[str]:
        """The URL of each server, in order."""
        return [s.url for s in self.servers]

    # -- starting and stopping ----------------------------------------------------

    async def start(self) -> None:
        """Start (or reach) the servers, connect, open every session, start the monitor.

        Raises:
            ServerStartError / ConnectionLost / CapacityReached / ContractMismatch: a
                server could not be started or reached, or refused the pool (what was
                started is left for :meth:`close`).
        """
        if self.membership is not None and not self.source:
            self.source = [http_url(u) for u in await self.membership.urls()]
            self.num_servers = len(self.source)
            if not self.source:
                raise ConnectionLost("the fleet's membership lists no server")
        with self._bar() as bar:
            await self._start_servers(bar)
            task = bar.add("opening sessions", self.n)
            await asyncio.gather(*(self._open(s, bar, task) for s in self.servers))
        if self.health_interval is not None:
            self._monitor = asyncio.create_task(self._monitor_forever(), name="corral-pool-health")

    async def _start_servers(self, bar: _Bar) -> None:
        factory = self.source if callable(self.source) else None
        urls = self.source if isinstance(self.source, list) else []
        task = bar.add("starting servers", self.num_servers) if factory else None

        async def one(index: int) -> FleetServer:
            handle = factory() if factory is not None else None
            url = await handle.start() if handle is not None else urls[index]
            bar.advance(task)
            return FleetServer(index, handle, http_url(url))

        started = await asyncio.gather(
            *(one(j) for j in range(self.num_servers)), return_exceptions=True
        )
        self.servers = [s for s in started if isinstance(s, FleetServer)]
        failure = next((s for s in started if isinstance(s, BaseException)), None)
        if failure is not None:
            raise failure
        self.slots = [
            Slot(i, self.servers[j])
            for j, block in enumerate(_blocks(self.n, self.num_servers))
            for i in block
        ]

    async def _open(
        self,
        server: FleetServer,
        bar: _Bar,
        task: TaskID | None,
        slots: list[Slot] | None = None,
    ) -> None:
        """Connect to ``server`` and open sessions for ``slots`` (default: its block).

        Entries of the URL list that are one front door take turns (one lock per URL)
        so that each can see where the others landed and land elsewhere."""
        slots = self.slots_of(server) if slots is None else slots
        server.links = []
        async with self._lock_of(server.url):
            first = await self.connect(server, avoid=self._ids_of_url(server.url))
        limits = first.welcome.get("limits", {})
        self._resolve_dead_after(limits)
        per = min(
            self.sessions_per_connection,
            int(limits.get("max_sessions_per_connection", self.sessions_per_connection)),
        )
        self._per_connection = per
        batch_limit = int(limits.get("max_batch", per))
        groups = [slots[i : i + per] for i in range(0, len(slots), per)] or [[]]
        pin = first.server_id
        connections = [first] + [await self.connect(server, pin=pin) for _ in groups[1:]]
        links = [
            self._link(server, connection, group, batch_limit, per)
            for connection, group in zip(connections, groups, strict=True)
        ]
        placed = [(slot, link) for link in links for slot in link.slots]

        async def open_one(slot: Slot, link: Link) -> None:
            session = await self._open_session(link.connection)
            # Both at once, when the session is open: a request never finds the slot on
            # a link its session is not on.
            slot.link, slot.session, slot.lost = link, session, None
            bar.advance(task)

        await asyncio.gather(*(open_one(slot, link) for slot, link in placed))
        server.dead = None
        server.ready.set()

    def _resolve_dead_after(self, limits: Mapping[str, Any]) -> None:
        """Check or derive :attr:`dead_after` from the server's resume window.

        Raises:
            ValueError: ``dead_after`` was given and is not longer than the window.
        """
        window = limits.get("resume_window_s")
        if not isinstance(window, int | float) or isinstance(window, bool):
            return
        if self.dead_after_wanted is None:
            self.dead_after = max(self.dead_after, 2.0 * float(window))
        elif self.dead_after_wanted <= window:
            raise ValueError(
                f"dead_after={self.dead_after_wanted:g} s must be longer than the server's "
                f"resume window ({window:g} s): a server stalled within its window still "
                "holds the sessions"
            )

    def _link(
        self,
        server: FleetServer,
        connection: Connection,
        slots: list[Slot],
        batch_limit: int,
        capacity: int,
    ) -> Link:
        """A new link of ``server``; its connection's notices and losses reach the fleet."""
        link = Link(
            server, connection, slots, asyncio.Semaphore(self.max_in_flight), batch_limit, capacity
        )
        connection.on_notice = lambda notice: self._going_away(link, notice)
        connection.on_unreachable = lambda error: self._unreachable(link, error)
        server.links.append(link)
        return link

    def _lock_of(self, url: str) -> asyncio.Lock:
        return self._url_locks.setdefault(url, asyncio.Lock())

    def _ids_of_url(self, url: str) -> set[str]:
        """Server ids the links of ``url`` already landed on."""
        return {
            sid
            for server in self.servers
            if server.url == url
            for link in server.links
            if (sid := link.server_id) is not None
        }

    async def connect(
        self,
        server: FleetServer,
        *,
        pin: str | None = None,
        avoid: set[str] | frozenset[str] = frozenset(),
        tries: int = 6,
    ) -> Connection:
        """A new connection to ``server``, handshake done (schemas adopted if needed).

        ``pin`` names the server id to reach behind a front door; a connection the door
        puts on a server of ``avoid`` (or on a draining one) is closed and dialed again
        (at most ``tries`` times; the last one is kept: the door may have nowhere else
        to go).
        """
        for attempt in range(tries):
            connection = Connection(
                server.url,
                codec=self.codec,
                connect_timeout=self.connect_timeout,
                headers=self.headers,
                token=self.token,
                reconnect=self._reconnect_policy(),
                dialer=self.dialer,
                server=pin,
            )
            try:
                await self._handshake(connection)
            except BaseException:
                await connection.close()
                raise
            if connection.server_id is not None:
                self.known.add(connection.server_id)
            fits = connection.server_id not in avoid and self._fresh(connection)
            if fits or attempt == tries - 1:
                return connection
            self.misplaced += 1
            await connection.close()
        raise AssertionError("unreachable: the last try returns")

    def _reconnect_policy(self) -> ReconnectPolicy:
        # The fleet decides when a server is dead: a connection keeps trying a while longer.
        return dataclasses.replace(ReconnectPolicy(), give_up_after_s=self.dead_after + 30.0)

    async def _handshake(self, connection: Connection) -> None:
        need_schemas = self.typed.incomplete
        welcome = await connection.connect(self.typed.local_contract(), want_schemas=need_schemas)
        if need_schemas:
            self.typed.adopt_schemas(welcome.get("schemas") or {})

    async def _open_session(self, connection: Connection) -> str:
        """Open a session on ``connection``; its id."""
        opened = await connection.request(Open(connection.next_id()), timeout=self.timeout)
        assert isinstance(opened, Opened)
        return opened.session

    def _bar(self) -> _Bar:
        wanted = self._progress_wanted
        if wanted is None:
            wanted = sys.stderr.isatty() and (self.n >= 64 or self.num_servers > 1)
        return _Bar(wanted, self._console)

    async def close(self) -> None:
        """Stop the monitor and recoveries, close every connection, stop started servers."""
        self.closed = True
        if self._monitor is not None:
            self._monitor.cancel()
            await runtime.reap(self._monitor)
        for server in self.servers:
            if server.recovering is not None:
                server.recovering.cancel()
        await asyncio.gather(*(self._close_server(s) for s in self.servers))
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def _close_server(self, server: FleetServer) -> None:
        for link in server.links:
            with contextlib.suppress(Exception):
                await link.connection.close()
        if server.handle is not None:
            with contextlib.suppress(Exception):
                await server.handle.stop()

    # -- using a session ----------------------------------------------------------

    def slots_of(self, server: FleetServer) -> list[Slot]:
        """The sessions ``server`` holds, in order."""
        return [s for s in self.slots if s.server is server]

    def spread(self) -> dict[str, int]:
        """Sessions per server id (``welcome.server.id``; the URL where a server has none)."""
        counts: dict[str, int] = {}
        for slot in self.slots:
            if slot.link is not None and slot.lost is None:
                key = slot.link.server_id or slot.server.url
                counts[key] = counts.get(key, 0) + 1
        return counts

    # -- sessions that move ---------------------------------------------------------

    def _going_away(self, link: Link, notice: GoingAway) -> None:
        """``link``'s server drains: its sessions move (the pool, before their next
        request, when it re-homes); it takes no new ones."""
        welcome = link.connection.protocol.welcome
        instance = welcome.server.get("instance") if welcome is not None else None
        self.draining[notice.server or link.server_id or ""] = instance
        log.info("server %s goes away (%s): moving its sessions", notice.server, notice.reason)
        for slot in link.slots if self.rehome else ():
            if slot.move is None:
                slot.move = Cause.GOING_AWAY

    def _unreachable(self, link: Link, error: BaseException) -> None:
        """``link``'s server cannot be dialed again (refused): its sessions move now,
        its connection is closed (requests waiting on it fail, for the pool to re-home
        and re-send)."""
        if not self.rehome or isinstance(error, (RequestTimeout, TimeoutError)):
            return  # silent, not refused (maybe stalled), or nobody moves sessions: the
            # health checks decide
        reason = error.message if isinstance(error, CorralError) else repr(error)
        log.warning("server %s is unreachable (%s): moving its sessions", link.server_id, reason)
        for slot in link.slots:
            slot.move = Cause.UNREACHABLE
        self.retire(link)

    def retire(self, link: Link) -> None:
        """Close ``link`` (in the background) and forget it; its slots stay where they
        are until moved."""
        if link in link.server.links:
            link.server.links.remove(link)
        self.in_background(link.connection.close())

    def in_background(self, closing: Coroutine[Any, Any, None]) -> None:
        """Run ``closing`` (a close that nobody waits for) as a task the fleet awaits
        when it closes."""
        task = asyncio.get_running_loop().create_task(closing)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _takes_sessions(self, link: Link) -> bool:
        """``link`` may take sessions: usable, its server neither leaving nor draining."""
        if not link.usable or link.server.leaving or not link.server.ready.is_set():
            return False
        sid = link.server_id
        if sid is None or sid not in self.draining:
            return True
        welcome = link.connection.protocol.welcome
        instance = welcome.server.get("instance") if welcome is not None else None
        return instance != self.draining[sid]

    async def place(self, avoid: set[str]) -> Link:
        """A link to put one more session on: the least-loaded healthy server by id,
        not one of ``avoid`` (the server a session leaves); a new connection when no
        link fits or a server of the fleet holds no link yet (it joined, or came back).

        Raises:
            ConnectionLost: no server of the fleet can take it.
        """
        async with self._placing:
            load = self.spread()
            fits = [
                link
                for server in self.servers
                for link in server.links
                if (link.server_id or server.url) not in avoid and self._takes_sessions(link)
            ]
            unlinked = [
                s
                for s in self.servers
                if not s.links and s.ready.is_set() and not s.leaving and s.dead is None
            ]
            if unlinked or not fits:
                link = await self._new_link(avoid, unlinked or None)
                if link is not None:
                    return link
            if fits:
                return min(fits, key=lambda link: load.get(link.server_id or "", 0))
        raise ConnectionLost("no server of the fleet can take a session now")

    async def _new_link(
        self, avoid: set[str], servers: list[FleetServer] | None = None
    ) -> Link | None:
        """A new connection to a server of the fleet (of ``servers``, by default any)
        landing outside ``avoid``, as a link (None: every server refused, or the doors
        only led to ``avoid``)."""
        candidates = sorted(
            servers
            or [s for s in self.servers if s.ready.is_set() and not s.leaving and s.dead is None],
            key=lambda s: len(self.slots_of(s)),
        )
        # Through a door, the servers known by id are asked for by name first (a door
        # may keep sending the unnamed to a draining one); then the door's own pick.
        pins: list[str | None] = [sid for sid in sorted(self.known) if sid not in avoid]
        for server in candidates:
            for pin in [*pins, None]:
                try:
                    connection = await self.connect(
                        server, pin=pin, avoid=avoid, tries=1 if pin else 4
                    )
                except CorralError as exc:
                    log.info("cannot place a session on %s (%s): %s", server.url, pin, exc)
                    continue
                sid = connection.server_id
                if sid is not None and (sid in avoid or not self._fresh(connection)):
                    await connection.close()
                    continue
                break
            else:
                continue
            limits = connection.welcome.get("limits", {})
            batch_limit = int(limits.get("max_batch", self._per_connection))
            return self._link(server, connection, [], batch_limit, self._per_connection)
        return None

    def _fresh(self, connection: Connection) -> bool:
        """The connection's server is not the draining instance of its id."""
        sid = connection.server_id
        if sid is None or sid not in self.draining:
            return True
        instance = connection.welcome.get("server", {}).get("instance")
        return bool(instance != self.draining[sid])

    def move_to(self, slot: Slot, link: Link, session: str) -> None:
        """``slot`` is now ``session`` on ``link``."""
        old = slot.link
        if old is not None and slot in old.slots:
            old.slots.remove(slot)
        link.slots.append(slot)
        slot.server, slot.link, slot.session = link.server, link, session
        slot.lost, slot.move, slot.stays = None, None, False

    async def open_on(self, link: Link) -> str:
        """Open a fresh session on ``link``; its id."""
        return await self._open_session(link.connection)

    # -- membership -----------------------------------------------------------------

    async def refresh(self, urls: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
        """Take the fleet's membership now: ``urls``, else the membership's answer.

        A new URL becomes a server taking new and moving sessions; a server whose URL is
        gone is *leaving*: its sessions move before their next request. Returns the URLs
        added and removed. An empty answer changes nothing (a resolver's hiccup must not
        empty the fleet).
        """
        if urls is None:
            if self.membership is None:
                return [], []
            urls = await self.membership.urls()
        wanted = [http_url(u) for u in urls]
        if not wanted:
            return [], []
        present = {s.url for s in self.servers if not s.leaving}
        removed = sorted(present - set(wanted))
        added = [u for u in dict.fromkeys(wanted) if u not in present]
        for server in self.servers:
            if server.url in removed:
                server.leaving = True
                for slot in self.slots_of(server):
                    if slot.move is None:
                        slot.move = Cause.LEAVING
            elif server.url in wanted and server.leaving:
                server.leaving = False
        for url in added:
            known = next((s for s in self.servers if s.url == url), None)
            if known is not None:
                continue
            server = FleetServer(len(self.servers), None, url)
            server.ready.set()
            self.servers.append(server)
            self.num_servers = len(self.servers)
        return added, removed

    async def wait_ready(self, server: FleetServer) -> None:
        """Wait (bounded) while ``server`` is being recovered; never raises."""
        recovering = server.recovering
        if server.ready.is_set() or recovering is None:
            return
        wait = self.dead_after + (60.0 if self.timeout is None else self.timeout) + 30.0
        with contextlib.suppress(Exception):
            await runtime.wait_for(asyncio.shield(recovering), wait)

    def unusable(self, slot: Slot) -> SessionLost | None:
        """Why ``slot`` cannot be sent to now, or None."""
        server = slot.server
        if not server.ready.is_set():
            return SessionLost(
                f"session {slot.index}'s server {server.url} is gone: {server.dead}",
                details={"session": slot.index, "reason": server.dead},
            )
        if slot.lost is not None or slot.link is None:
            return SessionLost(
                f"session {slot.index} is gone: {slot.lost}",
                details={"session": slot.index, "reason": slot.lost},
            )
        return None

    # -- health and recovery ------------------------------------------------------

    def suspect(self, server: FleetServer) -> None:
        """Something failed on ``server``: recover it in the background (once at a time)."""
        if self.closed or server.recovering is not None:
            return
        server.ready.clear()
        server.recovering = asyncio.create_task(self._recover(server))

    async def _monitor_forever(self) -> None:
        assert self.health_interval is not None
        async with self._http() as http:
            while True:
                await asyncio.sleep(self.health_interval)
                if self.membership is not None:
                    try:
                        await self.refresh()
                    except Exception as exc:  # a source's failure must not stop the checks
                        log.warning("reading the fleet's membership failed: %r", exc)
                for server in self.servers:
                    try:
                        if server.recovering is None and not await self._healthy(server, http):
                            self.suspect(server)
                    except Exception as exc:  # one server's check must not end everyone's
                        log.warning("checking %s failed: %r", server.url, exc)

    async def _healthy(self, server: FleetServer, http: httpx.AsyncClient) -> bool:
        """The handle is alive, no connection gave up, and ``/health`` answers."""
        if server.handle is not None and not await server.handle.alive():
            return False
        if any(_failed(link.connection) for link in server.links):
            return False  # gave up reconnecting (a reconnect in progress is left to finish)
        return await answers(server.url, http=http)

    def _http(self) -> httpx.AsyncClient:
        """A client for the health checks, through the dialer: the pool's headers, plus
        the bearer token if any."""
        headers = {**self.headers, **(bearer_header(self.token) if self.token else {})}
        return self.dialer.http(headers=headers)

    async def _recover(self, server: FleetServer) -> None:
        """Probe ``server`` until it answers (re-attach), its process is gone, or it stayed
        unreachable past :attr:`dead_after` (dead: replace it or lose its sessions)."""
        since = time.monotonic()
        try:
            async with self._http() as http:
                await self._probe(server, http, since)
        except Exception as exc:
            server.dead = f"recovery failed: {exc}"
            log.warning("could not recover server %s: %s", server.url, exc)
        finally:
            server.recovering = None

    async def _probe(self, server: FleetServer, http: httpx.AsyncClient, since: float) -> None:
        """Probe until the server answers, its process is gone, or :attr:`dead_after`."""
        while True:
            if server.handle is not None and not await server.handle.alive():
                await self._dead(server, "the server process exited", since)
                return
            if await answers(server.url, http=http):
                await self._reattach(server)
                return
            if time.monotonic() - since >= self.dead_after:
                reason = f"the server did not answer for {self.dead_after:g} s"
                await self._dead(server, reason, since)
                return
            await asyncio.sleep(self.probe_interval)

    async def _dead(self, server: FleetServer, reason: str, since: float) -> None:
        """``server`` is gone: replace it if the fleet may, else lose its sessions.

        Its connections are closed first, so requests in flight fail now with
        ``SessionLost`` instead of waiting out their timeout.
        """
        detected = time.monotonic() - since
        log.warning(
            "server %s is dead (%s; %.1f s after it was suspected)", server.url, reason, detected
        )
        self.deaths.append((server.url, reason, detected))
        server.dead = reason
        if server.handle is not None and self.replace_dead_servers:
            await self._replace(server)
            return
        for slot in self.slots_of(server):
            slot.lost = reason
            slot.needs_reset = True
        await self._close_server(server)

    async def _reattach(self, server: FleetServer) -> None:
        """Re-establish the connections to a live server that gave up reconnecting.

        Each connection re-attaches its own sessions (episodes intact, request ids going
        on, so the server's reply cache stays right); a session the server no longer has
        is opened afresh and marked ``needs_reset`` — or, when the pool re-homes
        (:attr:`rehome`), marked to move (restored from its log). Behind a front door
        the URL answers while one server behind it does not: with re-homing, a
        connection that cannot come back is retired and its sessions marked to move,
        instead of the whole URL being declared dead.
        """
        for link in list(server.links):
            connection = link.connection
            if not _failed(connection):
                continue
            if self.rehome and not link.slots:
                self.retire(link)
                continue
            try:
                await self._handshake(connection)
            except CorralError:
                if not self.rehome:
                    raise
                for slot in link.slots:
                    slot.move = Cause.UNREACHABLE
                self.retire(link)
                continue
            for slot in link.slots:
                if connection.sessions.reason(slot.session) is not None:
                    if self.rehome:
                        slot.move = slot.move or Cause.LOST
                        continue
                    connection.sessions.forget(slot.session)
                    slot.session = await self._open_session(connection)
                    slot.needs_reset = True
                slot.lost = None
        server.dead = None
        server.ready.set()

    async def _replace(self, server: FleetServer) -> None:
        """Start a new server in place of a dead one.

        Its sessions died with it. When the pool re-homes (:attr:`rehome`) they are
        marked to move, now, and the pool restores their episodes before their next
        request, on the new server or another: the fleet opens none for them, so that
        one session is never moved by both (a session opened here while the pool moved
        it elsewhere left the slot on one server with the other's session id). Otherwise
        they are opened again on the new server and marked ``needs_reset``.
        """
        log.warning("server %s died; starting a replacement", server.url)
        dead = self.slots_of(server)
        if self.rehome:
            for slot in dead:
                slot.move = slot.move or Cause.LOST
        await self._close_server(server)
        assert callable(self.source)
        server.handle = self.source()
        server.url = http_url(await server.handle.start())
        await self._open(server, _Bar(False, None), None, [] if self.rehome else dead)
        if not self.rehome:
            for slot in dead:
                slot.needs_reset = True


def _failed(connection: Connection) -> bool:
    """True for a connection that is down and no longer reconnecting by itself."""
    return not connection.connected and not connection.reconnecting


def _blocks(n: int, servers: int) -> list[range]:
    """Contiguous session ranges, one per server."""
    return [range(j * n // servers, (j + 1) * n // servers) for j in range(servers)]


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
