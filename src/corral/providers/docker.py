"""Environment servers in Docker containers, and building their images.

:class:`DockerProvider` runs an environment image (see :mod:`corral.providers.dockerfile`)
with corral's labels, CPU / memory / process limits, a health check and a hardened
runtime (no capabilities, no new privileges, read-only root with a private ``/tmp``).
The host port is never guessed:

* bridge networking publishes the server's port on 127.0.0.1 with a host port the
  engine assigns, read back from the container;
* host networking makes the server bind port 0 on 127.0.0.1 and reads the port it
  announces (``CORRAL_LISTENING <url>``) from the container's output.

A container that exits before it is ready produces a :class:`ServerStartError` carrying
its exit code and last log lines as soon as the exit is seen, not after a timeout.
Containers a provider started are removed on :meth:`DockerProvider.stop`, on
:meth:`~DockerProvider.close`, on context exit, when the provider is garbage-collected and at
interpreter exit; when the process is killed outright, its guardian
(:mod:`corral.providers.guardian`) removes them, and any that remain (a guardian killed too)
are reaped by the next provider on the machine.

:class:`DockerProvider` is a :class:`~corral.providers.base.Provider`: async, with the
blocking twin :meth:`~corral.providers.base.Provider.sync`.

Needs the ``docker`` extra (``pip install corral[docker]``).

One module (~700 lines) because starting, watching, limiting and sweeping containers share
the one engine client, label scheme and finalizer of a provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx

from corral.auth import TOKEN_ENV
from corral.errors import ServerStartError
from corral.providers.base import Endpoint, Provider, ServerSpec, SpecLike
from corral.providers.dockerfile import (
    LABEL_PREFIX,
    STAGE_LABEL,
    URL_FILE,
    BuildContext,
    BuildError,
    Progress,
    healthcheck_command,
    image_tag,
    prepare_context,
)
from corral.providers.guardian import guardian
from corral.providers.manifest import ManifestError, load_manifest

try:
    import docker
    import docker.errors
    from docker.models.containers import Container
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Docker provider needs the docker SDK: pip install 'corral[docker]'"
    ) from exc

MANAGED = f"{LABEL_PREFIX}.managed"
OWNER_PID = f"{LABEL_PREFIX}.owner_pid"
OWNER_BOOT = f"{LABEL_PREFIX}.owner_boot"
LISTENING = re.compile(r"CORRAL_LISTENING (http://\S+)")

Network = Literal["bridge", "host"]


def _boot_id() -> str:
    """This machine's boot id: owner pids are only meaningful on the same boot of the host."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def docker_client(**kwargs: Any) -> docker.DockerClient:
    """A Docker client from the environment (``DOCKER_HOST`` ...), API version negotiated.

    Raises:
        ServerStartError: no engine answers; the message says how to start one.
    """
    try:
        client = docker.from_env(version="auto", **kwargs)
        client.ping()
    except docker.errors.DockerException as exc:
        raise ServerStartError(
            f"no Docker engine answers ({exc}); start dockerd (or run .ci/docker-setup.sh) "
            "and check that DOCKER_HOST points at it",
            details={"reason": str(exc)},
        ) from None
    return client


def reap_orphans(client: docker.DockerClient) -> list[str]:
    """Remove corral containers whose owning process on this machine is gone.

    A process killed with SIGKILL runs no cleanup; its containers carry its pid and the
    machine's boot id, so any later provider can tell they are orphans.

    Returns:
        The ids of the containers removed.
    """
    boot = _boot_id()
    removed: list[str] = []
    for container in client.containers.list(all=True, filters={"label": f"{MANAGED}=true"}):
        labels = container.labels
        try:
            pid = int(labels.get(OWNER_PID, ""))
        except ValueError:
            continue
        if labels.get(OWNER_BOOT) != boot or _pid_alive(pid):
            continue
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)
            removed.append(container.id or "")
    return removed


@dataclass(frozen=True)
class DockerEndpoint(Endpoint):
    """A running environment server in a container.

    Attributes:
        url: the server's base URL on the host (``http://127.0.0.1:PORT``).
        host: the host address.
        port: the host port.
        container_id: the container's id.
        image: the image it runs.
        network: ``bridge`` or ``host``.
    """

    container_id: str = ""
    image: str = ""
    network: Network = "bridge"

    @property
    def id(self) -> str:
        """The container's id."""
        return self.container_id


T = TypeVar("T")


async def _owned_in_thread(start: Callable[[], T], undo: Callable[[T], None]) -> T:
    """Run the blocking ``start`` in a thread; if the caller is cancelled, ``undo`` its result.

    A cancelled await cannot stop the thread: whatever it starts is handed to ``undo``
    (in another thread) once it finishes, so a cancelled start leaves nothing running.
    """
    future = asyncio.get_running_loop().run_in_executor(None, start)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def cleanup(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                threading.Thread(target=undo, args=(done.result(),), daemon=True).start()

        future.add_done_callback(cleanup)
        raise


def _nanoseconds(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _host_command(cmd: Sequence[str]) -> list[str]:
    """The image's ``corral serve`` command, made to bind port 0 on loopback."""
    args = list(cmd)
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
        if flag not in args or args.index(flag) + 1 >= len(args):
            raise ServerStartError(
                f"the image's command {args} has no {flag} option, so host networking cannot "
                "move it to a free port; use bridge networking or pass command=",
                details={"command": args},
            )
        args[args.index(flag) + 1] = value
    if "--port-file" not in args:
        args += ["--port-file", URL_FILE]
    return args


class DockerProvider(Provider):
    """Start environment servers in Docker containers.

    Args:
        client: a Docker client (default: :func:`docker_client`).
        network: ``"bridge"`` (a published port on 127.0.0.1) or ``"host"``.
        startup_timeout: seconds to wait for ``/ready`` before giving up.
        log_lines: how many of a failed container's last log lines an error carries.
        read_only: mount the container's root filesystem read-only (``/tmp`` stays
            writable, in memory).
        labels: extra labels for every container.
        reap: remove orphaned corral containers of dead processes on this machine first.
        guard: have the process's guardian remove this process's containers if it is
            killed outright.
        token: the bearer token servers require, passed to containers as
            ``$CORRAL_TOKEN`` (default: ``$CORRAL_TOKEN`` if set here).
    """

    kind = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        network: Network = "bridge",
        startup_timeout: float = 60.0,
        log_lines: int = 50,
        read_only: bool = True,
        labels: Mapping[str, str] | None = None,
        reap: bool = True,
        guard: bool = True,
        token: str | None = None,
    ) -> None:
        if network not in ("bridge", "host"):
            raise ValueError(f"network must be 'bridge' or 'host', not {network!r}")
        super().__init__(startup_timeout=startup_timeout, token=token)
        self.client = client or docker_client()
        self.network: Network = network
        self.log_lines = log_lines
        self.read_only = read_only
        self.labels = dict(labels or {})
        self._containers: dict[str, Container] = {}
        self._endpoints: dict[str, DockerEndpoint] = {}
        self._lock = threading.Lock()
        if reap:
            reap_orphans(self.client)
        if guard:
            guardian().watch_containers(
                {MANAGED: "true", OWNER_PID: str(os.getpid()), OWNER_BOOT: _boot_id()}
            )
        # Runs on close(), when the provider is garbage-collected, or at interpreter exit,
        # whichever comes first; it holds the container table, not the provider.
        self._finalizer = weakref.finalize(
            self, _remove_all, self._containers, self._endpoints, self._lock
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(
        self,
        spec: SpecLike,
        *,
        cpu: float | None = None,
        memory: int | str | None = None,
        pids: int | None = None,
        environment: Mapping[str, str] | None = None,
        name: str | None = None,
        command: Sequence[str] | None = None,
        port: int | None = None,
        network: Network | None = None,
        timeout: float | None = None,
    ) -> DockerEndpoint:
        """Run an image and return once its server answers ``/ready``.

        ``spec`` names an image tag, or an environment directory whose image ``corral
        build`` made (``corral-NAME:VERSION``). Limits default to the spec's, then to the
        image's ``org.corral.cpu/memory/pids`` labels (the manifest's resources); the
        container port to its ``org.corral.port`` label. The keyword options override
        the spec.

        Args:
            spec: the image (or environment directory) and its limits.
            cpu: CPUs (``0.5`` = half a core).
            memory: memory limit in bytes, or a Docker size string (``"512m"``); swap is
                not allowed beyond it.
            pids: maximum processes and threads.
            environment: extra environment variables.
            name: the container's name (default: chosen by the engine).
            command: overrides the image's command.
            port: the server's port inside the container (bridge networking).
            network: overrides the provider's networking.
            timeout: overrides the provider's startup timeout.

        Raises:
            ServerStartError: the image is missing, the container exited before it was
                ready (the message has its last log lines), or ``/ready`` never answered.
                A cancelled start removes its container too.
        """
        self._check_open()
        server = ServerSpec.of(spec)
        image = _image_of(server)
        run = functools.partial(
            self._start_blocking,
            image,
            cpu=cpu if cpu is not None else server.cpu,
            memory=memory if memory is not None else server.memory,
            pids=pids if pids is not None else server.pids,
            environment={**server.environment, **(environment or {})},
            name=name,
            command=command,
            extra_args=server.serve_args(owned=True),
            port=port,
            network=network,
            timeout=timeout if timeout is not None else server.startup_timeout,
        )
        endpoint = await _owned_in_thread(run, self._stop_blocking)
        if self.closed:
            await asyncio.to_thread(self._stop_blocking, endpoint)
            self._check_open()
        return endpoint

    def _start_blocking(
        self,
        image: str,
        *,
        cpu: float | None = None,
        memory: int | str | None = None,
        pids: int | None = None,
        environment: Mapping[str, str] | None = None,
        name: str | None = None,
        command: Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        network: Network | None = None,
        timeout: float | None = None,
    ) -> DockerEndpoint:
        """:meth:`start`'s work, blocking (run in a thread)."""
        self._check_open()
        mode = network or self.network
        try:
            image_obj = self.client.images.get(image)
        except docker.errors.ImageNotFound:
            raise ServerStartError(
                f"image {image!r} not found; build it with 'corral build --tag {image}'",
                details={"image": image},
            ) from None
        labels: dict[str, str] = image_obj.labels or {}
        config = image_obj.attrs.get("Config") or {}
        container_port = port or int(labels.get(f"{LABEL_PREFIX}.port", "8000"))
        cpus = cpu if cpu is not None else float(labels.get(f"{LABEL_PREFIX}.cpu", "1"))
        mem: int | str = (
            memory if memory is not None else int(labels.get(f"{LABEL_PREFIX}.memory", 2**30))
        )
        pid_limit = pids if pids is not None else int(labels.get(f"{LABEL_PREFIX}.pids", "1024"))
        env = {"CORRAL_PORT": str(container_port), **(environment or {})}
        if self.token is not None:
            env.setdefault(TOKEN_ENV, self.token)
        run_command: list[str] | None = list(command) if command is not None else None
        if extra_args:
            # Later options win: the spec's limits override those baked into the image.
            run_command = [*(run_command or config.get("Cmd") or []), *extra_args]
        kwargs: dict[str, Any] = {}
        if mode == "host":
            kwargs["network_mode"] = "host"
            run_command = _host_command(run_command or config.get("Cmd") or [])
        else:
            kwargs["ports"] = {f"{container_port}/tcp": ("127.0.0.1", None)}
        container_labels = {
            **self.labels,
            MANAGED: "true",
            OWNER_PID: str(os.getpid()),
            OWNER_BOOT: _boot_id(),
            f"{LABEL_PREFIX}.image": image,
        }
        try:
            container = self.client.containers.run(
                image,
                command=run_command,
                detach=True,
                name=name,
                labels=container_labels,
                environment=env,
                nano_cpus=int(cpus * 1e9),
                mem_limit=mem,
                memswap_limit=mem,
                pids_limit=pid_limit,
                init=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=self.read_only,
                tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
                healthcheck={
                    "test": ["CMD", *healthcheck_command()],
                    "interval": _nanoseconds(5),
                    "timeout": _nanoseconds(3),
                    "retries": 3,
                    "start_period": _nanoseconds(min(self.startup_timeout, 30)),
                },
                **kwargs,
            )
        except docker.errors.APIError as exc:
            raise ServerStartError(
                f"the engine refused to run {image!r}: {exc.explanation or exc}",
                details={"image": image},
            ) from None
        with self._lock:
            self._containers[container.id or ""] = container
        try:
            endpoint = self._wait(container, image, mode, container_port, timeout)
        except BaseException:
            self._remove(container)
            raise
        with self._lock:
            self._endpoints[endpoint.container_id] = endpoint
        return endpoint

    def _wait(
        self,
        container: Container,
        image: str,
        mode: Network,
        container_port: int,
        timeout: float | None,
    ) -> DockerEndpoint:
        deadline = time.monotonic() + (timeout if timeout is not None else self.startup_timeout)
        url: str | None = None
        with httpx.Client(timeout=1.0, trust_env=False, headers=self.http_headers()) as http:
            while True:
                container.reload()
                state = container.attrs.get("State", {})
                if state.get("Status") in ("exited", "dead"):
                    raise self._failure(container, image, state)
                if url is None:
                    url = self._url(container, mode, container_port)
                if url is not None:
                    with contextlib.suppress(httpx.HTTPError):
                        if http.get(f"{url}/ready").status_code == 200:
                            port = int(url.rsplit(":", 1)[1])
                            return DockerEndpoint(
                                url=url,
                                host="127.0.0.1",
                                port=port,
                                container_id=container.id or "",
                                image=image,
                                network=mode,
                            )
                if time.monotonic() >= deadline:
                    what = "did not answer /ready" if url else "never announced its port"
                    raise self._failure(container, image, state, why=f"{what} in time")
                time.sleep(0.1)

    def _url(self, container: Container, mode: Network, container_port: int) -> str | None:
        if mode == "host":
            found = LISTENING.search(
                container.logs(stdout=True, stderr=True).decode(errors="replace")
            )
            if found is None:
                return None
            return found.group(1).replace("0.0.0.0", "127.0.0.1")
        ports = (container.attrs.get("NetworkSettings") or {}).get("Ports") or {}
        bindings = ports.get(f"{container_port}/tcp") or []
        for binding in bindings:
            if binding.get("HostPort"):
                return f"http://127.0.0.1:{binding['HostPort']}"
        return None

    def _failure(
        self,
        container: Container,
        image: str,
        state: Mapping[str, Any],
        why: str | None = None,
    ) -> ServerStartError:
        output = self.logs(container.id or "", lines=self.log_lines)
        if why is None:
            why = f"exited with code {state.get('ExitCode')}"
            if state.get("OOMKilled"):
                why += " (killed: out of memory; raise resources.memory)"
            elif state.get("Error"):
                why += f" ({state['Error']})"
        return ServerStartError(
            f"container {container.short_id} of {image!r} {why}"
            + (f"; last log lines:\n{output}" if output else "; it printed nothing"),
            details={
                "image": image,
                "container_id": container.id,
                "exit_code": state.get("ExitCode"),
                "output": output,
            },
        )

    def logs(self, endpoint: Endpoint | str, lines: int = 50) -> str:
        """The last ``lines`` lines of a container's output ("" if it is gone)."""
        container_id = endpoint if isinstance(endpoint, str) else endpoint.id
        try:
            container = self.client.containers.get(container_id)
            raw: bytes = container.logs(stdout=True, stderr=True, tail=lines)
        except docker.errors.NotFound:
            return ""
        return raw.decode("utf-8", errors="replace").rstrip()

    async def stop(self, endpoint: Endpoint | str, timeout: float = 5.0) -> None:
        """Stop and remove a container this provider started (no error if already gone)."""
        await asyncio.to_thread(self._stop_blocking, endpoint, timeout)

    def _stop_blocking(self, endpoint: Endpoint | str, timeout: float = 5.0) -> None:
        container_id = endpoint if isinstance(endpoint, str) else endpoint.id
        with self._lock:
            container = self._containers.get(container_id)
        if container is None:
            return
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.stop(timeout=max(0, int(timeout)))
        self._remove(container)

    def _remove(self, container: Container) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)
        with self._lock:
            self._containers.pop(container.id or "", None)
            self._endpoints.pop(container.id or "", None)

    async def alive(self, endpoint: Endpoint) -> bool:
        """The container is running."""
        return await asyncio.to_thread(self._alive_blocking, endpoint.id)

    def _alive_blocking(self, container_id: str) -> bool:
        with self._lock:
            container = self._containers.get(container_id)
        if container is None:
            return False
        try:
            container.reload()
        except (docker.errors.NotFound, docker.errors.APIError):
            return False
        return bool(container.attrs.get("State", {}).get("Status") == "running")

    @property
    def endpoints(self) -> list[Endpoint]:
        """The containers started, ready, and not removed yet."""
        with self._lock:
            return list(self._endpoints.values())

    @property
    def running(self) -> list[str]:
        """Ids of the containers this provider started and has not removed (ready or not)."""
        with self._lock:
            return list(self._containers)

    async def close(self) -> None:
        """Remove every container this provider started; later starts are refused."""
        self._closed = True
        await asyncio.to_thread(self._finalizer)


def _image_of(spec: ServerSpec) -> str:
    """The image a spec names: its target, or the image of the environment it names."""
    try:
        manifest = spec.manifest()
    except ManifestError as exc:
        raise ServerStartError(str(exc), details={"target": spec.target}) from None
    return image_tag(manifest) if manifest is not None else spec.target


def _remove_all(
    containers: dict[str, Container], endpoints: dict[str, DockerEndpoint], lock: threading.Lock
) -> None:
    """Force-remove every container in ``containers`` (the provider's cleanup)."""
    with lock:
        pending = list(containers.values())
        containers.clear()
        endpoints.clear()
    for container in pending:
        with contextlib.suppress(Exception):
            container.remove(force=True)


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class BuiltImage:
    """The result of :func:`build_image`.

    Attributes:
        tag: the image's tag.
        image_id: the engine's image id.
        context: the prepared build context.
        seconds: how long preparing and building took.
    """

    tag: str
    image_id: str
    context: BuildContext
    seconds: float


def _build_lines(
    events: Iterator[dict[str, Any]], progress: Progress | None
) -> tuple[str, list[str]]:
    image_id = ""
    tail: list[str] = []
    for event in events:
        if "error" in event:
            detail = event.get("errorDetail", {}).get("message") or event["error"]
            raise BuildError(
                f"docker build failed: {str(detail).strip()}\n"
                + "\n".join(f"    {line}" for line in tail[-20:])
            )
        if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
            image_id = str(event["aux"]["ID"])
        text = event.get("stream") or _pull_status(event)
        for line in str(text).splitlines():
            if line.strip():
                tail = [*tail[-39:], line.rstrip()]
                if progress is not None:
                    progress(line.rstrip())
    return image_id, tail


def _pull_status(event: dict[str, Any]) -> str:
    """A pull event as one line: ``<layer>: Downloading [==>   ] 12.1MB/50.2MB``."""
    status = str(event.get("status") or "")
    layer = event.get("id")
    detail = event.get("progress")
    return " ".join(str(part) for part in (f"{layer}:" if layer else "", status, detail) if part)


def _ensure_base_image(
    engine: docker.DockerClient, base_image: str, progress: Progress | None
) -> None:
    """Pull ``base_image`` unless present, with a clear error where no registry answers."""
    try:
        engine.images.get(base_image)
        return
    except docker.errors.ImageNotFound:
        pass
    if progress is not None:
        progress(f"base image {base_image} is not present; pulling it")
    repository, _, tag = base_image.rpartition(":") if ":" in base_image else (base_image, "", "")
    try:
        events = engine.api.pull(
            repository or base_image, tag=tag or None, stream=True, decode=True
        )
        _build_lines(events, progress)
    except (docker.errors.APIError, BuildError) as exc:
        reason = exc.explanation if isinstance(exc, docker.errors.APIError) else str(exc)
        raise BuildError(
            f"base image {base_image!r} is not present and cannot be pulled ({reason}); "
            "build one locally (.ci/docker-setup.sh makes corral-base:bookworm) and pass "
            "--base-image, or set base_image in corral.yaml"
        ) from None


def build_image(
    env_dir: str | Path,
    tag: str | None = None,
    *,
    base_image: str | None = None,
    offline: bool = True,
    progress: Progress | None = None,
    context_dir: str | Path | None = None,
    client: docker.DockerClient | None = None,
    pip: Sequence[str] | None = None,
    prune: bool = True,
) -> BuiltImage:
    """Prepare the build context of ``env_dir`` and build its image with the engine.

    Args:
        env_dir: the environment's directory.
        tag: the image tag (default :func:`~corral.providers.dockerfile.image_tag`:
            ``corral-<name>:<version>``).
        base_image: overrides the manifest's base image.
        offline: download every wheel on the host; the image installs with ``--no-index``.
        progress: receives every line of output (wheel builds, resolution, docker build).
        context_dir: where to write the build context (default ``<env>/.corral/build``).
        client: a Docker client (default: :func:`docker_client`).
        pip: the pip command used on the host.
        prune: remove the intermediate install stage's image afterwards.

    Raises:
        ManifestError: the manifest is missing or invalid.
        BuildError: a wheel, the resolution or the docker build failed (with the output).
    """
    started = time.monotonic()
    env_path = Path(env_dir).resolve()
    engine = client or docker_client()
    # The base image first: a missing one fails in a second, not after resolving wheels.
    _ensure_base_image(engine, base_image or load_manifest(env_path).image_base, progress)
    context = prepare_context(
        env_path,
        Path(context_dir) if context_dir is not None else env_path / ".corral" / "build",
        base_image=base_image,
        offline=offline,
        progress=progress,
        pip=pip,
    )
    name = tag or image_tag(context.manifest)
    try:
        events = engine.api.build(
            path=str(context.directory),
            tag=name,
            rm=True,
            forcerm=True,
            decode=True,
            pull=False,
        )
        image_id, _ = _build_lines(events, progress)
    except docker.errors.APIError as exc:
        raise BuildError(f"docker build failed: {exc.explanation or exc}") from None
    if not image_id:
        image_id = engine.images.get(name).id or ""
    if prune:
        # The install stage's image holds the wheels; nothing but this build uses it.
        with contextlib.suppress(docker.errors.APIError):
            engine.images.prune(filters={"dangling": True, "label": f"{STAGE_LABEL}=install"})
    return BuiltImage(
        tag=name, image_id=image_id, context=context, seconds=time.monotonic() - started
    )
