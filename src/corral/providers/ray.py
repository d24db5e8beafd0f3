"""Environment servers as Ray actors, placed by the trainer's own Ray cluster.

    async with RayProvider(num_cpus=2) as provider:          # inside ray.init(...) or not
        endpoint = await provider.start("corral.envs.echo:EchoEnv")
        async with AsyncEnvClient(endpoint.url) as env:      # straight to the server
            ...

Each server is one Ray actor that runs ``corral serve`` on the node Ray placed it on
(through a :class:`~corral.providers.local.LocalProcessProvider` inside the actor: its
socket handling, limits, sandbox and guardian) and reports the URL; clients connect to
the server directly over corral/1, never through Ray's object store. Placement is Ray's:
``num_cpus``, ``memory``, custom ``resources``, a ``placement_group`` bundle or any
``scheduling_strategy``; corral schedules nothing itself.

The actors are not detached: they die with the driver that created them (Ray's fate
sharing), and their servers with them (the actor's guardian stops the server when the
actor process is killed). A dead actor is seen at once: each actor has a call in flight
that only returns when its server exits, so an actor that dies fails it with
``RayActorError`` and :meth:`RayProvider.alive` turns false; a client of the server gets
``ConnectionLost``/``SessionLost`` and an ``EnvPool`` replaces the server.

Inside an existing ``ray.init()`` (the trainer's cluster) the provider uses it; otherwise
it starts a local Ray (no dashboard). The servers bind the node's IP address (Ray's
``get_node_ip_address``), so that the driver reaches them from another node; ``host=``
overrides it (``127.0.0.1`` for a single machine). A server reachable from other nodes
should require a bearer token (``token=`` or ``$CORRAL_TOKEN``).

Needs ``pip install 'corral[ray]'`` on the driver and corral on every node (the cluster's
image, or ``runtime_env={"pip": [...]}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

try:
    import ray
    from ray.exceptions import RayActorError, RayError
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the Ray provider needs Ray: pip install 'corral[ray]'") from exc

from corral.errors import ServerStartError
from corral.providers.base import Endpoint, Provider, ServerSpec, SpecLike
from corral.runtime import wait_event, wait_for


@dataclass(frozen=True)
class RayEndpoint(Endpoint):
    """A server in a Ray actor.

    Attributes:
        actor_id: the actor's id (hex).
        node_id: the node it runs on (hex).
        node_ip: that node's IP address.
        pid: the server's process id on that node.
    """

    actor_id: str = ""
    node_id: str = ""
    node_ip: str = ""
    pid: int = 0

    @property
    def id(self) -> str:
        """The actor's id."""
        return self.actor_id


class ServerActor:
    """The actor hosting one server (see the module docstring); Ray makes it remote."""

    def __init__(self, host: str | None, token: str | None, options: Mapping[str, Any]) -> None:
        from corral.providers.local import LocalProcessProvider

        self.host = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.provider = LocalProcessProvider(host=self.host, token=token, **options)
        self.endpoint: Any = None
        self.exited = asyncio.Event()

    async def start(self, spec: ServerSpec) -> dict[str, Any]:
        """Start the server; return what the driver's endpoint needs."""
        self.endpoint = await self.provider.start(spec)
        context = ray.get_runtime_context()
        return {
            "url": self.endpoint.url,
            "host": self.endpoint.host,
            "port": self.endpoint.port,
            "actor_id": context.get_actor_id() or "",
            "node_id": context.get_node_id(),
            "node_ip": self.host,
            "pid": self.endpoint.pid,
        }

    async def wait_exit(self) -> str:
        """Return once the server is no longer running (its last output lines)."""
        while self.endpoint is not None and await self.provider.alive(self.endpoint):
            # The server is a child of this actor: a short poll of its process state.
            await wait_event(self.exited, 0.2)
        return self.logs()

    def logs(self, lines: int = 50) -> str:
        """The server's last output lines."""
        return self.provider.logs(self.endpoint, lines) if self.endpoint is not None else ""

    async def stop(self) -> None:
        """Stop the server."""
        await self.provider.close()
        self.exited.set()


@dataclass(eq=False)
class _Hosted:
    actor: Any
    endpoint: RayEndpoint | None = None
    exit: asyncio.Task[None] | None = None
    dead: bool = False
    logs: str = ""


class RayProvider(Provider):
    """Start each environment server in a Ray actor (see the module docstring).

    Args:
        num_cpus: CPUs each server's actor reserves (Ray's ``num_cpus``).
        memory: bytes of memory each actor reserves (Ray's ``memory``).
        resources: custom Ray resources each actor reserves (``{"env_node": 1}``).
        placement_group: place the actors in this placement group...
        bundle_index: ...in this bundle (-1: any).
        scheduling_strategy: any other Ray scheduling strategy (exclusive with the above).
        runtime_env: the actors' Ray runtime environment.
        host: the address servers bind (default: their node's IP address).
        address: the Ray cluster to join when Ray is not initialised yet (default: a
            running one from ``$RAY_ADDRESS``, else a new local one).
        init_options: more ``ray.init`` keyword arguments for that case.
        local_options: options of the :class:`~corral.providers.local.LocalProcessProvider`
            inside each actor (``sandbox``, ``limits``, ``venv`` ...).
        startup_timeout: seconds a server may take to become ready (actor start included).
        token: the bearer token servers require (default: ``$CORRAL_TOKEN``).
    """

    kind = "ray"

    def __init__(
        self,
        *,
        num_cpus: float = 1.0,
        memory: int | None = None,
        resources: Mapping[str, float] | None = None,
        placement_group: Any = None,
        bundle_index: int = -1,
        scheduling_strategy: Any = None,
        runtime_env: Mapping[str, Any] | None = None,
        host: str | None = None,
        address: str | None = None,
        init_options: Mapping[str, Any] | None = None,
        local_options: Mapping[str, Any] | None = None,
        startup_timeout: float = 120.0,
        token: str | None = None,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout, token=token)
        if placement_group is not None and scheduling_strategy is not None:
            raise ValueError("pass placement_group= or scheduling_strategy=, not both")
        if num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus}")
        self.num_cpus = num_cpus
        self.memory = memory
        self.resources = dict(resources or {})
        self.placement_group = placement_group
        self.bundle_index = bundle_index
        self.scheduling_strategy = scheduling_strategy
        self.runtime_env = dict(runtime_env) if runtime_env is not None else None
        self.host = host
        self.address = address
        self.init_options = dict(init_options or {})
        self.local_options = dict(local_options or {})
        self._hosted: dict[str, _Hosted] = {}
        self._actor_class: Any = None

    def _actor_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            # A restarted actor would be a new server without the sessions: never restart,
            # report the death and let the pool start another.
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        if self.memory is not None:
            options["memory"] = self.memory
        if self.resources:
            options["resources"] = self.resources
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        if self.placement_group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=self.bundle_index,
            )
        elif self.scheduling_strategy is not None:
            options["scheduling_strategy"] = self.scheduling_strategy
        return options

    def _ensure_ray(self) -> Any:
        if not ray.is_initialized():
            options = {"include_dashboard": False, "log_to_driver": False, **self.init_options}
            ray.init(address=self.address or os.environ.get("RAY_ADDRESS"), **options)
        if self._actor_class is None:
            self._actor_class = ray.remote(ServerActor)
        return self._actor_class

    async def start(self, spec: SpecLike) -> RayEndpoint:
        """Start a server in a new actor and return once it answers ``/ready``.

        Raises:
            ServerStartError: Ray could not place or start the actor, the server failed
                (the message has its last output lines) or was not ready in time; the
                actor is killed.
        """
        self._check_open()
        server = ServerSpec.of(spec)
        actor_class = await asyncio.to_thread(self._ensure_ray)
        timeout = server.startup_timeout or self.startup_timeout
        actor = actor_class.options(**self._actor_options()).remote(
            self.host, self.token, self.local_options
        )
        hosted = _Hosted(actor)
        try:
            try:
                info = await wait_for(_ray_await(actor.start.remote(server)), timeout)
            except TimeoutError:
                raise ServerStartError(
                    f"the Ray actor for {server.target!r} was not placed and ready within "
                    f"{timeout:g} s (does the cluster have {self._actor_options()}?)",
                    details={"target": server.target},
                ) from None
            except RayError as exc:
                raise ServerStartError(
                    f"the Ray actor could not start a server for {server.target!r}: {_cause(exc)}",
                    details={"target": server.target},
                ) from None
            endpoint = RayEndpoint(**info)
            hosted.endpoint = endpoint
            self._hosted[endpoint.actor_id] = hosted
            hosted.exit = asyncio.create_task(self._watch(hosted), name="corral-ray-exit")
            await self.wait_ready(endpoint, timeout)
        except BaseException:
            await asyncio.shield(self._discard(hosted))
            raise
        if self.closed:
            await self._discard(hosted)
            self._check_open()
        return endpoint

    async def _watch(self, hosted: _Hosted) -> None:
        """Wait for the server's exit, or the actor's death; then mark it dead."""
        try:
            hosted.logs = await _ray_await(hosted.actor.wait_exit.remote())
        except RayActorError:
            hosted.logs = hosted.logs or "(the Ray actor died)"
        except RayError as exc:
            hosted.logs = str(exc)
        hosted.dead = True

    async def _discard(self, hosted: _Hosted) -> None:
        if hosted.endpoint is not None:
            self._hosted.pop(hosted.endpoint.actor_id, None)
        if hosted.endpoint is not None and not hosted.dead:
            # A graceful stop first (the server's SIGTERM); an actor that never started
            # (not placed, or its start failed) is only killed.
            with contextlib.suppress(RayError, TimeoutError):
                await wait_for(_ray_await(hosted.actor.stop.remote()), 15)
        with contextlib.suppress(RayError, ValueError):
            ray.kill(hosted.actor, no_restart=True)
        if hosted.exit is not None:
            hosted.exit.cancel()
            await asyncio.gather(hosted.exit, return_exceptions=True)

    def _hosted_of(self, endpoint: Endpoint) -> _Hosted | None:
        return self._hosted.get(endpoint.id) if isinstance(endpoint, RayEndpoint) else None

    async def stop(self, endpoint: Endpoint) -> None:
        """Stop the server and kill its actor (no error if it is already gone)."""
        hosted = self._hosted_of(endpoint)
        if hosted is not None:
            await self._discard(hosted)

    async def alive(self, endpoint: Endpoint) -> bool:
        """The actor lives and its server runs (no call to the actor: its exit is watched)."""
        hosted = self._hosted_of(endpoint)
        return hosted is not None and not hosted.dead

    def logs(self, endpoint: Endpoint, lines: int = 50) -> str:
        """The server's last output lines, as of its exit (see :meth:`fetch_logs`)."""
        hosted = self._hosted_of(endpoint)
        return "\n".join(hosted.logs.splitlines()[-lines:]) if hosted is not None else ""

    async def fetch_logs(self, endpoint: Endpoint, lines: int = 50) -> str:
        """The server's last output lines, asked from its actor now."""
        hosted = self._hosted_of(endpoint)
        if hosted is None or hosted.dead:
            return self.logs(endpoint, lines)
        text: str = await _ray_await(hosted.actor.logs.remote(lines))
        return text

    def actor(self, endpoint: Endpoint) -> Any:
        """The Ray actor handle hosting ``endpoint``'s server (None if it is not this one's)."""
        hosted = self._hosted_of(endpoint)
        return hosted.actor if hosted is not None else None

    @property
    def endpoints(self) -> list[Endpoint]:
        """The servers started and not stopped."""
        return [h.endpoint for h in self._hosted.values() if h.endpoint is not None]

    async def close(self) -> None:
        """Stop every server and kill every actor this provider started."""
        self._closed = True
        await asyncio.gather(
            *(self._discard(h) for h in list(self._hosted.values())), return_exceptions=True
        )


async def _ray_await(ref: Any) -> Any:
    """Await a Ray ObjectRef on the running loop."""
    return await asyncio.wrap_future(ref.future())


def _cause(exc: BaseException) -> str:
    """The innermost message of a Ray task error (the server's own error, with its output)."""
    cause = getattr(exc, "cause", None)
    return str(cause) if cause is not None else str(exc)
