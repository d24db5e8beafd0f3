"""The session manager: builds and closes environments around the session registry.

Every decision about sessions (capacity, ownership, resume, tombstones, which sessions
expired) is the sans-I/O :class:`~corral.protocol.registry.SessionRegistry`'s; this
module does what needs an event loop: building a session's environment (off the loop,
under the step timeout), closing it, and the timer that reaps expired sessions. No slot
ever leaks: a reservation that fails is released, a closed session frees its slot at
once, even while its environment is still closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from corral.errors import CapacityReached
from corral.protocol.registry import SessionRegistry
from corral.protocol.session import ReplyCache, ReplySink, SessionMachine, SessionState
from corral.server import logs
from corral.server.config import ServerConfig
from corral.server.runner import EnvFactory, EnvRunner, EnvThreads, Runner
from corral.server.stats import Stats

log = logging.getLogger("corral.server")


@dataclass(eq=False, kw_only=True)
class Session(SessionState):
    """One live environment instance: the protocol's session plus its runner.

    Attributes:
        runner: runs the environment's methods (in a thread, on the loop, or in a
            worker process).
        task: the request running now, if any (cancelled when the session closes); a
            request answered without waiting never had one.
    """

    runner: Runner
    task: asyncio.Future[None] | None = None


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
        self.registry: SessionRegistry[Session] = SessionRegistry(
            max_sessions=config.max_sessions,
            max_per_owner=config.max_sessions_per_connection,
            resume_window_s=config.resume_window_s,
            idle_timeout_s=config.idle_timeout_s,
            on_attach=logs.session_resumed,
            max_per_client=config.client_sessions,
        )
        self.stats = Stats()
        self._executor = EnvThreads(config.executor_threads)
        self._reaper: asyncio.Task[None] | None = None
        self._on_close = on_close
        self.runner_factory: Callable[[], Awaitable[Runner]] | None = None
        """Builds each session's runner instead of :meth:`EnvRunner.create` (workers)."""

    @property
    def sessions(self) -> dict[str, Session]:
        """The live sessions by id."""
        return self.registry.sessions

    @property
    def executor(self) -> EnvThreads:
        """The shared pool running sync environments' calls."""
        return self._executor

    @property
    def active(self) -> int:
        """Sessions holding a slot (live, detached, or being created)."""
        return self.registry.active

    def has_capacity(self) -> bool:
        """True when one more session fits."""
        return self.registry.has_capacity()

    def capacity_error(self) -> CapacityReached:
        """The error for a full server, with the figures a client needs."""
        return self.registry.capacity_error()

    async def open(self, owner: ReplySink, owned: int) -> Session:
        """Create a session owned by ``owner``, which already holds ``owned`` sessions.

        Raises:
            CapacityReached: the server is full.
            TooManySessions: the connection holds its maximum.
            FactoryError: the environment could not be built.
        """
        self.registry.reserve(owner, owned)
        return await self.build(owner)

    async def build(self, owner: ReplySink) -> Session:
        """Build the session ``owner`` reserved a slot for (the slot is freed on failure).

        Raises:
            FactoryError: the environment could not be built.
        """
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
                    inline_s=self.config.inline_step_s,
                )
        except BaseException:
            self.registry.release(owner)
            raise
        session = Session(
            id=uuid.uuid4().hex,
            token=secrets.token_urlsafe(24),
            runner=runner,
            machine=SessionMachine(auto_reset=self.auto_reset),
            cache=ReplyCache(self.config.reply_cache),
            owner=owner,
        )
        self.registry.add(session, owner)
        self.stats.opened += 1
        logs.session_opened(session)
        return session

    def get(self, session_id: str, owner: ReplySink) -> Session:
        """The live session ``session_id`` attached to ``owner``.

        Raises:
            SessionLost: the session existed and was closed (with the reason).
            UnknownSession: no such session on this connection.
        """
        return self.registry.get(session_id, owner)

    def detach_all(self, owner: ReplySink) -> None:
        """The connection ``owner`` dropped: its sessions wait for a re-attach."""
        for session in self.registry.detach_all(owner):
            logs.session_detached(session, self.config.resume_window_s)

    def retire(self, session: Session, reason: str) -> bool:
        """Close ``session`` for every request from now on and free its slot.

        Its running request is cancelled; its environment is left to :meth:`close`.
        Returns False when it was closed already.
        """
        if not self.registry.remove(session, reason):
            return False
        self.stats.closed += 1
        logs.session_closed(session, reason)
        task = session.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if self._on_close is not None:
            self._on_close(session, reason)
        return True

    async def close(self, session: Session, reason: str) -> None:
        """Close ``session`` now and free its slot; later requests see ``reason``."""
        if self.retire(session, reason):
            await session.runner.close()

    async def close_owned(self, owner: ReplySink, reason: str) -> None:
        """Close every session of ``owner`` (a clean disconnect)."""
        for session in self.registry.owned_by(owner):
            await self.close(session, reason)

    def start(self) -> None:
        """Start the idle/detached reaper on the running loop."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="corral-reaper")

    async def reap(self) -> int:
        """Close sessions idle or detached past their limits; return how many."""
        victims = self.registry.expired()
        for session, reason in victims:
            await self.close(session, reason)
        self.stats.reaped += len(victims)
        return len(victims)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.registry.check_interval())
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
