"""Environment servers in local processes: corral's embedded default provider.

    async with LocalProcessProvider() as provider:
        endpoint = await provider.start("corral.envs.echo:EchoEnv")

    # An environment directory, in its own virtualenv, limited, sandboxed:
    provider = LocalProcessProvider(venv=True, sandbox="auto", limits=LocalLimits(cpu_seconds=600))
    endpoint = await provider.start("path/to/my_env")

Each server is ``corral serve`` in a child process
(:class:`~corral.client.local_server.LocalServer` is the engine): its own process group,
asked to die with its parent, stopped at interpreter exit, and watched by the process's
guardian (:mod:`corral.providers.guardian`) so that it is stopped even when the parent is
killed with SIGKILL. The provider binds the listening socket itself on 127.0.0.1 and the
server inherits it: the URL is known before the server starts and no port is ever guessed
or raced for.

**Virtualenvs** (``venv=True``): the server runs in a cached virtualenv built from the
environment's ``pyproject.toml`` (see :mod:`corral.providers.venv`).

**Limits** (:class:`LocalLimits`, defaulting to the manifest's ``resources.memory``):
``RLIMIT_DATA`` (heap and private writable mappings: what the server can actually
dirty; address-space reservations such as per-thread malloc arenas do not count, so
thread pools keep working), ``RLIMIT_CPU`` (a budget of CPU seconds; SIGXCPU then
SIGKILL), ``RLIMIT_NOFILE``, ``RLIMIT_NPROC`` (counted per user: only meaningful when
the server runs as a user of its own, never enforced for root) and a niceness. A CPU
*rate* (``resources.cpu``) needs cgroups: the Docker provider enforces it, this one does
not.

**Sandbox** (``sandbox="bwrap" | "unshare" | "auto"``, probed and built by
:mod:`corral.sandbox`, as the coding environment's per-episode sandboxes are): fresh pid,
IPC, UTS, mount *and network* namespaces; a read-only root holding only the system
directories, the interpreter and its packages and the environment's directory (or the
working directory, for an entry point), all read-only; a private writable ``/tmp`` and
``HOME`` (``/workspace``) deleted with the server; no capabilities and
``no_new_privs``; the server's pid 1 dies with the provider.

*No network* means: the sandbox has a network namespace of its own, with nothing but an
unconnected loopback, so the environment's code can reach neither the internet nor any
service on the host, including the host's 127.0.0.1. The server stays reachable because
it does not bind a socket in there: the provider binds it on the host's 127.0.0.1 and
passes it in (socket activation, as systemd's ``PrivateNetwork=`` services do); a socket
keeps the namespace it was created in. The server runs with the provider's uid (it must
read the environment where it lies), without capabilities; the coding environment's
per-episode sandboxes additionally switch to leased uids.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.auth import TOKEN_ENV
from corral.client.local_server import LocalServer, ServerProcess
from corral.client.warm_start import ChildSetup
from corral.errors import ServerStartError
from corral.providers.base import Endpoint, Provider, ServerSpec, SpecLike
from corral.providers.dockerfile import BuildError, Progress
from corral.providers.guardian import guardian
from corral.providers.manifest import Manifest, ManifestError, parse_memory
from corral.providers.venv import ensure_venv
from corral.sandbox import (
    MountEntry,
    SandboxError,
    SandboxMode,
    SandboxProfile,
    Workspace,
    resolve_profile,
    sandbox_command,
)
from corral.sandbox.command import SANDBOX_PATH
from corral.sandbox.workspace import path_under, with_parent_dirs
from corral.server.serve import bind_socket

Sandbox = Literal["none", "auto", "bwrap", "unshare"]
"""How a local server is isolated: not at all, or a namespace sandbox."""


@dataclass(frozen=True)
class LocalLimits:
    """Resource limits of a local server (None: not limited).

    Attributes:
        memory: bytes (or ``"512Mi"``) of heap and private writable memory (RLIMIT_DATA).
        cpu_seconds: CPU seconds the server may use in its lifetime (RLIMIT_CPU).
        max_processes: processes and threads of the server's user (RLIMIT_NPROC).
        max_open_files: open file descriptors (RLIMIT_NOFILE).
        nice: scheduling niceness added to the server's.
    """

    memory: int | str | None = None
    cpu_seconds: int | None = None
    max_processes: int | None = None
    max_open_files: int | None = None
    nice: int = 0

    def __post_init__(self) -> None:
        if self.memory is not None:
            object.__setattr__(self, "memory", parse_memory(self.memory))
        for name in ("cpu_seconds", "max_processes", "max_open_files"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"LocalLimits.{name} must be a positive integer, not {value!r}")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"LocalLimits.nice must be within 0..19, not {self.nice!r}")

    def rlimits(self) -> dict[int, int]:
        """``{RLIMIT_*: value}`` of the limits that are set."""
        limits: dict[int, int] = {}
        if self.memory is not None:
            assert isinstance(self.memory, int)
            limits[resource.RLIMIT_DATA] = self.memory
        if self.cpu_seconds is not None:
            limits[resource.RLIMIT_CPU] = self.cpu_seconds
        if self.max_processes is not None:
            limits[resource.RLIMIT_NPROC] = self.max_processes
        if self.max_open_files is not None:
            limits[resource.RLIMIT_NOFILE] = self.max_open_files
        return limits

    def setup(self) -> ChildSetup | None:
        """What the server's process applies to itself for these limits (None: nothing).

        The values are computed here, in the parent: the child only makes system calls.
        """
        pairs: list[tuple[int, tuple[int, int]]] = []
        for which, value in self.rlimits().items():
            _, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            # RLIMIT_CPU: SIGXCPU at the soft limit (a clean exit is possible), SIGKILL a
            # second later; the others are hard walls.
            soft = value
            if which == resource.RLIMIT_CPU:
                value = value + 1 if hard == resource.RLIM_INFINITY else min(value + 1, hard)
            pairs.append((which, (soft, value)))
        if not pairs and not self.nice:
            return None
        return ChildSetup(tuple(pairs), self.nice)


@dataclass(frozen=True)
class LocalEndpoint(Endpoint):
    """A server in a local process.

    Attributes:
        pid: the process the provider started (with a sandbox: bwrap or unshare).
        target: what it serves (an entry point or an environment directory).
        python: the interpreter it runs.
        sandbox: ``none``, ``bwrap`` or ``unshare``.
    """

    pid: int = 0
    target: str = ""
    python: str = ""
    sandbox: str = "none"

    @property
    def id(self) -> str:
        """The process id, as text."""
        return str(self.pid)


@functools.cache
def interpreter_paths(python: str) -> tuple[str, ...]:
    """Every directory ``python`` imports from: prefixes and ``sys.path`` (site included).

    Raises:
        ServerStartError: the interpreter does not run.
    """
    script = (
        "import json, sys; "
        "print(json.dumps([sys.prefix, sys.exec_prefix, sys.base_prefix, *sys.path]))"
    )
    try:
        out = subprocess.run(
            [python, "-c", script], capture_output=True, text=True, timeout=30, check=True, cwd="/"
        ).stdout
        paths = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise ServerStartError(f"cannot run the interpreter {python!r}: {exc}") from None
    seen: dict[str, None] = {}
    for path in paths:
        if isinstance(path, str) and path and os.path.isdir(path):
            seen[os.path.realpath(path)] = None
    return tuple(seen)


class _ServerSandbox:
    """The directory and argv of one sandboxed server (see the module docstring)."""

    def __init__(self, profile: SandboxProfile, python: str, readable: list[str]) -> None:
        # The server keeps the provider's identity: a leased uid could not read the
        # environment where it lies (e.g. in a 0700 directory).
        self.profile = dataclasses.replace(profile, uid_range=None)
        self.workspace = Workspace(self.profile, hidden_paths=())
        self.tmp = self.workspace.root / "tmp"
        self.tmp.mkdir(mode=0o700)
        self.python = python
        self.readable = readable

    def mounts(self) -> list[MountEntry]:
        base = [e for e in self.workspace.mounts(()) if e.kind != "dir"]
        entries = [*base, MountEntry("rw", str(self.tmp), "/tmp")]
        # Host paths already visible where they are (/tmp is not: it is private).
        bound = [e.target for e in base if e.source == e.target]
        # Parents first: a directory bound after one of its subdirectories would hide it.
        wanted = {os.path.realpath(p) for p in [*interpreter_paths(self.python), *self.readable]}
        for real in sorted(wanted):
            if os.path.exists(real) and not path_under(real, bound):
                entries.append(MountEntry("ro", real, real))
                bound.append(real)
        return with_parent_dirs(entries)

    def wrap(
        self, fd: int, environment: dict[str, str], cwd: str
    ) -> Callable[[list[str]], list[str]]:
        """What turns the server's argv into the sandboxed one (given to LocalServer)."""
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": "/workspace",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            **environment,
        }
        mounts = self.mounts()

        def wrap(argv: list[str]) -> list[str]:
            command, _ = sandbox_command(
                self.profile,
                self.workspace,
                argv,
                env,
                child_fds=(fd,),
                mounts=mounts,
                cwd=cwd,
                drop_capabilities=True,
                read_only_root=True,
            )
            return command

        return wrap

    def close(self) -> None:
        self.workspace.close()


def _resolve_sandbox(sandbox: Sandbox) -> SandboxProfile:
    """The working profile for ``sandbox`` on this machine (probed once, cached).

    Raises:
        ServerStartError: no requested mode works here; the reasons are in the message.
    """
    try:
        return resolve_profile(sandbox if sandbox == "auto" else SandboxMode(sandbox))
    except SandboxError as exc:
        raise ServerStartError(
            f"the {sandbox} sandbox is not available: {exc}; install bubblewrap or "
            "util-linux, or start without sandbox=",
            details={"sandbox": sandbox},
        ) from None


class LocalProcessProvider(Provider):
    """Start environment servers as local processes (see the module docstring).

    Args:
        python: the interpreter to run servers with (default: this one). Ignored with
            ``venv=True``.
        venv: run each environment directory's server in a cached virtualenv built from
            its ``pyproject.toml``.
        venv_cache: where virtualenvs are cached (default
            :func:`~corral.providers.venv.venv_cache_dir`).
        offline: build virtualenvs from the wheelhouse only, never the package index.
        sandbox: ``"none"``, ``"bwrap"``, ``"unshare"`` or ``"auto"`` (the strongest
            that works here; an error if none does).
        limits: resource limits; unset ones fall back to the manifest's
            ``resources.memory`` for an environment directory.
        cwd: the working directory of servers of an entry point (their modules are
            imported from it); default: this process's.
        host: the loopback address to bind.
        startup_timeout: seconds a server may take to answer ``/ready``.
        guard: register servers with the guardian (cleanup after SIGKILL).
        progress: receives a line per virtualenv build step.
        token: the bearer token servers require (default: ``$CORRAL_TOKEN`` if set).
    """

    kind = "local"

    def __init__(
        self,
        *,
        python: str | None = None,
        venv: bool = False,
        venv_cache: str | Path | None = None,
        offline: bool = False,
        sandbox: Sandbox = "none",
        limits: LocalLimits | None = None,
        cwd: str | Path | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 60.0,
        guard: bool = True,
        progress: Progress | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout, token=token)
        if sandbox not in ("none", "auto", "bwrap", "unshare"):
            raise ValueError(
                f"sandbox must be 'none', 'auto', 'bwrap' or 'unshare', not {sandbox!r}"
            )
        self.python = python or sys.executable
        self.venv = venv
        self.venv_cache = venv_cache
        self.offline = offline
        self.sandbox: Sandbox = sandbox
        self.limits = limits or LocalLimits()
        self.cwd = Path(cwd or os.getcwd()).resolve()
        self.host = host
        self.guard = guard
        self.progress = progress
        self._servers: dict[int, tuple[LocalServer, _ServerSandbox | None]] = {}
        self._endpoints: dict[int, LocalEndpoint] = {}
        self._lock = threading.Lock()
        # Runs on close(), when the provider is garbage-collected, or at interpreter
        # exit, whichever comes first; it holds the server table, not the provider.
        self._finalizer = weakref.finalize(
            self, _stop_all, self._servers, self._endpoints, self._lock
        )

    # ------------------------------------------------------------------ starting

    async def start(self, spec: SpecLike) -> LocalEndpoint:
        """Start a server for ``spec`` (an entry point or an environment directory).

        Raises:
            ServerStartError: a bad manifest, a failed virtualenv build, no usable
                sandbox, or a server that exited (with its output) or was not ready.
        """
        self._check_open()
        spec = ServerSpec.of(spec)
        try:
            manifest = spec.manifest()
        except ManifestError as exc:
            raise ServerStartError(str(exc), details={"target": spec.target}) from None
        target = str(manifest.root) if manifest is not None else spec.target
        python = await self._interpreter(manifest, spec)
        profile = (
            await asyncio.to_thread(_resolve_sandbox, self.sandbox)
            if self.sandbox != "none"
            else None
        )
        cwd = str(manifest.root) if manifest is not None else str(self.cwd)
        limits = self._limits(spec, manifest)
        sock = bind_socket(self.host, 0)
        sandbox: _ServerSandbox | None = None
        try:
            wrap = None
            if profile is not None:
                sandbox = await asyncio.to_thread(_ServerSandbox, profile, python, [cwd])
                inside = dict(spec.environment)
                if self.token is not None:
                    # The sandbox starts from an empty environment.
                    inside[TOKEN_ENV] = self.token
                wrap = sandbox.wrap(sock.fileno(), inside, cwd)
            server = LocalServer(
                target,
                python=python,
                server_args=spec.serve_args(owned=True),
                env=dict(spec.environment),
                cwd=cwd,
                startup_timeout=spec.startup_timeout or self.startup_timeout,
                token=self.token,
                listen_socket=sock,
                wrap=wrap,
                setup=limits.setup(),
                # A sandbox's pid 1 ignores SIGTERM from outside (and util-linux unshare
                # ignores it too): there is no graceful stop to wait for.
                stop_grace=0.0 if profile is not None else 5.0,
                death_signal=signal.SIGKILL if profile is not None else signal.SIGTERM,
            )
            server.on_spawn = functools.partial(self._register, server, sandbox)
        except BaseException:
            sock.close()
            if sandbox is not None:
                sandbox.close()
            raise
        try:
            url = await server.start()
        except BaseException:
            await asyncio.to_thread(self._forget, server, sandbox)
            raise
        assert server.process is not None
        pid = server.process.pid
        port = int(url.rsplit(":", 1)[1])
        endpoint = LocalEndpoint(
            url=url,
            host=self.host,
            port=port,
            pid=pid,
            target=target,
            python=python,
            sandbox=profile.mode.value if profile is not None else "none",
        )
        with self._lock:
            self._endpoints[pid] = endpoint
        if self.closed:
            # close() ran while this server was starting: it must not outlive the provider.
            await self.stop(endpoint)
            self._check_open()
        return endpoint

    def _register(
        self,
        server: LocalServer,
        sandbox: _ServerSandbox | None,
        process: ServerProcess,
    ) -> None:
        """Called by LocalServer as soon as the child exists: own it from then on."""
        # The server table is the finalizer's: a hook left on the server would keep the
        # provider alive through it, and a forgotten provider could never be collected.
        server.on_spawn = None
        with self._lock:
            self._servers[process.pid] = (server, sandbox)
        if self.guard:
            guardian().watch(process.pid, graceful=sandbox is None)

    async def _interpreter(self, manifest: Manifest | None, spec: ServerSpec) -> str:
        if not self.venv:
            return self.python
        if manifest is None:
            raise ServerStartError(
                f"venv=True builds the virtualenv from an environment directory's "
                f"pyproject.toml; {spec.target!r} is not a directory with corral.yaml",
                details={"target": spec.target},
            )
        try:
            built = await asyncio.to_thread(
                ensure_venv,
                manifest.root,
                cache_dir=self.venv_cache,
                offline=self.offline,
                progress=self.progress,
            )
        except (BuildError, ManifestError) as exc:
            raise ServerStartError(
                f"cannot build the virtualenv of {manifest.name}: {exc}",
                details={"target": spec.target},
            ) from None
        # The directory's real path: bin/python itself is a symlink to the base interpreter.
        return str(built.path.resolve() / "bin" / "python")

    def _limits(self, spec: ServerSpec, manifest: Manifest | None) -> LocalLimits:
        memory = spec.memory if spec.memory is not None else self.limits.memory
        if memory is None and manifest is not None:
            memory = manifest.resources.memory
        processes = spec.pids if spec.pids is not None else self.limits.max_processes
        return dataclasses.replace(self.limits, memory=memory, max_processes=processes)

    # ------------------------------------------------------------------ stopping

    def _forget(self, server: LocalServer, sandbox: _ServerSandbox | None) -> None:
        """Stop ``server`` (idempotent), release it and delete its sandbox directory."""
        server.stop_now()
        process = server.process
        if process is not None:
            with self._lock:
                self._servers.pop(process.pid, None)
                self._endpoints.pop(process.pid, None)
            if self.guard:
                guardian().release(process.pid)
        if sandbox is not None:
            sandbox.close()

    async def stop(self, endpoint: Endpoint) -> None:
        """Stop a server this provider started (SIGTERM, then SIGKILL after 5 s)."""
        if not isinstance(endpoint, LocalEndpoint):
            return
        with self._lock:
            entry = self._servers.get(endpoint.pid)
        if entry is not None:
            await asyncio.to_thread(self._forget, *entry)

    async def alive(self, endpoint: Endpoint) -> bool:
        """The server's process is running."""
        if not isinstance(endpoint, LocalEndpoint):
            return False
        with self._lock:
            entry = self._servers.get(endpoint.pid)
        return entry is not None and entry[0].running

    def logs(self, endpoint: Endpoint, lines: int = 50) -> str:
        """The server's last output lines (kept until it is stopped)."""
        if not isinstance(endpoint, LocalEndpoint):
            return ""
        with self._lock:
            entry = self._servers.get(endpoint.pid)
        return entry[0].output(lines) if entry is not None else ""

    @property
    def endpoints(self) -> list[Endpoint]:
        """The servers started and not stopped."""
        with self._lock:
            return list(self._endpoints.values())

    async def close(self) -> None:
        """Stop every server this provider started; later starts are refused."""
        self._closed = True
        await asyncio.to_thread(self._finalizer)


def _stop_all(
    servers: dict[int, tuple[LocalServer, _ServerSandbox | None]],
    endpoints: dict[int, LocalEndpoint],
    lock: threading.Lock,
) -> None:
    """Stop every server in ``servers`` and delete their sandboxes (the provider's cleanup)."""
    with lock:
        pending = list(servers.values())
        servers.clear()
        endpoints.clear()
    for server, sandbox in pending:
        with contextlib.suppress(Exception):
            server.stop_now(grace=min(server.stop_grace, 2.0))
            if server.process is not None:
                guardian().release(server.process.pid)
        if sandbox is not None:
            with contextlib.suppress(Exception):
                sandbox.close()
