"""The provider interface: start an environment server somewhere, get an endpoint.

    async with LocalProcessProvider() as provider:          # or DockerProvider()
        endpoint = await provider.start("corral.envs.echo:EchoEnv")
        async with AsyncEnvClient(endpoint.url) as env:
            ...
    # every server the provider started is stopped here

    with LocalProcessProvider().sync() as provider:         # the blocking twin
        endpoint = provider.start("path/to/my_env")

A :class:`Provider` is async-first; :meth:`Provider.sync` returns a :class:`SyncProvider`
with the same methods, blocking. :meth:`~Provider.start` returns only once the server
answers ``/ready``; a start that fails, times out or is cancelled leaves nothing behind.
Servers are stopped by :meth:`~Provider.stop`, by :meth:`~Provider.close` and on context
exit, at interpreter exit, and, when the process is killed outright, by its guardian
(:mod:`corral.providers.guardian`).
"""

from __future__ import annotations

import asyncio
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from corral.auth import bearer_header, resolve_token
from corral.blocking import BlockingTwin
from corral.client.health import READY, answers, probe_client
from corral.errors import ServerStartError
from corral.providers.manifest import MANIFEST_NAMES, Manifest, load_manifest

OWNED_SERVER_ARGS = ("--max-sessions-per-client", "0")
"""The option of a server a provider starts for its caller alone: the per-client share
(all of ``--max-sessions`` but an eighth) keeps room for other clients of a shared
server, and such a server has none: the trainer that started it may fill it."""


@dataclass(frozen=True)
class ServerSpec:
    """What to serve, and how.

    Attributes:
        target: what the provider runs. The local provider takes an entry point
            (``"package.module:Class"``, ``"gym:CartPole-v1"``) or an environment
            directory; the Docker provider takes an image tag or an environment
            directory (it runs the image ``corral build`` made of it).
        max_sessions: sessions one server holds (default: the manifest's, or the
            server's default).
        idle_timeout_s: reap sessions idle this long (default: the manifest's).
        environment: extra environment variables for the server.
        server_args: extra ``corral serve`` options.
        cpu: CPUs (Docker: a hard quota; the local provider has no rate limit).
        memory: bytes or ``"512Mi"``-style size (default: the manifest's).
        pids: processes and threads (default: the manifest's).
        startup_timeout: seconds to wait for ``/ready`` (default: the provider's).
    """

    target: str
    max_sessions: int | None = None
    idle_timeout_s: float | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    server_args: tuple[str, ...] = ()
    cpu: float | None = None
    memory: int | str | None = None
    pids: int | None = None
    startup_timeout: float | None = None

    @classmethod
    def of(cls, value: ServerSpec | str | os.PathLike[str]) -> ServerSpec:
        """``value`` as a spec: a spec as is, a string or path as its ``target``."""
        if isinstance(value, ServerSpec):
            return value
        if isinstance(value, os.PathLike):
            return cls(target=os.fspath(value))
        if isinstance(value, str):
            return cls(target=value)
        raise TypeError(
            f"a server spec is a ServerSpec, an entry point, an image or a directory, "
            f"not {type(value).__name__}"
        )

    @property
    def manifest_path(self) -> Path | None:
        """The manifest the target names (a directory holding one, or the file), if any."""
        path = Path(self.target)
        if path.is_dir():
            if any((path / name).is_file() for name in MANIFEST_NAMES):
                return path
            return None
        if path.suffix in (".yaml", ".yml") and path.is_file():
            return path
        return None

    def manifest(self) -> Manifest | None:
        """The target's manifest, loaded (None when the target is not a directory/file).

        Raises:
            ManifestError: the manifest is invalid.
        """
        path = self.manifest_path
        return load_manifest(path) if path is not None else None

    def serve_args(self, manifest: Manifest | None = None, *, owned: bool = False) -> list[str]:
        """The ``corral serve`` options this spec sets (limits the manifest does not).

        ``owned``: the server is started for its caller alone (a local process, a
        container, a Ray actor the trainer's pool starts): its one client may take every
        slot (:data:`OWNED_SERVER_ARGS`), unless ``server_args`` says otherwise.
        """
        args: list[str] = []
        if self.max_sessions is not None:
            args += ["--max-sessions", str(self.max_sessions)]
        elif manifest is not None:
            args += ["--max-sessions", str(manifest.concurrency.max_sessions)]
        if self.idle_timeout_s is not None:
            args += ["--idle-timeout", f"{self.idle_timeout_s:g}"]
        elif manifest is not None:
            args += ["--idle-timeout", f"{manifest.concurrency.idle_timeout_s:g}"]
        if owned and OWNED_SERVER_ARGS[0] not in self.server_args:
            args += OWNED_SERVER_ARGS
        return [*args, *self.server_args]


SpecLike = ServerSpec | str | os.PathLike[str]
"""What :meth:`Provider.start` takes: a spec, or a target string or path."""


@dataclass(frozen=True)
class Endpoint:
    """A running server a provider started.

    Attributes:
        url: its base URL (``http://127.0.0.1:PORT``).
        host: the host address clients connect to.
        port: the port clients connect to.
    """

    url: str
    host: str
    port: int

    @property
    def id(self) -> str:
        """What the provider calls this server (a pid, a container id)."""
        return self.url


class Provider(ABC):
    """Starts environment servers and owns them until they are stopped.

    Subclasses implement :meth:`start`, :meth:`stop`, :meth:`alive`, :meth:`logs` and
    :attr:`endpoints`; the rest (readiness and health checks, closing, the context
    manager and the blocking twin) is shared.

    Args:
        startup_timeout: seconds a server may take to answer ``/ready``.
        token: the bearer token servers require (default: ``$CORRAL_TOKEN`` or
            ``$CORRAL_TOKEN_FILE`` if set, else none). Clients of the servers pass it too.
    """

    kind: ClassVar[str] = ""
    """A short name for messages and reports: ``local``, ``docker``."""

    def __init__(self, *, startup_timeout: float = 60.0, token: str | None = None) -> None:
        self.startup_timeout = startup_timeout
        self.token = resolve_token(token)
        self._closed = False

    def http_headers(self) -> dict[str, str]:
        """Headers of this provider's own requests to its servers (the bearer token)."""
        return bearer_header(self.token) if self.token is not None else {}

    @property
    def closed(self) -> bool:
        """:meth:`close` was called; starts are refused."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ServerStartError(
                f"the {self.kind or type(self).__name__} provider is closed; create a new one"
            )

    @abstractmethod
    async def start(self, spec: SpecLike) -> Endpoint:
        """Start a server for ``spec`` and return once it answers ``/ready``.

        Raises:
            ServerStartError: it could not start, exited first (the message has its last
                output lines) or was not ready in time; nothing is left running.
        """

    @abstractmethod
    async def stop(self, endpoint: Endpoint) -> None:
        """Stop a server this provider started (no error if it is already gone)."""

    @abstractmethod
    async def alive(self, endpoint: Endpoint) -> bool:
        """The server's process or container is still running."""

    @abstractmethod
    def logs(self, endpoint: Endpoint, lines: int = 50) -> str:
        """The last ``lines`` lines the server printed (``""`` if none are kept)."""

    @property
    @abstractmethod
    def endpoints(self) -> list[Endpoint]:
        """The servers started and not stopped yet."""

    @property
    def running(self) -> list[str]:
        """The ids of :attr:`endpoints`."""
        return [endpoint.id for endpoint in self.endpoints]

    async def wait_ready(self, endpoint: Endpoint, timeout: float | None = None) -> None:
        """Wait until ``endpoint`` answers ``/ready`` with 200.

        Raises:
            ServerStartError: the server stopped running (with its last output), or did not
                become ready within ``timeout`` (default: the provider's startup timeout).
        """
        limit = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        async with probe_client(self.http_headers()) as http:
            while True:
                if not await self.alive(endpoint):
                    raise self._not_ready(endpoint, "is not running")
                if await answers(endpoint.url, READY, http=http):
                    return
                if time.monotonic() >= deadline:
                    raise self._not_ready(endpoint, f"was not ready within {limit:g} s")
                await asyncio.sleep(0.05)

    def _not_ready(self, endpoint: Endpoint, why: str) -> ServerStartError:
        output = self.logs(endpoint)
        return ServerStartError(
            f"server {endpoint.id} at {endpoint.url} {why}"
            + (f"; last output lines:\n{output}" if output else ""),
            details={"url": endpoint.url, "id": endpoint.id, "output": output},
        )

    async def healthy(self, endpoint: Endpoint, timeout: float = 2.0) -> bool:
        """The server is running and answers ``/health`` with 200 within ``timeout``."""
        if not await self.alive(endpoint):
            return False
        return await answers(endpoint.url, headers=self.http_headers(), timeout=timeout)

    async def close(self) -> None:
        """Stop every server this provider started; later starts are refused."""
        self._closed = True
        endpoints = self.endpoints
        if endpoints:
            await asyncio.gather(*(self.stop(e) for e in endpoints), return_exceptions=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def sync(self) -> SyncProvider:
        """The blocking twin of this provider: same methods, same errors."""
        return SyncProvider(self)


class SyncProvider(BlockingTwin[Provider]):
    """A blocking face of a :class:`Provider` (see :meth:`Provider.sync`).

    Each call runs the async method on corral's private background loop, so it works in
    plain scripts, in threads and inside a running loop (Jupyter) alike.
    """

    @property
    def provider(self) -> Provider:
        """The async provider this twin drives."""
        return self._async

    def start(self, spec: SpecLike, **options: Any) -> Endpoint:
        """Start a server; see :meth:`Provider.start` (``options`` are provider-specific)."""
        start: Any = self._async.start
        endpoint: Endpoint = self._call(start(spec, **options))
        return endpoint

    def stop(self, endpoint: Endpoint) -> None:
        """Stop a server; see :meth:`Provider.stop`."""
        self._call(self._async.stop(endpoint))

    def wait_ready(self, endpoint: Endpoint, timeout: float | None = None) -> None:
        """Wait for ``/ready``; see :meth:`Provider.wait_ready`."""
        self._call(self._async.wait_ready(endpoint, timeout))

    def alive(self, endpoint: Endpoint) -> bool:
        """See :meth:`Provider.alive`."""
        return self._call(self._async.alive(endpoint))

    def healthy(self, endpoint: Endpoint, timeout: float = 2.0) -> bool:
        """See :meth:`Provider.healthy`."""
        return self._call(self._async.healthy(endpoint, timeout))

    def logs(self, endpoint: Endpoint, lines: int = 50) -> str:
        """See :meth:`Provider.logs`."""
        return self._async.logs(endpoint, lines)

    @property
    def endpoints(self) -> list[Endpoint]:
        """See :attr:`Provider.endpoints`."""
        return self._async.endpoints

    @property
    def running(self) -> list[str]:
        """See :attr:`Provider.running`."""
        return self._async.running

    def close(self) -> None:
        """Stop every server; see :meth:`Provider.close`."""
        self._call(self._async.close())
