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
import base64
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from corral import runtime
from corral.contract import Environment
from corral.errors import CapacityReached
from corral.protocol.identity import SessionIds
from corral.protocol.position import Position
from corral.protocol.registry import SessionRegistry
from corral.protocol.session import ReplyCache, ReplySink, SessionMachine, SessionState
from corral.server import logs
from corral.server.config import ServerConfig
from corral.server.runner import (
    EnvFactory,
    EnvRunner,
    EnvThreads,
    Runner,
    Running,
    factory_error,
    guarded,
)
from corral.server.stats import Stats

log = logging.getLogger("corral.server")

FACTORY_ALPHA = 0.2
"""Weight of the newest build in the factory's moving average (as a runner's calls)."""


@dataclass(eq=False, kw_only=True, slots=True)
class Session(SessionState):
    """One live environment instance: the protocol's session plus its runner.

    Attributes:
        runner: runs the environment's methods (in a thread, on the loop, or in a
            worker process).
        task: the request running now, if any (cancelled when the session closes); a
            request answered without waiting never had one.
    """

    runner: Runner
    task: asyncio.Future[None] | Running | None = None


class RandomBytes:
    """Bytes from the kernel's CSPRNG (``os.urandom``), read 64 KiB at a time: the ids and
    resume tokens of 100,000 sessions cost a few dozen system calls, not 200,000.

    What ``uuid.uuid4().hex`` and ``secrets.token_urlsafe(24)`` gave before: 16 and 24
    random bytes, the same source, the same text forms. The loop's thread only.
    """

    __slots__ = ("_buffer", "_offset")

    CHUNK = 64 * 1024

    def __init__(self) -> None:
        self._buffer = b""
        self._offset = 0

    def take(self, count: int) -> bytes:
        """``count`` fresh random bytes (never handed out twice)."""
        if self._offset + count > len(self._buffer):
            self._buffer, self._offset = os.urandom(max(self.CHUNK, count)), 0
        start = self._offset
        self._offset = start + count
        return self._buffer[start : self._offset]


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
        ids: SessionIds | None = None,
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
            ids=ids,
            max_per_client=config.client_sessions,
        )
        self.stats = Stats()
        self._executor = EnvThreads(config.executor_threads)
        self._reaper: asyncio.Task[None] | None = None
        self._on_close = on_close
        self.runner_factory: Callable[[], Awaitable[Runner]] | None = None
        """Builds each session's runner instead of :meth:`EnvRunner.create` (workers)."""
        self._factory_s: float | None = None
        """Moving average of the factory's time (seconds), once measured."""
        self._measured_factory = self._measured()
        self._random = RandomBytes()

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

    async def build(
        self,
        owner: ReplySink,
        position: Position | None = None,
        prepare: Callable[[Session], Awaitable[None]] | None = None,
    ) -> Session:
        """Build the session ``owner`` reserved a slot for (the slot is freed on failure).

        Args:
            position: where the session starts (a restored session's; default: new).
            prepare: run on the session before it joins the registry (a restore runs the
                environment's ``restore`` here): until it returns, no request can reach
                the session and no disconnect can close it under it. If it raises, the
                slot is freed, the environment closed and the error propagates.

        Raises:
            FactoryError: the environment could not be built.
        """
        try:
            runner: Runner
            if self.runner_factory is not None:
                runner = await self.runner_factory()
            elif self._factory_inline():
                runner = self._build_inline()
            else:
                runner = await EnvRunner.create(
                    self._measured_factory,
                    self._executor,
                    thread_affinity=self.thread_affinity,
                    timeout=self.config.step_timeout_s,
                    inline_s=self.config.inline_step_s,
                )
        except BaseException:
            self.registry.release(owner)
            raise
        machine = (
            SessionMachine(auto_reset=self.auto_reset)
            if position is None
            else SessionMachine.restored(position, auto_reset=self.auto_reset)
        )
        session = Session(
            id=self.registry.mint(self._random.take(16).hex()),
            token=base64.urlsafe_b64encode(self._random.take(24)).decode(),
            runner=runner,
            machine=machine,
            cache=ReplyCache(self.config.reply_cache),
            owner=owner,
        )
        if prepare is not None:
            try:
                await prepare(session)
            except BaseException:
                self.registry.release(owner)
                await runner.close()
                raise
        self.registry.add(session, owner)
        self.stats.opened += 1
        logs.session_opened(session)
        return session

    def _factory_inline(self) -> bool:
        """The factory measures fast enough to build environments on the loop: a session
        then opens within the frame that asked for it, with no task and no thread hop (a
        server opening 100,000 sessions holds no backlog of them in flight)."""
        if self.thread_affinity or self.config.inline_step_s <= 0:
            return False
        average = self._factory_s
        return average is not None and average < self.config.inline_step_s

    def _observe_factory(self, seconds: float) -> None:
        old = self._factory_s
        self._factory_s = seconds if old is None else old + FACTORY_ALPHA * (seconds - old)

    def _measured(self) -> EnvFactory:
        """The factory, measured where it runs (in the executor: the hop is not its own
        time), under the factory's own name (for its errors)."""
        factory = self.factory

        @functools.wraps(factory)
        def measured() -> Environment[Any, Any, Any]:
            started = time.perf_counter()
            try:
                return factory()
            finally:
                self._observe_factory(time.perf_counter() - started)

        return measured

    def _build_inline(self) -> EnvRunner:
        """Build an environment on the loop (see :meth:`_factory_inline`).

        Raises:
            FactoryError: the factory raised.
        """
        started = time.perf_counter()
        try:
            # Guarded as in the executor: a SystemExit of the factory must not stop us.
            env = guarded("factory", self.factory)
        except Exception as exc:
            raise factory_error(self.factory, exc) from exc
        finally:
            self._observe_factory(time.perf_counter() - started)
        return EnvRunner(
            env,
            self._executor,
            own_executor=False,
            threads=self._executor,
            inline_s=self.config.inline_step_s,
        )

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
        """Close every session of ``owner`` (a clean disconnect): all leave the registry
        at once, freeing their slots and their client's share, then their environments
        close one after the other. Retired one by one as each environment closed, a pool
        of 1,024 sessions closed and a new one opened at once was refused
        ``TOO_MANY_SESSIONS``: its client still held the old sessions awaiting their
        turn."""
        retired = [s for s in self.registry.owned_by(owner) if self.retire(s, reason)]
        for session in retired:
            await session.runner.close()

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
            await runtime.reap(self._reaper)
            self._reaper = None
        for session in list(self.sessions.values()):
            await self.close(session, "server shutting down")
        self._executor.shutdown(wait=False, cancel_futures=True)
