"""Sandboxed Python processes for the coding environment.

A :class:`Workspace` is one episode's private directory (and, when corral runs as root,
one leased unprivileged uid); a :class:`SandboxProcess` is one worker process running in
it under one of three isolation modes (:class:`SandboxMode`), chosen by probing what
works on the machine (:func:`resolve_profile`). See the package docstring for what each
mode guarantees.

Thread safety: nothing here holds global mutable state except the probe cache (facts
about the machine, computed once). Uid leases are exclusive across threads *and*
processes through ``flock`` on one lock file per uid. Every file descriptor is
close-on-exec except the ones passed to a sandbox explicitly, so concurrently spawned
sandboxes never inherit each other's pipes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import functools
import json
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.envs.coding import _worker

SANDBOX_WORKDIR = "/workspace"
"""Where the episode's working directory appears inside the ``bwrap``/``unshare`` sandboxes."""
DEFAULT_UID_RANGE = range(1_879_048_192, 1_879_048_192 + 1_000_000)
"""Uids leased to sandboxes when corral runs as root: far above any real or subordinate uid."""
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_ENTRIES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/alternatives",
)
_PATH = "/usr/local/bin:/usr/bin:/bin"
_PYTHON_FLAGS = ("-I", "-S", "-B", "-X", "utf8")
_PROBE_TIMEOUT = 20.0
_KILL_TIMEOUT = 30.0


class SandboxMode(enum.StrEnum):
    """How a sandbox isolates the agent's code (strongest first)."""

    BWRAP = "bwrap"
    """bubblewrap: new pid/net/ipc/uts namespaces and a minimal read-only filesystem."""
    UNSHARE = "unshare"
    """util-linux ``unshare`` and corral's own launcher: the same isolation as ``bwrap``."""
    RLIMITS = "rlimits"
    """Resource limits, an unprivileged uid (as root) and Python-level guards only."""


KilledReason = Literal[
    "wall_clock", "cpu_time", "memory", "output_limit", "signal", "exited", "protocol", "closed"
]
"""Why a sandboxed process ended before answering (see :class:`CodeObservation`)."""


class SandboxError(RuntimeError):
    """The sandbox could not be set up or started (a problem of the machine, not the agent)."""


class SandboxUnavailable(SandboxError):
    """No requested sandbox mode works on this machine; the message says why for each."""


class SandboxLimits(BaseModel):
    """Resource limits of every sandboxed process (per action unless stated otherwise).

    Attributes:
        cpu_seconds: CPU seconds for one action's code (RLIMIT_CPU, 1-second granularity);
            the hidden tests get the same budget again. Exceeding it kills the process.
        wall_seconds: wall-clock seconds for one action's code, enforced by the parent.
        test_wall_seconds: wall-clock seconds for running all the hidden tests.
        memory_bytes: address space per process (RLIMIT_AS and RLIMIT_DATA).
        max_processes: processes and threads the sandbox may have at once (RLIMIT_NPROC,
            counted per sandbox uid or user namespace).
        max_file_bytes: largest file a process may write (RLIMIT_FSIZE).
        max_open_files: open file descriptors per process (RLIMIT_NOFILE).
        max_output_bytes: bytes kept of stdout and of stderr each; more kills the process.
        nice: scheduling niceness of the sandbox, so a busy sandbox yields to the server.
        start_timeout: seconds a sandbox may take to start before it counts as broken.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_seconds: int = Field(default=5, ge=1, le=3600)
    wall_seconds: float = Field(default=10.0, gt=0, le=3600)
    test_wall_seconds: float = Field(default=10.0, gt=0, le=3600)
    memory_bytes: int = Field(default=512 * 1024 * 1024, ge=64 * 1024 * 1024)
    max_processes: int = Field(default=32, ge=4, le=65536)
    max_file_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_open_files: int = Field(default=64, ge=16, le=65536)
    max_output_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024 * 1024)
    nice: int = Field(default=5, ge=0, le=19)
    start_timeout: float = Field(default=15.0, gt=0, le=600)


@dataclasses.dataclass(frozen=True)
class PythonInfo:
    """The interpreter the sandbox runs, as it describes itself."""

    executable: str
    version: tuple[int, int]
    prefixes: tuple[str, ...]
    path: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class SandboxProfile:
    """A working way to start sandboxes on this machine (the result of probing).

    Attributes:
        mode: the isolation mode.
        strategy: how the mode is realised: ``"privileged"`` (bwrap run as root, then
            ``setpriv`` to the sandbox uid), ``"as-uid"`` (bwrap run as the sandbox uid),
            ``"userns"`` (an unprivileged user namespace), ``"root"`` (unshare as root)
            or ``"direct"`` (rlimits mode).
        python: the sandbox interpreter.
        tool: path of ``bwrap`` / ``unshare`` (None in rlimits mode).
        setpriv: path of ``setpriv`` for the ``privileged`` strategy.
        uid_range: uids leased to sandboxes, or None when not running as root.
        kill: path of ``kill(1)``, used to sweep a sandbox uid in one atomic call.
    """

    mode: SandboxMode
    strategy: str
    python: PythonInfo
    tool: str | None
    setpriv: str | None
    uid_range: range | None
    kill: str | None

    def describe(self) -> str:
        """One line for logs and state: mode, strategy and interpreter."""
        return f"{self.mode} ({self.strategy}, python {self.python.executable})"


# --- probing ---------------------------------------------------------------------------


def default_python() -> str:
    """The interpreter corral runs on, with symlinks (and so any venv) resolved away."""
    return os.path.realpath(sys.executable)


@functools.cache
def python_info(executable: str) -> PythonInfo:
    """Ask ``executable`` for its version, prefixes and module path (cached per path).

    Raises:
        SandboxError: it does not run, or is older than Python 3.8.
    """
    script = (
        "import json, sys; print(json.dumps([list(sys.version_info[:2]), "
        "sorted({sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}), "
        "sys.path]))"
    )
    try:
        out = subprocess.run(
            [executable, *_PYTHON_FLAGS, "-c", script],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            check=True,
        ).stdout
        version, prefixes, path = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxError(f"cannot run the sandbox interpreter {executable!r}: {exc}") from exc
    if tuple(version) < (3, 8):
        raise SandboxError(f"the sandbox interpreter {executable} is Python {version}; need 3.8+")
    return PythonInfo(
        executable=executable,
        version=(int(version[0]), int(version[1])),
        prefixes=tuple(os.path.realpath(p) for p in prefixes),
        path=tuple(os.path.realpath(p) for p in path if p and os.path.exists(p)),
    )


def _unreachable_for_others(path: str) -> str | None:
    """The first directory on ``path`` that a stranger uid cannot enter, or None."""
    current = Path(path)
    for directory in [*reversed(current.parents), current]:
        try:
            mode = directory.stat().st_mode
        except OSError:
            return str(directory)
        if directory != current and not mode & stat.S_IXOTH:
            return str(directory)
    return None


def _candidates(mode: SandboxMode, is_root: bool) -> list[str]:
    if mode is SandboxMode.BWRAP:
        return ["privileged", "as-uid"] if is_root else ["userns"]
    if mode is SandboxMode.UNSHARE:
        return ["root"] if is_root else ["userns"]
    return ["direct"]


@functools.cache
def probe(mode: SandboxMode, python: str, uid_range: range | None) -> SandboxProfile | str:
    """Find a way to run ``mode`` on this machine: a profile, or the reason there is none.

    Every candidate strategy is tried for real (a sandbox is started and runs a line of
    code), so a profile means the mode works here. Results are cached per argument set.
    """
    is_root = os.geteuid() == 0
    try:
        info = python_info(python)
    except SandboxError as exc:
        return f"{mode}: {exc}"
    tool = {
        SandboxMode.BWRAP: shutil.which("bwrap"),
        SandboxMode.UNSHARE: shutil.which("unshare"),
        SandboxMode.RLIMITS: None,
    }[mode]
    if mode is not SandboxMode.RLIMITS and tool is None:
        package = "bubblewrap" if mode is SandboxMode.BWRAP else "util-linux"
        return f"{mode} is not installed (install the {package} package)"
    reasons: list[str] = []
    for strategy in _candidates(mode, is_root):
        setpriv = shutil.which("setpriv") if strategy == "privileged" else None
        if strategy == "privileged" and setpriv is None:
            reasons.append("privileged: setpriv (util-linux) is not installed")
            continue
        if is_root and strategy in ("as-uid", "direct"):
            blocked = _unreachable_for_others(python)
            if blocked is not None:
                reasons.append(
                    f"{strategy}: the interpreter {python} is not reachable by an unprivileged "
                    f"uid ({blocked} is not searchable by others); pass python= an "
                    "interpreter outside private directories, e.g. /usr/bin/python3"
                )
                continue
        profile = SandboxProfile(
            mode=mode,
            strategy=strategy,
            python=info,
            tool=tool,
            setpriv=setpriv,
            uid_range=uid_range if is_root else None,
            kill=shutil.which("kill"),
        )
        problem = _try_profile(profile)
        if problem is None:
            return profile
        reasons.append(f"{strategy}: {problem}")
    return f"{mode} does not work here: " + "; ".join(reasons)


def _try_profile(profile: SandboxProfile) -> str | None:
    """Start one sandbox with ``profile`` and run a line of code; None if all went well."""
    limits = SandboxLimits(wall_seconds=_PROBE_TIMEOUT, start_timeout=_PROBE_TIMEOUT)
    try:
        with Workspace(profile, hidden_paths=()) as workspace:
            process = SandboxProcess(profile, workspace, limits, cpu_hard=limits.cpu_seconds + 1)
            try:
                outcome = process.execute("print(6 * 7)", "<probe>")
            finally:
                process.close()
    except SandboxError as exc:
        return str(exc)
    if outcome.exit_code != 0 or outcome.stdout.strip() != b"42":
        detail = outcome.stderr.decode("utf-8", "replace").strip()[-500:]
        return f"the probe run failed ({outcome.killed_reason or outcome.exit_code}): {detail}"
    return None


def resolve_profile(
    sandbox: SandboxMode | Literal["auto"],
    python: str | None = None,
    uid_range: range | None = DEFAULT_UID_RANGE,
) -> SandboxProfile:
    """The profile for ``sandbox`` (``"auto"``: the strongest mode that works).

    Raises:
        SandboxUnavailable: the requested mode (or, for ``"auto"``, every mode) does not
            work here; the message gives the reason for each.
    """
    executable = python or default_python()
    modes = list(SandboxMode) if sandbox == "auto" else [SandboxMode(sandbox)]
    reasons = []
    for mode in modes:
        result = probe(mode, executable, uid_range)
        if isinstance(result, SandboxProfile):
            return result
        reasons.append(result)
    raise SandboxUnavailable("no usable sandbox: " + " | ".join(reasons))


def available_modes(
    python: str | None = None, uid_range: range | None = DEFAULT_UID_RANGE
) -> dict[SandboxMode, str | None]:
    """Which modes work on this machine: ``None`` for a working mode, else the reason."""
    executable = python or default_python()
    report: dict[SandboxMode, str | None] = {}
    for mode in SandboxMode:
        result = probe(mode, executable, uid_range)
        report[mode] = None if isinstance(result, SandboxProfile) else result
    return report


# --- uids and workspaces ---------------------------------------------------------------


class UidLease:
    """Exclusive use of one uid from a range, across threads and processes.

    The lease is an ``flock`` on ``<tmp>/corral-sandbox-uids/<uid>``; the kernel drops it
    if this process dies, so a crashed server never strands a uid. A fresh lease starts
    by killing whatever still runs under the uid (left over by such a crash). The lock
    file is deleted on release; a locker re-checks that the file it locked is still the
    one at the path, so deleting it cannot let two holders in.
    """

    def __init__(self, uid_range: range, kill: str | None) -> None:
        directory = _lock_directory()
        for _ in range(64):
            uid = random.SystemRandom().choice(uid_range)
            path = directory / str(uid)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino != os.stat(path, follow_symlinks=False).st_ino:
                    raise BlockingIOError  # released and deleted while we were locking
            except (BlockingIOError, FileNotFoundError):
                os.close(fd)
                continue
            self.uid = uid
            self._path = path
            self._fd: int | None = fd
            kill_uid(uid, kill)
            return
        raise SandboxError(f"no free sandbox uid in {uid_range} after 64 tries")

    def release(self) -> None:
        """Give the uid back (the caller has killed its processes)."""
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()
            os.close(self._fd)
            self._fd = None


def _lock_directory() -> Path:
    directory = Path(tempfile.gettempdir()) / "corral-sandbox-uids"
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise SandboxError(
            f"{directory} must be a directory owned by uid {os.geteuid()} with mode 0700; "
            "remove it and retry"
        )
    return directory


def processes_of(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as f:
                status = f.read()
        except OSError:
            continue
        real_uid, zombie = None, False
        for line in status.splitlines():
            if line.startswith("State:"):
                zombie = line.split()[1:2] == ["Z"]
            elif line.startswith("Uid:"):
                real_uid = line.split()[1]
                break
        if real_uid == str(uid) and not zombie:
            found.append(int(entry.name))
    return found


def kill_uid(uid: int, kill: str | None, timeout: float = 5.0) -> None:
    """Kill every process running as ``uid`` and wait until none is left.

    ``kill -KILL -1`` run *as* the uid reaches all of its processes in one atomic pass
    (a fork bomb cannot outrun it); a scan of ``/proc`` then kills stragglers and
    confirms. Only meaningful for leased uids that nothing else uses.

    Raises:
        SandboxError: processes of ``uid`` survived ``timeout`` seconds of killing.
    """
    if kill is not None:
        subprocess.run(
            [kill, "-s", "KILL", "--", "-1"],
            user=uid,
            group=uid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    deadline = time.monotonic() + timeout
    while pids := processes_of(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise SandboxError(f"processes {pids} of sandbox uid {uid} survived SIGKILL")
        time.sleep(0.005)


def remove_tree(path: Path) -> None:
    """Delete ``path`` even where the sandbox removed permissions from its files."""

    def fix_and_retry(function: Any, failed: str, _exc: BaseException) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
        with contextlib.suppress(FileNotFoundError):
            function(failed)

    if not path.exists():
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=fix_and_retry)
    else:
        shutil.rmtree(path, onerror=lambda f, p, info: fix_and_retry(f, p, info[1]))


@dataclasses.dataclass(frozen=True)
class MountEntry:
    """One entry of a sandbox's filesystem view.

    ``kind``: ``ro`` / ``rw`` bind ``source`` at ``target``; ``symlink`` makes ``target``
    a symlink to ``source``; ``empty`` hides ``target`` behind an empty read-only
    directory or file (``source`` is the hidden host path); ``dir`` creates ``target``
    as a world-searchable directory (``source`` unused), so the sandbox uid can reach
    what is bound below it (bwrap would create it with mode 0700).
    """

    kind: Literal["ro", "rw", "symlink", "empty", "dir"]
    source: str
    target: str


class Workspace:
    """One episode's private working directory (and sandbox uid, when running as root).

    Layout on the host: ``<root>/corral-coding-XXXX/`` (mode 0711, owned by corral) holding
    ``work/`` (the agent's directory, owned by the sandbox uid, mode 0700), ``empty/`` and
    ``empty-file`` (to mask hidden paths), ``passwd``/``group`` (shown as /etc files) and
    ``root/`` (the mount point of the unshare mode's new root). All of it is deleted by
    :meth:`close`.

    Raises:
        SandboxError: the directory or the uid lease could not be set up.
    """

    def __init__(
        self,
        profile: SandboxProfile,
        hidden_paths: Sequence[str],
        workdir_root: str | None = None,
    ) -> None:
        self.profile = profile
        self.lease = UidLease(profile.uid_range, profile.kill) if profile.uid_range else None
        self.uid = self.lease.uid if self.lease else None
        try:
            self.root = Path(tempfile.mkdtemp(prefix="corral-coding-", dir=workdir_root))
            self.root.chmod(0o711)
            self.host_workdir = self.root / "work"
            self.host_workdir.mkdir(mode=0o700)
            (self.root / "empty").mkdir(mode=0o555)
            (self.root / "empty-file").touch(mode=0o444)
            (self.root / "root").mkdir(mode=0o700)
            if self.uid is not None:
                os.chown(self.host_workdir, self.uid, self.uid)
            self._write_identity_files()
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot create the sandbox workspace: {exc}") from exc
        self.hidden_paths = tuple(os.path.realpath(p) for p in hidden_paths)
        self.inside_workdir = (
            str(self.host_workdir) if profile.mode is SandboxMode.RLIMITS else SANDBOX_WORKDIR
        )
        self._closed = False

    @property
    def closed(self) -> bool:
        """:meth:`close` was called: the directory is gone and the uid given back."""
        return getattr(self, "_closed", False)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _write_identity_files(self) -> None:
        uid = self.uid if self.uid is not None else os.getuid()
        gid = self.uid if self.uid is not None else os.getgid()
        (self.root / "passwd").write_text(
            "root:x:0:0:root:/:/usr/sbin/nologin\n"
            f"sandbox:x:{uid}:{gid}:corral sandbox:{SANDBOX_WORKDIR}:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (self.root / "group").write_text(f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n")
        for name in ("passwd", "group"):
            (self.root / name).chmod(0o444)

    def mounts(self, extra_ro_paths: Sequence[str] = ()) -> list[MountEntry]:
        """The filesystem view of the ``bwrap``/``unshare`` modes, in mounting order."""
        entries: list[MountEntry] = []
        bound: list[str] = []
        for directory in _SYSTEM_DIRS:
            if os.path.islink(directory):
                entries.append(MountEntry("symlink", os.readlink(directory), directory))
            elif os.path.isdir(directory):
                entries.append(MountEntry("ro", directory, directory))
                bound.append(directory)
        entries.append(MountEntry("ro", str(self.root / "passwd"), "/etc/passwd"))
        entries.append(MountEntry("ro", str(self.root / "group"), "/etc/group"))
        entries.extend(MountEntry("ro", e, e) for e in _ETC_ENTRIES if os.path.exists(e))
        python = self.profile.python
        python_dirs = [*python.prefixes, os.path.dirname(python.executable)]
        for path in [*python_dirs, *extra_ro_paths]:
            real = os.path.realpath(path)
            if os.path.exists(real) and not _under(real, bound):
                entries.append(MountEntry("ro", real, real))
                bound.append(real)
        for hidden in self.hidden_paths:
            if os.path.exists(hidden) and _under(hidden, bound):
                entries.append(MountEntry("empty", hidden, hidden))
        entries.append(MountEntry("rw", str(self.host_workdir), SANDBOX_WORKDIR))
        return with_parent_dirs(entries)

    def close(self) -> None:
        """Kill leftovers of the sandbox uid, delete the directory, give the uid back."""
        if self.closed:
            return
        self._closed = True
        lease = getattr(self, "lease", None)
        try:
            if lease is not None:
                kill_uid(lease.uid, self.profile.kill)
        finally:
            root = getattr(self, "root", None)
            if root is not None:
                remove_tree(root)
            if lease is not None:
                lease.release()


def with_parent_dirs(entries: list[MountEntry]) -> list[MountEntry]:
    """Precede each entry by ``dir`` entries for its missing ancestors, outermost first.

    Ancestors under an earlier bind are left to the bind (the mount point is created in
    the bound directory).
    """
    result: list[MountEntry] = []
    bound: list[str] = []
    created: set[str] = set()
    for entry in entries:
        ancestors = list(reversed(Path(entry.target).parents))[1:]  # all but "/"
        for ancestor in map(str, ancestors):
            if ancestor not in created and not _under(ancestor, bound):
                result.append(MountEntry("dir", "", ancestor))
                created.add(ancestor)
        result.append(entry)
        if entry.kind in ("ro", "rw", "empty", "symlink"):
            bound.append(entry.target)
    return result


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


# --- sandboxed processes ---------------------------------------------------------------


@functools.cache
def _source(name: str) -> str:
    return resources.files("corral.envs.coding").joinpath(name).read_text(encoding="utf-8")


@dataclasses.dataclass
class ExecOutcome:
    """What one ``exec`` of the agent's code produced.

    ``exit_code`` is None when the process ended before answering; ``killed_reason``
    then says why and ``error`` says it in words.
    """

    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: int | None = None
    error: str | None = None
    killed_reason: KilledReason | None = None
    wall_time: float = 0.0
    cpu_time: float | None = None


@dataclasses.dataclass
class CaseOutcome:
    """The worker's report of one hidden test case (``value`` in canonical form)."""

    index: int
    ok: bool
    value: Any = None
    error: str | None = None


@dataclasses.dataclass
class TestsOutcome:
    """The reports of a test run; the cases after a kill are missing from ``cases``."""

    cases: list[CaseOutcome]
    killed_reason: KilledReason | None = None


class _Capture:
    """One phase's output: kept up to ``cap`` bytes per stream, or only counted."""

    def __init__(self, cap: int, keep: bool) -> None:
        self.cap = cap
        self.keep = keep
        self.data = {1: bytearray(), 2: bytearray()}
        self.seen = {1: 0, 2: 0}

    def feed(self, stream: int, chunk: bytes) -> bool:
        """Record a chunk; True once the stream went over the cap."""
        self.seen[stream] += len(chunk)
        if self.keep:
            room = self.cap - len(self.data[stream])
            if room > 0:
                self.data[stream] += chunk[:room]
        return self.seen[stream] > self.cap

    def truncated(self, stream: int) -> bool:
        """More than ``cap`` bytes arrived on ``stream``."""
        return self.seen[stream] > self.cap


class _Ended(Exception):
    """The worker ended (or was killed) while a reply was awaited."""

    def __init__(self, reason: KilledReason) -> None:
        super().__init__(reason)
        self.reason = reason


class SandboxProcess:
    """One sandboxed worker process, started (and awaited) by the constructor.

    One thread at a time calls ``execute``/``run_tests``/``close`` (the owner); ``kill``
    may be called from any thread at any moment and makes a running call return. File
    descriptors are only closed by ``close``, never under a reader's feet.

    Raises:
        SandboxError: the sandbox did not start (the message carries its error output).
    """

    def __init__(
        self,
        profile: SandboxProfile,
        workspace: Workspace,
        limits: SandboxLimits,
        cpu_hard: int,
        extra_ro_paths: Sequence[str] = (),
    ) -> None:
        self.profile = profile
        self.workspace = workspace
        self.limits = limits
        self.worker_pid: int | None = None
        self._lock = threading.Lock()
        self._killed_by: KilledReason | None = None
        self._reaped = False
        self._closed = False
        self._pending = bytearray()
        request_r, self._request_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        lifeline_r, self._lifeline_w = os.pipe()
        self._out_r, out_w = os.pipe()
        self._err_r, err_w = os.pipe()
        child_fds = (request_r, reply_w, lifeline_r)
        config = {
            "request_fd": request_r,
            "reply_fd": reply_w,
            "lifeline_fd": lifeline_r,
            "workdir": workspace.inside_workdir,
            "limits": {
                **limits.model_dump(),
                "cpu_hard": max(cpu_hard, limits.cpu_seconds + 1),
                "nproc": self._nproc(),
            },
            "no_new_privs": profile.mode is SandboxMode.RLIMITS,
            "guards": self._guards() if profile.mode is SandboxMode.RLIMITS else None,
        }
        worker_argv = [
            profile.python.executable,
            *_PYTHON_FLAGS,
            "-c",
            _source("_worker.py"),
            json.dumps(config),
        ]
        rlimits = profile.mode is SandboxMode.RLIMITS
        try:
            argv, user = self._command(worker_argv, child_fds, extra_ro_paths)
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=child_fds,
                close_fds=True,
                start_new_session=True,
                cwd=str(workspace.host_workdir if rlimits else workspace.root),
                env=self._environment(),
                user=user,
                group=user,
                extra_groups=[] if user is not None else None,
            )
        except OSError as exc:
            self._close_fds()
            raise SandboxError(f"cannot start the {profile.mode} sandbox: {exc}") from exc
        except BaseException:
            self._close_fds()
            raise
        finally:
            for fd in (request_r, reply_w, lifeline_r, out_w, err_w):
                os.close(fd)
        for fd in (self._request_w, self._reply_r, self._out_r, self._err_r):
            os.set_blocking(fd, False)
        self._pidfd: int | None
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
        except OSError:
            self._pidfd = None
        self._await_ready()

    # -- construction helpers ---------------------------------------------------------

    def _nproc(self) -> int:
        """RLIMIT_NPROC for the worker.

        A leased uid or a user namespace gives the sandbox its own process count. In the
        rlimits mode without root the count is shared with every process of the user,
        so the budget is added to what the user already runs (a weaker, racy bound).
        """
        budget = self.limits.max_processes
        if self.profile.mode is SandboxMode.RLIMITS and self.workspace.uid is None:
            return budget + len(processes_of(os.getuid()))
        return budget

    def _guards(self) -> dict[str, list[str]]:
        devices = [f"/dev/{name}" for name in ("null", "zero", "full", "random", "urandom")]
        return {
            "read": [*self.profile.python.path, *devices],
            "write": [str(self.workspace.host_workdir), "/dev/null"],
            "deny": list(self.workspace.hidden_paths),
        }

    def _environment(self) -> dict[str, str]:
        home = self.workspace.inside_workdir
        return {"PATH": _PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "USER": "sandbox"}

    def _command(
        self, worker_argv: list[str], child_fds: Sequence[int], extra_ro_paths: Sequence[str]
    ) -> tuple[list[str], int | None]:
        """The argv to run and the uid to run it as (None: corral's own)."""
        return sandbox_command(
            self.profile,
            self.workspace,
            worker_argv,
            self._environment(),
            child_fds=child_fds,
            extra_ro_paths=extra_ro_paths,
        )

    def _await_ready(self) -> None:
        capture = _Capture(self.limits.max_output_bytes, keep=True)
        try:
            message = self._next_message(time.monotonic() + self.limits.start_timeout, capture)
        except _Ended as ended:
            status = self._status_text()
            self.close()
            detail = capture.data[2].decode("utf-8", "replace").strip()[-2000:]
            what = "did not start in time" if ended.reason == "wall_clock" else "failed to start"
            raise SandboxError(
                f"the {self.profile.mode} sandbox {what} ({status}): {detail or 'no error output'}"
            ) from None
        if message.get("op") != "ready":
            self.close()
            raise SandboxError(f"the sandbox sent {message.get('op')!r} instead of 'ready'")
        prefix = os.path.realpath(str(message.get("prefix")))
        if prefix not in self.profile.python.prefixes:
            self.close()
            raise SandboxError(
                f"the sandbox interpreter found its standard library under {prefix}, not "
                f"{' or '.join(self.profile.python.prefixes)}: part of its installation is "
                "not visible in the sandbox (pass its directories as extra_ro_paths)"
            )
        self.worker_pid = int(message["pid"])

    # -- lifecycle --------------------------------------------------------------------

    def alive(self) -> bool:
        """The worker is still running: not killed, and it has not exited."""
        with self._lock:
            return self._killed_by is None and not self._exited()

    def kill(self, reason: KilledReason = "closed") -> None:
        """Kill the sandbox and everything it started. Any thread; idempotent.

        ``reason`` is recorded unless an earlier one was.

        Raises:
            SandboxError: the sandbox's processes did not die (stuck in the kernel).
        """
        with self._lock:
            if self._killed_by is None:
                self._killed_by = reason
            if not self._reaped:
                # The leader is not reaped yet, so its pid (and group) cannot be reused.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
        try:
            self._proc.wait(timeout=_KILL_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise SandboxError(
                f"sandbox process {self._proc.pid} survived SIGKILL for {_KILL_TIMEOUT:g} s"
            ) from None
        with self._lock:
            self._reaped = True
        if self.workspace.uid is not None and not self.workspace.closed:
            kill_uid(self.workspace.uid, self.profile.kill)

    def close(self) -> None:
        """Kill the sandbox and release its pipes (the owner thread only)."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "_proc"):
            self.kill()
        self._close_fds()

    def _close_fds(self) -> None:
        for name in ("_request_w", "_reply_r", "_lifeline_w", "_out_r", "_err_r", "_pidfd"):
            fd = getattr(self, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _exited(self) -> bool:
        """The leader exited (checked without reaping it, so its pid stays reserved)."""
        if self._reaped:
            return True
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _status(self) -> tuple[Literal["exit", "signal"], int] | None:
        """How the worker ended: ``("exit", code)`` or ``("signal", number)``; None if not."""
        kind: Literal["exit", "signal"]
        if self._reaped:
            code = self._proc.returncode
            kind, value = ("signal", -code) if code < 0 else ("exit", code)
        else:
            try:
                info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return None
            if info is None:
                return None
            exited = info.si_code == os.CLD_EXITED
            kind, value = ("exit", info.si_status) if exited else ("signal", info.si_status)
        if kind == "exit" and self.profile.mode is not SandboxMode.RLIMITS and value > 128:
            # bwrap and the unshare launcher report a worker killed by signal N as 128 + N.
            return ("signal", value - 128)
        return (kind, value)

    def _status_text(self) -> str:
        status = self._status()
        if status is None:
            return "still running"
        kind, value = status
        if kind == "exit":
            return f"exit status {value}"
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(value).name}"
        return f"killed by signal {value}"

    def _death_reason(self) -> KilledReason:
        """Why the worker ended by itself, read from its exit status."""
        status = self._status()
        if status is None or status[0] == "exit":
            if status is not None and status[1] == _worker.EXIT_AFTER_MEMORY_ERROR:
                return "memory"
            return "exited"
        return "cpu_time" if status[1] == signal.SIGXCPU else "signal"

    # -- I/O --------------------------------------------------------------------------

    def _send(self, message: dict[str, Any], deadline: float, capture: _Capture) -> None:
        """Write one request, reading output meanwhile so neither side can block the other."""
        data = memoryview(_worker.encode_frame(message))
        while data:
            try:
                data = data[os.write(self._request_w, data) :]
            except BlockingIOError:
                self._wait(deadline, capture, writing=True)
            except OSError:  # EPIPE: the worker is gone
                self._finish(self._killed_by or self._death_reason())

    def _next_message(self, deadline: float, capture: _Capture) -> dict[str, Any]:
        """Read output and replies until one reply frame is complete.

        Raises:
            _Ended: the worker died, overran ``deadline`` or the output cap, broke the
                protocol, or was killed from another thread (the sandbox is dead then).
        """
        while True:
            message = self._pop_frame()
            if message is not None:
                return message
            self._wait(deadline, capture, writing=False)

    def _finish(self, reason: KilledReason) -> None:
        self.kill(reason)
        raise _Ended(self._killed_by or reason)

    def _pop_frame(self) -> dict[str, Any] | None:
        size_of_header = _worker.HEADER.size
        if len(self._pending) < size_of_header:
            return None
        size = int(_worker.HEADER.unpack_from(self._pending)[0])
        if size > _worker.MAX_MESSAGE_BYTES:
            self._finish("protocol")
        end = size_of_header + size
        if len(self._pending) < end:
            return None
        payload = bytes(self._pending[size_of_header:end])
        del self._pending[:end]
        try:
            return _worker.decode_payload(payload)
        except _worker.ProtocolViolation:
            self._finish("protocol")
            raise  # unreachable: _finish raises

    def _wait(self, deadline: float, capture: _Capture, writing: bool) -> None:
        """Wait until the request pipe is writable (``writing``) or a reply chunk arrived.

        Output that arrives meanwhile goes to ``capture``. Ends the sandbox (raising
        :class:`_Ended`) on a deadline, output overflow, the worker's exit or a kill.
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self._out_r, selectors.EVENT_READ, 1)
            selector.register(self._err_r, selectors.EVENT_READ, 2)
            selector.register(self._reply_r, selectors.EVENT_READ, "reply")
            if writing:
                selector.register(self._request_w, selectors.EVENT_WRITE, "request")
            if self._pidfd is not None:
                selector.register(self._pidfd, selectors.EVENT_READ, "exit")
            while True:
                if self._killed_by is not None:
                    raise _Ended(self._killed_by)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._finish("wall_clock")
                # Without a pidfd the exit is polled; with one, the short timeout only
                # bounds how late a kill from another thread is noticed.
                timeout = min(remaining, 0.05 if self._pidfd is None else 0.2)
                exited = False
                progressed = False
                for key, _ in selector.select(timeout):
                    if key.data == "exit":
                        exited = True
                    elif key.data == "request":
                        progressed = True
                    elif key.data == "reply":
                        chunk = self._read(self._reply_r)
                        if chunk:
                            self._pending += chunk
                            progressed = True
                        elif chunk == b"":
                            selector.unregister(self._reply_r)
                    else:
                        chunk = self._read(key.fd)
                        if chunk == b"":
                            selector.unregister(key.fd)
                        elif chunk and capture.feed(key.data, chunk):
                            self._finish("output_limit")
                if exited or (self._pidfd is None and self._exited()):
                    self._drain(capture)
                    if self._complete_frame_pending():
                        return  # the last reply arrived just before the exit
                    self._finish(self._killed_by or self._death_reason())
                if progressed:
                    self._drain(capture)
                    return

    def _complete_frame_pending(self) -> bool:
        size_of_header = _worker.HEADER.size
        if len(self._pending) < size_of_header:
            return False
        size = int(_worker.HEADER.unpack_from(self._pending)[0])
        return len(self._pending) >= size_of_header + size

    @staticmethod
    def _read(fd: int) -> bytes | None:
        """What ``fd`` has: bytes, ``b""`` at end-of-file, None when nothing is ready."""
        try:
            return os.read(fd, 65536)
        except BlockingIOError:
            return None

    def _drain(self, capture: _Capture) -> None:
        """Read what was already written: it precedes the reply or exit just seen."""
        for stream, fd in ((1, self._out_r), (2, self._err_r)):
            while chunk := self._read(fd):
                if capture.feed(stream, chunk):
                    self._finish("output_limit")
        while chunk := self._read(self._reply_r):
            self._pending += chunk

    # -- requests ---------------------------------------------------------------------

    def execute(self, code: str, filename: str) -> ExecOutcome:
        """Run ``code`` in the worker's namespace; collect its output and exit code."""
        limits = self.limits
        capture = _Capture(limits.max_output_bytes, keep=True)
        started = time.monotonic()
        deadline = started + limits.wall_seconds
        outcome = ExecOutcome()
        try:
            request = {"op": "exec", "code": code, "filename": filename, "cpu": limits.cpu_seconds}
            self._send(request, deadline, capture)
            reply = self._next_message(deadline, capture)
            if reply["op"] != "done":
                self._finish("protocol")
            if reply.get("memory"):
                self.kill("memory")
                outcome.killed_reason = "memory"
            else:
                outcome.exit_code = int(reply["exit_code"])
            outcome.error = None if reply["error"] is None else str(reply["error"])
            outcome.cpu_time = float(reply["cpu_time"])
        except _Ended as ended:
            outcome.killed_reason = ended.reason
        except (KeyError, TypeError, ValueError):
            self.kill("protocol")
            outcome.killed_reason = "protocol"
        outcome.wall_time = time.monotonic() - started
        outcome.stdout, outcome.stderr = bytes(capture.data[1]), bytes(capture.data[2])
        outcome.stdout_truncated = capture.truncated(1)
        outcome.stderr_truncated = capture.truncated(2)
        if outcome.killed_reason is not None:
            outcome.error = self.explain(outcome.killed_reason)
        return outcome

    def run_tests(self, func: str, cases: Sequence[Sequence[Any]]) -> TestsOutcome:
        """Call ``func(*args)`` in the worker for each case. Their output is discarded."""
        limits = self.limits
        capture = _Capture(limits.max_output_bytes, keep=False)
        deadline = time.monotonic() + limits.test_wall_seconds
        results: list[CaseOutcome] = []
        request = {
            "op": "tests",
            "func": func,
            "cases": [list(case) for case in cases],
            "cpu": limits.cpu_seconds,
        }
        try:
            self._send(request, deadline, capture)
            while True:
                reply = self._next_message(deadline, capture)
                if reply["op"] == "tests_done" and len(results) == len(cases):
                    return TestsOutcome(results)
                if reply["op"] != "case" or int(reply["index"]) != len(results):
                    self._finish("protocol")
                error = reply.get("error")
                results.append(
                    CaseOutcome(
                        index=len(results),
                        ok=bool(reply["ok"]),
                        value=reply.get("value"),
                        error=None if error is None else str(error),
                    )
                )
                if reply.get("memory"):
                    self.kill("memory")
                    return TestsOutcome(results, killed_reason="memory")
        except _Ended as ended:
            return TestsOutcome(results, killed_reason=ended.reason)
        except (KeyError, TypeError, ValueError):
            self.kill("protocol")
            return TestsOutcome(results, killed_reason="protocol")

    def explain(self, reason: KilledReason, phase: Literal["code", "tests"] = "code") -> str:
        """A sentence saying why the worker ended, with the limit involved."""
        limits = self.limits
        wall = limits.wall_seconds if phase == "code" else limits.test_wall_seconds
        return {
            "wall_clock": f"killed: wall-clock limit of {wall:g} s exceeded",
            "cpu_time": f"killed: CPU time limit of {limits.cpu_seconds} s exceeded",
            "memory": f"killed: memory limit of {limits.memory_bytes} bytes reached",
            "output_limit": f"killed: output exceeded {limits.max_output_bytes} bytes",
            "signal": f"killed: {self._status_text()}",
            "exited": f"the process ended before finishing ({self._status_text()})",
            "protocol": "killed: the worker's reply channel was corrupted",
            "closed": "killed: the environment was closed",
        }[reason]


def sandbox_command(
    profile: SandboxProfile,
    workspace: Workspace,
    argv: list[str],
    environment: dict[str, str],
    *,
    child_fds: Sequence[int] = (),
    mounts: Sequence[MountEntry] | None = None,
    extra_ro_paths: Sequence[str] = (),
    cwd: str = SANDBOX_WORKDIR,
    drop_capabilities: bool = False,
    read_only_root: bool = False,
) -> tuple[list[str], int | None]:
    """The argv that runs ``argv`` in a sandbox of ``profile``, and the uid to start it as.

    The sandbox has fresh pid, network, IPC and UTS namespaces and the filesystem view
    ``mounts`` (default: ``workspace.mounts(extra_ro_paths)``), starts in ``cwd`` with
    exactly ``environment``, and runs as the workspace's leased uid when it has one.
    File descriptors in ``child_fds`` (open in the caller, passed with ``pass_fds``)
    reach ``argv``; the ``unshare`` launcher closes its own copies of them.

    Args:
        profile: a working profile (see :func:`resolve_profile`).
        workspace: the sandbox's directory (and uid).
        argv: the command to run inside.
        environment: its environment variables (nothing else is inherited).
        child_fds: descriptors passed to ``argv``.
        mounts: the filesystem view; ``None`` for the workspace's.
        extra_ro_paths: more host paths shown read-only (with the default view).
        cwd: the working directory inside.
        drop_capabilities: without a leased uid, also shed every capability (bwrap
            keeps them when run as root; the ``unshare`` launcher always drops them).
        read_only_root: make bwrap's root directory read-only too, as the ``unshare``
            launcher always does (the mounts keep their own modes).

    Returns:
        ``(argv, uid)``: start the argv as ``uid`` (None: as corral itself). In rlimits
        mode the argv is ``argv`` unchanged.
    """
    uid = workspace.uid
    if profile.mode is SandboxMode.RLIMITS:
        return argv, uid
    view = list(mounts) if mounts is not None else workspace.mounts(extra_ro_paths)
    assert profile.tool is not None
    if profile.mode is SandboxMode.BWRAP:
        command = [
            profile.tool,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
        ]
        switch_uid = profile.strategy == "privileged" and uid is not None
        if profile.strategy != "privileged":
            command.append("--unshare-user")
        for entry in view:
            command += _bwrap_mount(entry, workspace)
        command += ["--proc", "/proc", "--dev", "/dev"]
        if read_only_root:
            command += ["--remount-ro", "/"]
        command += ["--chdir", cwd, "--clearenv"]
        for key, value in environment.items():
            command += ["--setenv", key, value]
        if not switch_uid:
            if drop_capabilities:
                command += ["--cap-drop", "ALL"]
            return [*command, "--", *argv], uid
        assert profile.setpriv is not None and uid is not None
        command += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", profile.setpriv]
        command += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
        return command + argv, None
    command = [profile.tool, "--mount", "--pid", "--net", "--ipc", "--uts", "--fork"]
    command += ["--kill-child", "--propagation", "private"]
    if profile.strategy == "userns":
        command += ["--user", "--map-root-user"]
    launcher_config = {
        "root": str(workspace.root / "root"),
        "mounts": [dataclasses.asdict(m) for m in view],
        "empty_dir": str(workspace.root / "empty"),
        "empty_file": str(workspace.root / "empty-file"),
        "cwd": cwd,
        "uid": uid,
        "argv": argv,
        "env": environment,
        "close_fds": list(child_fds),
    }
    launcher = [profile.python.executable, *_PYTHON_FLAGS, "-c", _source("_launcher.py")]
    return [*command, "--", *launcher, json.dumps(launcher_config)], None


def _bwrap_mount(entry: MountEntry, workspace: Workspace) -> list[str]:
    if entry.kind == "dir":
        return ["--perms", "0755", "--dir", entry.target]
    if entry.kind == "symlink":
        return ["--symlink", entry.source, entry.target]
    if entry.kind == "empty":
        mask = workspace.root / ("empty" if os.path.isdir(entry.source) else "empty-file")
        return ["--ro-bind", str(mask), entry.target]
    return ["--ro-bind" if entry.kind == "ro" else "--bind", entry.source, entry.target]
