"""``AsyncEnvClient``: one environment session on a corral server; ``SyncEnvClient``, its twin.

    async with AsyncEnvClient("http://127.0.0.1:8000", env=EchoEnv) as env:
        result = await env.reset(seed=1)
        result = await env.step(EchoAction(message="hi"))

Replies are decoded into the environment's typed models: the classes you pass (``env=``
or ``action_type=``/``observation_type=``/``state_type=``), or, when you pass none,
models built from the server's published schemas. No per-environment parsing code.

A dropped connection is re-established and the session resumed without the caller
noticing (see :mod:`corral.client.connection`). The session outlives its server too
(``recover=True``, the default): the client keeps an
:class:`~corral.protocol.recovery.EpisodeLog` of its episode; when its server says it is
going away (it drains), the session moves before the next call — by snapshot where the
env declares one, else by a verified replay of the episode — to whichever server the URL
(a front door) reaches next; a session found lost is restored by verified replay and the
call sent again. A session that can be neither snapshotted nor replayed raises
:class:`~corral.errors.SessionLost` with the reason, and is never silently replaced by
a new one.

An environment that declares a snapshot (:mod:`corral.contract.snapshot`) can be
snapshotted (:meth:`AsyncEnvClient.snapshot`), restored into a new session
(:meth:`AsyncEnvClient.restore`) and forked into independent sessions
(:meth:`AsyncEnvClient.fork`)::

    saved = await env.snapshot()          # a SessionSnapshot: the env's whole state
    await env.step(action)
    result = await env.restore(saved)     # back to where it was, in a new session
    branches = await env.fork(8)          # 8 clients, each at this session's state

:meth:`AsyncEnvClient.sync` (or :class:`SyncEnvClient` directly) gives the blocking twin:
same methods, same names, same exceptions; each call runs the async implementation on
corral's private background loop (:mod:`corral.blocking`), so it works in scripts and
inside Jupyter alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self

from pydantic import BaseModel

from corral.blocking import BlockingTwin, run_blocking
from corral.client.connection import Connection, http_url
from corral.client.dialers import Dialer
from corral.client.openenv_connection import OpenEnvConnection, is_openenv_refusal
from corral.client.recording import Recording, RecordTarget, as_task, now
from corral.client.typed import ActT, ObsT, StateT, TypedFace, TypedModels
from corral.contract import Environment, StepResult
from corral.contract.tasks import TaskRef
from corral.episodes import EpisodeRecorder
from corral.errors import (
    ClientClosed,
    CorralError,
    InvalidAction,
    SessionLost,
    SnapshotUnsupported,
    UnknownSession,
    UnsupportedProtocol,
)
from corral.protocol.client import ReconnectPolicy
from corral.protocol.messages import (
    Close,
    GetState,
    Open,
    Opened,
    Reply,
    Reset,
    Restore,
    Restored,
    Result,
    SnapshotReply,
    StateReply,
    Step,
    TakeSnapshot,
)
from corral.protocol.recovery import EpisodeLog
from corral.protocol.snapshot import SessionSnapshot

if TYPE_CHECKING:
    from corral.client.local_server import LocalServer

_MARGIN = 5.0
"""Seconds a blocking call waits beyond the client's own timeout before giving up."""

_MOVE_DIALS = 4
"""Connections a moving session dials, at most, to land off the server it leaves."""


class AsyncEnvClient(TypedFace[ActT, ObsT, StateT]):
    """A typed session with a remote environment (see module docstring).

    Args:
        url: the server (``http://host:port`` or ``ws://host:port/ws``).
        env: the environment class, to take the models (and contract) from it.
        action_type / observation_type / state_type: the models, given one by one.
        codec: ``"msgpack"`` (default) or ``"json"``.
        timeout: seconds to wait for each reply (None: no limit).
        connect_timeout: seconds to connect and complete the handshake.
        check_contract: send the local contract so that an incompatible server is
            refused at connect time (``CONTRACT_MISMATCH``).
        ping_interval / ping_timeout: keepalive; a server that does not answer a ping
            within ``ping_timeout`` counts as gone and the connection is re-established.
        headers: extra HTTP headers for the WebSocket handshake.
        openenv_fallback: if the server accepts the WebSocket without corral's
            subprotocol (an OpenEnv server), speak OpenEnv's envelope instead (see
            :mod:`corral.client.openenv_connection` for its limits).
        token: bearer token for a server started with one (default: ``$CORRAL_TOKEN``,
            or the file named by ``$CORRAL_TOKEN_FILE``).
        reconnect: a :class:`~corral.protocol.client.ReconnectPolicy`, True for the
            default (backoff up to 2 s, give up after 30 s), False to fail at the first drop.
        transport: the client transport, ``"auto"`` (``picows`` when installed, else
            ``asyncio``; ``asyncio`` for a blocking twin), ``"picows"``, ``"asyncio"`` or
            ``"websockets"``.
        dialer: opens the sockets and reaches the server over HTTP (default: the
            ``transport``'s); :mod:`corral.testing`'s in-process servers give theirs.
        max_frame_bytes: the largest reply frame taken (announced to the server, which
            answers a larger reply with ``REPLY_TOO_LARGE`` instead).
        record: a directory to record every reset and step of this session into, as an
            episode file (:mod:`corral.client.recording`); closed with the client.
        recover: move the session when its server goes away, restore it by replay when
            it is lost (module docstring); False: such calls raise ``SessionLost``.
    """

    def __init__(
        self,
        url: str,
        *,
        env: type[Environment[ActT, ObsT, StateT]] | None = None,
        action_type: type[ActT] | None = None,
        observation_type: type[ObsT] | None = None,
        state_type: type[StateT] | None = None,
        codec: str = "msgpack",
        timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        check_contract: bool = True,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        headers: Mapping[str, str] | None = None,
        openenv_fallback: bool = True,
        token: str | None = None,
        reconnect: ReconnectPolicy | bool = True,
        transport: str = "auto",
        dialer: Dialer | None = None,
        max_frame_bytes: int = 64 * 1024 * 1024,
        record: RecordTarget | None = None,
        recover: bool = True,
    ) -> None:
        self.url = http_url(url)
        self.timeout = timeout
        self._settings: dict[str, Any] = {
            "env": env,
            "codec": codec,
            "timeout": timeout,
            "connect_timeout": connect_timeout,
            "check_contract": check_contract,
            "ping_interval": ping_interval,
            "ping_timeout": ping_timeout,
            "headers": headers,
            "openenv_fallback": openenv_fallback,
            "token": token,
            "reconnect": reconnect,
            "transport": transport,
            "dialer": dialer,
            "max_frame_bytes": max_frame_bytes,
            "recover": recover,
        }
        """What this client was built with (but ``record``), for :meth:`fork`."""
        self.recover = recover
        self.log = EpisodeLog()
        """The current episode, as a verified replay needs it (when ``recover``)."""
        self.moves: dict[str, int] = {"snapshot": 0, "replay": 0}
        """Times the session moved (or was restored), by how."""
        self._leaving = False
        self.typed: TypedModels[ActT, ObsT, StateT] = TypedModels(
            env, action_type, observation_type, state_type, check_contract=check_contract
        )
        self.openenv_fallback = openenv_fallback
        self.connection: Connection | OpenEnvConnection = Connection(
            url,
            codec=codec,
            connect_timeout=connect_timeout,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            headers=dict(headers or {}),
            token=token,
            reconnect=reconnect,
            transport=transport,
            dialer=dialer,
            max_frame_bytes=max_frame_bytes,
        )
        self._watch(self.connection)
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self._server: LocalServer | None = None
        self._closed = False
        self.recording = None if record is None else Recording(record, "client")
        """Where this client records its episodes (``record=``), if anywhere."""

    # -- construction helpers -----------------------------------------------------

    @classmethod
    async def from_env(
        cls,
        target: str,
        *,
        env: type[Environment[Any, Any, Any]] | None = None,
        server_args: list[str] | None = None,
        startup_timeout: float = 60.0,
        **client_kwargs: Any,
    ) -> AsyncEnvClient[Any, Any, Any]:
        """Start ``target`` (``"module:Class"``) in a local server process and connect.

        The server process is stopped when the client closes (and at interpreter exit).
        """
        from corral.client.local_server import LocalServer

        server = LocalServer(
            target,
            server_args=server_args,
            startup_timeout=startup_timeout,
            token=client_kwargs.get("token"),
        )
        url = await server.start()
        try:
            client: AsyncEnvClient[Any, Any, Any] = cls(url, env=env, **client_kwargs)
            client._server = server
            await client.connect()
        except BaseException:
            await server.stop()
            raise
        return client

    @property
    def server(self) -> LocalServer | None:
        """The local server process this client started, if any."""
        return self._server

    def sync(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """A blocking twin of this client: same methods, same errors."""
        return SyncEnvClient(self)

    # -- connection and session ---------------------------------------------------

    async def connect(self) -> Self:
        """Connect, handshake and open the session (done lazily by the first call)."""
        if self._closed:
            raise ClientClosed("this client was closed")
        if self.session_id is not None:
            return self
        await self._link()
        connection = self.connection
        opened = await connection.request(Open(connection.next_id()), timeout=self.timeout)
        assert isinstance(opened, Opened)
        self.session_id = opened.session
        self.resume_token = opened.token
        return self

    async def _link(self) -> None:
        """Connect and handshake (falling back to OpenEnv's envelope), unless connected."""
        if self.connection.connected:
            return
        need_schemas = self.typed.incomplete
        try:
            welcome = await self.connection.connect(
                self.typed.local_contract(), want_schemas=need_schemas
            )
        except UnsupportedProtocol as exc:
            if not (
                self.openenv_fallback
                and isinstance(self.connection, Connection)
                and is_openenv_refusal(exc)
            ):
                raise
            self.connection = OpenEnvConnection.replacing(self.connection)
            welcome = await self.connection.connect(want_schemas=need_schemas)
        if need_schemas:
            self.typed.adopt_schemas(welcome.get("schemas") or {})

    @property
    def dialer(self) -> Dialer:
        """What reaches the server (sockets and HTTP)."""
        return self.connection.dialer

    @property
    def server_info(self) -> dict[str, Any]:
        """The server's ``welcome``: env name, contract version, fingerprint, limits."""
        return self.connection.welcome

    def _watch(self, connection: Connection | OpenEnvConnection) -> None:
        if isinstance(connection, Connection) and self.recover:
            connection.on_notice = lambda notice: setattr(self, "_leaving", True)

    async def _session(self) -> str:
        """This client's session id, connecting first if needed (and moving it first
        when its server is going away)."""
        if self._leaving:
            self._leaving = False
            with contextlib.suppress(CorralError):  # it stays; a later loss replays it
                await self._move(snapshot=True)
        session = self.session_id
        if session is None:
            await self.connect()
            session = self.session_id
            assert session is not None
        return session

    # -- the environment API ------------------------------------------------------

    async def reset(
        self,
        seed: int | None = None,
        *,
        task: TaskRef | tuple[str, int] | str | None = None,
        **options: Any,
    ) -> StepResult[ObsT]:
        """Start a new episode; returns its first observation as a :class:`StepResult`.

        Args:
            seed: the episode's seed.
            task: the task to play, ``(split, index)`` or a :class:`TaskRef`; the server
                checks it against the environment's tasks (``INVALID_ARGUMENT`` for an
                unknown split or an index out of range). ``split=``/``index=`` options
                choose a task too. Any other value is the environment's own ``task``
                reset option (the coding environment's task name, say), sent as is.
            options: the environment's reset options.
        """
        session = await self._session()
        connection = self.connection
        if task is not None and not isinstance(task, TaskRef | tuple):
            options = {**options, "task": task}
            task = None
        ref = as_task(task)
        request = Reset(connection.next_id(), session, seed, options, ref)
        if self.recording is None:
            reply = await self._recovering(request)
            if self.recover:
                assert isinstance(reply, Result)
                self.log.reset(seed, options, ref, reply.observation)
            return self._result(reply)
        recorder = self._recorder()
        sent, clock = now()
        try:
            result = self._result(await connection.request(request, timeout=self.timeout))
        except CorralError as exc:
            recorder.reset(session, seed=seed, options=options, task=ref, error=exc, t=sent)
            raise
        recorder.reset(
            session,
            seed=seed,
            options=options,
            task=ref,
            observation=result.observation,
            t=sent,
            latency_s=time.perf_counter() - clock,
        )
        return result

    async def step(self, action: ActT | Mapping[str, Any]) -> StepResult[ObsT]:
        """Apply ``action`` (a model or a dict validated locally) and return the result."""
        session = await self._session()
        connection = self.connection
        if self.recording is None:
            model = self.typed.action(action)
            payload = connection.codec.dump(model)
            reply = await self._recovering(Step(connection.next_id(), session, payload))
            if self.recover:
                assert isinstance(reply, Result)
                self.log.step(payload, reply.observation)
            return self._result(reply)
        recorder = self._recorder()
        sent, clock = now()
        try:
            model = self.typed.action(action)
        except InvalidAction as exc:  # refused before sending: recorded as the server would
            recorder.step(session, action=_raw(action), error=exc, t=sent)
            raise
        request = Step(connection.next_id(), session, connection.codec.dump(model))
        try:
            result = self._result(await connection.request(request, timeout=self.timeout))
        except CorralError as exc:
            recorder.step(session, action=model, error=exc, t=sent)
            raise
        recorder.step(
            session,
            action=model,
            observation=result.observation,
            t=sent,
            latency_s=time.perf_counter() - clock,
        )
        return result

    async def _recovering(self, request: Reset | Step) -> Reply:
        """Send ``request``; if its session turns out lost, restore the episode by
        verified replay on whichever server the URL reaches and send it again (once)."""
        try:
            return await self.connection.request(request, timeout=self.timeout)
        except (SessionLost, UnknownSession):
            if not self.recover or not (self.log.replayable or isinstance(request, Reset)):
                raise
        await self._move(snapshot=False)
        connection = self.connection
        assert self.session_id is not None
        again = (
            Reset(connection.next_id(), self.session_id, request.seed, request.options,
                  request.task)
            if isinstance(request, Reset)
            else Step(connection.next_id(), self.session_id, request.action)
        )  # fmt: skip
        return await connection.request(again, timeout=self.timeout)

    async def _move(self, *, snapshot: bool) -> None:
        """Move the session to a new connection (which the URL's front door balances
        away from a draining server): by snapshot from the old server when asked and
        possible, else by verified replay of the log, else a fresh session if no
        episode is under way.

        Raises:
            SessionLost: the episode can be neither snapshotted nor replayed.
        """
        old, old_session = self.connection, self.session_id
        assert isinstance(old, Connection)
        for attempt in range(_MOVE_DIALS):  # the door may land it where it was: again
            fresh = Connection(
                self.url,
                codec=old.codec.name,
                connect_timeout=old.connect_timeout,
                ping_interval=old.ping_interval,
                ping_timeout=old.ping_timeout,
                headers=old.headers,
                token=old.token,
                reconnect=old.protocol.policy or False,
                dialer=old.dialer,
                max_frame_bytes=old.max_frame_bytes,
            )
            await fresh.connect(self.typed.local_contract())
            if fresh.server_id != old.server_id or attempt == _MOVE_DIALS - 1:
                break
            await fresh.close()
        try:
            session, token = await self._rebuild(old, fresh, snapshot)
        except BaseException:
            await fresh.close()
            raise
        self.connection, self.session_id, self.resume_token = fresh, session, token
        self._watch(fresh)
        if old_session is not None and old.connected:
            with contextlib.suppress(CorralError):
                await old.request(Close(old.next_id(), old_session), timeout=5.0)
        await old.close()

    async def _rebuild(self, old: Connection, fresh: Connection, snapshot: bool) -> tuple[str, str]:
        """The session on ``fresh`` in the episode's state: (id, token)."""
        if (
            snapshot
            and self.session_id is not None
            and fresh.welcome.get("env", {}).get("snapshots")
        ):
            with contextlib.suppress(CorralError):
                taken = await old.request(
                    TakeSnapshot(old.next_id(), self.session_id), timeout=self.timeout
                )
                assert isinstance(taken, SnapshotReply)
                restored = await fresh.request(
                    Restore(fresh.next_id(), taken.snapshot), timeout=self.timeout
                )
                assert isinstance(restored, Restored)
                self.moves["snapshot"] += 1
                return restored.session, restored.token
        opened = await fresh.request(Open(fresh.next_id()), timeout=self.timeout)
        assert isinstance(opened, Opened)
        log = self.log
        if not log.started:
            return opened.session, opened.token
        if not log.replayable:
            raise SessionLost(
                f"session {self.session_id} had to leave its server and its episode can be "
                f"neither snapshotted nor replayed ({log.why_not})",
                details={"reason": log.why_not, "session": self.session_id},
            )
        reset = Reset(fresh.next_id(), opened.session, log.seed, log.options, log.task)
        reply = await fresh.request(reset, timeout=self.timeout)
        assert isinstance(reply, Result)
        why = log.check_reset(reply.observation)
        for index, action in enumerate(log.actions):
            if why is not None:
                break
            reply = await fresh.request(
                Step(fresh.next_id(), opened.session, action), timeout=self.timeout
            )
            assert isinstance(reply, Result)
            why = log.check_step(index, reply.observation)
        if why is not None:
            log.clear(why)
            raise SessionLost(
                f"session {self.session_id}'s episode could not be replayed: {why}",
                details={"reason": why, "session": self.session_id},
            )
        self.moves["replay"] += 1
        return opened.session, opened.token

    async def state(self) -> StateT:
        """The environment's current state, typed."""
        session = await self._session()
        connection = self.connection
        reply = await connection.request(
            GetState(connection.next_id(), session), timeout=self.timeout
        )
        assert isinstance(reply, StateReply)
        return self.typed.state(reply.state, connection.codec)

    # -- snapshots --------------------------------------------------------------------

    async def snapshot(self) -> SessionSnapshot:
        """A snapshot of this session, which carries on unchanged.

        It holds the environment's whole state (hidden parts included, e.g. a Wordle
        secret): keep it away from the policy. A server with a fleet key signs it, so it
        cannot be altered before it is restored.

        Raises:
            SnapshotUnsupported: the environment declares no snapshot (the message says
                how to declare one), or this is an OpenEnv connection.
            SnapshotTooLarge: the snapshot exceeds the server's ``max_snapshot_bytes``.
            ReplyTooLarge: it exceeds this client's ``max_frame_bytes``.
        """
        session = await self._session()
        connection = self.connection
        reply = await connection.request(
            TakeSnapshot(connection.next_id(), session), timeout=self.timeout
        )
        assert isinstance(reply, SnapshotReply)
        return reply.snapshot

    async def restore(self, snapshot: SessionSnapshot) -> StepResult[ObsT]:
        """Switch this client to a new session in the state ``snapshot`` captured (on this
        server, or any server of the same environment); the old session is closed.

        Returns the observation of the restored state, as the last ``reset``/``step``
        before the snapshot returned it. The new session continues where the snapshotted
        one was (an episode that had ended still needs a ``reset``).

        Raises:
            SnapshotUnsupported: the environment declares no snapshot.
            BadSnapshot: the snapshot is of another environment, fails the snapshot
                model, or is unsigned or altered (on a server with a fleet key).
            ContractMismatch: it was taken under an incompatible contract.
            CapacityReached / TooManySessions: no slot for the new session.
        """
        if self._closed:
            raise ClientClosed("this client was closed")
        await self._link()
        connection = self.connection
        reply = await connection.request(
            Restore(connection.next_id(), snapshot), timeout=self.timeout
        )
        assert isinstance(reply, Restored)
        old, self.session_id, self.resume_token = self.session_id, reply.session, reply.token
        if old is not None:
            with contextlib.suppress(CorralError):  # already gone is as good as closed
                await connection.request(Close(connection.next_id(), old), timeout=self.timeout)
        return StepResult.of(self.typed.observation(reply.observation, connection.codec))

    async def fork(self, n: int) -> list[AsyncEnvClient[ActT, ObsT, StateT]]:
        """``n`` new clients, each with its own session in this session's current state;
        they (and this one) then evolve independently. Close them when done.

        Each has its own connection to the same server, with this client's settings
        (recording aside). Built from one snapshot of this session.

        Raises:
            ValueError: ``n`` is below 1.
            SnapshotUnsupported: the environment can be neither snapshotted nor
                replayed, so it cannot be forked (the message says why).
        """
        if n < 1:
            raise ValueError(f"fork(n) needs n >= 1, got {n}")
        try:
            saved = await self.snapshot()
        except SnapshotUnsupported as exc:
            raise SnapshotUnsupported(
                f"cannot fork this session: {exc.message}", details=exc.details
            ) from exc
        forks = [
            type(self)(
                self.url,
                action_type=self.action_type,
                observation_type=self.observation_type,
                state_type=self.state_type,
                **self._settings,
            )
            for _ in range(n)
        ]
        try:
            await asyncio.gather(*(child.restore(saved) for child in forks))
        except BaseException:
            await asyncio.gather(*(child.close() for child in forks), return_exceptions=True)
            raise
        return forks

    async def close(self) -> None:
        """Close the session, the connection and any server this client started."""
        if self._closed:
            return
        self._closed = True
        connection = self.connection
        try:
            if self.session_id is not None and connection.connected:
                with contextlib.suppress(Exception):
                    close = Close(connection.next_id(), self.session_id)
                    await connection.request(close, timeout=5.0)
        finally:
            if self.recording is not None:
                self.recording.close()
            await connection.close()
            if self._server is not None:
                await self._server.stop()

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _recorder(self) -> EpisodeRecorder:
        assert self.recording is not None
        models = (self.action_type, self.observation_type, self.state_type)
        return self.recording.recorder(self.server_info.get("env", {}), self.url, models)

    def _result(self, reply: Reply) -> StepResult[ObsT]:
        assert isinstance(reply, Result)
        return StepResult.of(self.typed.observation(reply.observation, self.connection.codec))


def _raw(action: Any) -> Mapping[str, Any]:
    """An action that failed validation, as a map for its record."""
    if isinstance(action, BaseModel):
        return action.model_dump(mode="json")
    return dict(action)


class SyncEnvClient(BlockingTwin[AsyncEnvClient[ActT, ObsT, StateT]], Generic[ActT, ObsT, StateT]):
    """A blocking session with a remote environment; see :class:`AsyncEnvClient`."""

    @classmethod
    def connect_to(cls, url: str, **kwargs: Any) -> SyncEnvClient[Any, Any, Any]:
        """Create the async client with ``kwargs`` and return its connected twin."""
        twin: SyncEnvClient[Any, Any, Any] = SyncEnvClient(AsyncEnvClient(url, **kwargs))
        return twin.connect()

    @classmethod
    def from_env(
        cls,
        target: str,
        *,
        env: type[Environment[Any, Any, Any]] | None = None,
        **kwargs: Any,
    ) -> SyncEnvClient[Any, Any, Any]:
        """Start ``target`` in a local server process and connect (blocking)."""
        client = run_blocking(AsyncEnvClient.from_env(target, env=env, **kwargs), None)
        return SyncEnvClient(client)

    @property
    def async_client(self) -> AsyncEnvClient[ActT, ObsT, StateT]:
        """The async client this twin drives."""
        return self._async

    @property
    def session_id(self) -> str | None:
        """The server's id of this session."""
        return self._async.session_id

    @property
    def dialer(self) -> Dialer:
        """What reaches the server (sockets and HTTP)."""
        return self._async.dialer

    @property
    def server_info(self) -> dict[str, Any]:
        """The server's ``welcome``."""
        return self._async.server_info

    def _wait(self) -> float | None:
        timeout = self._async.timeout
        return None if timeout is None else timeout + _MARGIN

    def _enter(self) -> None:
        self.connect()

    def connect(self) -> Self:
        """Connect, handshake and open the session."""
        self._call(self._async.connect())
        return self

    def reset(
        self,
        seed: int | None = None,
        *,
        task: TaskRef | tuple[str, int] | str | None = None,
        **options: Any,
    ) -> StepResult[ObsT]:
        """Start a new episode; see :meth:`AsyncEnvClient.reset`."""
        return self._call(self._async.reset(seed, task=task, **options))

    def step(self, action: ActT | Mapping[str, Any]) -> StepResult[ObsT]:
        """Apply ``action``; see :meth:`AsyncEnvClient.step`.

        Taskless (see :func:`corral.blocking.run_blocking`) once the session is open on a
        corral connection: the step then writes its frame at once and awaits one reply
        future (its deadline is the connection's timer, not ``asyncio.timeout``; no task
        needed), which saves a task and a loop turn per call. A first call (it connects)
        and an OpenEnv connection run as a task.
        """
        client = self._async
        taskless = client.session_id is not None and isinstance(client.connection, Connection)
        return self._call(client.step(action), taskless=taskless)

    def state(self) -> StateT:
        """The current state; see :meth:`AsyncEnvClient.state`."""
        return self._call(self._async.state())

    def snapshot(self) -> SessionSnapshot:
        """A snapshot of this session; see :meth:`AsyncEnvClient.snapshot`."""
        return self._call(self._async.snapshot())

    def restore(self, snapshot: SessionSnapshot) -> StepResult[ObsT]:
        """Switch to a new session restored from ``snapshot``; see
        :meth:`AsyncEnvClient.restore`."""
        return self._call(self._async.restore(snapshot))

    def fork(self, n: int) -> list[SyncEnvClient[ActT, ObsT, StateT]]:
        """``n`` independent clients at this session's state; see
        :meth:`AsyncEnvClient.fork`."""
        return [SyncEnvClient(child) for child in self._call(self._async.fork(n))]

    def close(self) -> None:
        """Close the session, connection and any server the client started."""
        self._call(self._async.close(), 30.0)
