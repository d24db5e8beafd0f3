"""The session manager: capacity, ownership, resume, reaping. No slot ever leaks.

A session is one environment instance with its lifecycle machine, a resume token and a
reply cache. It belongs to the connection that opened it; when that connection drops,
the session is *detached* and waits ``resume_window_s`` for a client to re-attach with
its token before it is closed. Idle sessions are reaped after ``idle_timeout_s``.
Closed sessions leave a tombstone so that a late request gets ``SESSION_LOST`` with the
reason rather than a bare ``UNKNOWN_SESSION``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from corral.errors import (
    CapacityReached,
    SessionLost,
    TooManySessions,
    Unauthorized,
    UnknownSession,
)
from corral.protocol.session import ReplyCache, SessionMachine
from corral.server import logs
from corral.server.config import ServerConfig
from corral.server.runner import EnvFactory, EnvRunner, EnvThreads, Runner
from corral.server.stats import Stats

log = logging.getLogger("corral.server")

_TOMBSTONES = 10_000


class ReplySink(Protocol):
    """Where a session's replies go: the connection it is attached to."""

    def send(self, message: dict[str, Any]) -> None:
        """Queue ``message`` for delivery."""
        ...


@dataclass(eq=False)
class Session:
    """One live environment instance and its bookkeeping."""

    id: str
    token: str
    runner: Runner
    machine: SessionMachine
    cache: ReplyCache
    owner: ReplySink | None
    created: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    detached_at: float | None = None
    task: asyncio.Task[None] | None = None

    def touch(self) -> None:
        """Mark activity now (any request counts, ``state`` included)."""
        self.last_active = time.monotonic()

    def deliver(self, message: dict[str, Any]) -> None:
        """Send a reply to the attached connection; remembered for retries either way."""
        request_id = message.get("id")
        if isinstance(request_id, int):
            self.cache.put(request_id, message)
        if self.owner is not None:
            self.owner.send(message)


class SessionManager:
    """Creates, finds, detaches, re-attaches and closes sessions under a capacity."""

    def __init__(
        self,
        factory: EnvFactory,
        config: ServerConfig,
        *,
        auto_reset: bool,
        thread_affinity: bool,
        on_close: Callable[[Session, str], None] | None = None,
    ) -> None:
        self.factory = factory
        self.config = config
        self.auto_reset = auto_reset
        self.thread_affinity = thread_affinity
        self.sessions: dict[str, Session] = {}
        self.stats = Stats()
        self._reserved = 0
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self._executor = EnvThreads(config.executor_threads)
        self._reaper: asyncio.Task[None] | None = None
        self._on_close = on_close
        self.runner_factory: Callable[[], Awaitable[Runner]] | None = None
        """Builds each session's runner instead of :meth:`EnvRunner.create` (workers)."""

    @property
    def executor(self) -> EnvThreads:
        """The shared pool running sync environments' calls."""
        return self._executor

    @property
    def active(self) -> int:
        """Sessions holding a slot (live, detached, or being created)."""
        return len(self.sessions) + self._reserved

    def has_capacity(self) -> bool:
        """True when one more session fits."""
        return self.active < self.config.max_sessions

    def capacity_error(self) -> CapacityReached:
        """The error for a full server, with the figures a client needs."""
        self.stats.refused += 1
        return CapacityReached(
            f"server at capacity: {self.active}/{self.config.max_sessions} sessions",
            details={"active_sessions": self.active, "max_sessions": self.config.max_sessions},
        )

    async def open(self, owner: ReplySink, owned: int) -> Session:
        """Create a session owned by ``owner``, which already holds ``owned`` sessions.

        Raises:
            CapacityReached: the server is full.
            TooManySessions: the connection holds its maximum.
            FactoryError: the environment could not be built.
        """
        if owned >= self.config.max_sessions_per_connection:
            raise TooManySessions(
                f"this connection already holds {owned} sessions",
                details={"limit": self.config.max_sessions_per_connection},
            )
        if not self.has_capacity():
            raise self.capacity_error()
        self._reserved += 1
        try:
            runner: Runner
            if self.runner_factory is not None:
                runner = await self.runner_factory()
            else:
                runner = await EnvRunner.create(
                    self.factory,
                    self._executor,
                    thread_affinity=self.thread_affinity,
                    timeout=self.config.step_timeout_s,
                )
        finally:
            self._reserved -= 1
        session = Session(
            id=uuid.uuid4().hex,
            token=secrets.token_urlsafe(24),
            runner=runner,
            machine=SessionMachine(auto_reset=self.auto_reset),
            cache=ReplyCache(self.config.reply_cache),
            owner=owner,
        )
        self.sessions[session.id] = session
        self.stats.opened += 1
        logs.session_opened(session)
        return session

    def get(self, session_id: str, owner: ReplySink) -> Session:
        """The live session ``session_id`` attached to ``owner``.

        Raises:
            SessionLost: the session existed and was closed (with the reason).
            UnknownSession: no such session on this connection.
        """
        session = self.sessions.get(session_id)
        if session is None or session.owner is not owner:
            raise self._missing(session_id, "on this connection; open or attach it first")
        session.touch()
        return session

    def _missing(self, session_id: str, where: str) -> SessionLost | UnknownSession:
        """``SessionLost`` with the reason for a closed session, else ``UnknownSession``."""
        reason = self._tombstones.get(session_id)
        if reason is not None:
            return SessionLost(
                f"session {session_id} is gone: {reason}",
                details={"reason": reason, "session": session_id},
            )
        return UnknownSession(f"no session {session_id!r} {where}", details={"session": session_id})

    def attach(self, session_id: str, token: str, owner: ReplySink) -> Session:
        """Move a live session to ``owner`` (a reconnecting client).

        Raises:
            SessionLost / UnknownSession: as for :meth:`get`.
            Unauthorized: the resume token is wrong.
        """
        session = self.sessions.get(session_id)
        if session is None:
            raise self._missing(session_id, "on this server (it may have restarted)")
        # As bytes: compare_digest refuses non-ASCII str, and a token is whatever was sent.
        if not secrets.compare_digest(session.token.encode(), token.encode()):
            raise Unauthorized("wrong resume token for this session")
        session.owner = owner
        session.detached_at = None
        session.touch()
        logs.session_resumed(session)
        return session

    def detach_all(self, owner: ReplySink) -> None:
        """The connection ``owner`` dropped: its sessions wait for a re-attach."""
        now = time.monotonic()
        for session in self.sessions.values():
            if session.owner is owner:
                session.owner = None
                session.detached_at = now
                logs.session_detached(session, self.config.resume_window_s)

    async def close(self, session: Session, reason: str) -> None:
        """Close ``session`` now and free its slot; later requests see ``reason``."""
        if self.sessions.pop(session.id, None) is None:
            return
        session.machine.close(reason)
        self._tombstones[session.id] = reason
        while len(self._tombstones) > _TOMBSTONES:
            self._tombstones.popitem(last=False)
        self.stats.closed += 1
        logs.session_closed(session, reason)
        task = session.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if self._on_close is not None:
            self._on_close(session, reason)
        await session.runner.close()

    async def close_owned(self, owner: ReplySink, reason: str) -> None:
        """Close every session of ``owner`` (a clean disconnect)."""
        for session in [s for s in self.sessions.values() if s.owner is owner]:
            await self.close(session, reason)

    def start(self) -> None:
        """Start the idle/detached reaper on the running loop."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="corral-reaper")

    async def reap(self) -> int:
        """Close sessions idle or detached past their limits; return how many."""
        now = time.monotonic()
        idle = self.config.idle_timeout_s
        victims: list[tuple[Session, str]] = []
        for session in self.sessions.values():
            if session.detached_at is not None and (
                now - session.detached_at >= self.config.resume_window_s
            ):
                victims.append((session, "connection lost and not resumed in time"))
            elif (
                idle is not None
                and now - session.last_active >= idle
                and session.machine.running is None
            ):
                victims.append((session, f"idle for more than {idle:g} s"))
        for session, reason in victims:
            await self.close(session, reason)
        self.stats.reaped += len(victims)
        return len(victims)

    def reap_interval(self) -> float:
        """How often the reaper looks: a quarter of the shortest window, 0.05-5 s."""
        windows = [self.config.resume_window_s]
        if self.config.idle_timeout_s is not None:
            windows.append(self.config.idle_timeout_s)
        return max(0.05, min(5.0, min(windows) / 4))

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval())
            try:
                await self.reap()
            except Exception:  # the reaper must outlive any single bad close
                log.exception("session reaper failed")

    async def shutdown(self) -> None:
        """Stop the reaper and close every session (server shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for session in list(self.sessions.values()):
            await self.close(session, "server shutting down")
        self._executor.shutdown(wait=False, cancel_futures=True)
