"""One episode's private working directory and the filesystem view built around it.

Thread safety: a :class:`Workspace` belongs to one owner; uid leases are exclusive across
threads and processes (:mod:`corral.sandbox.uids`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from corral.sandbox.profile import SandboxError, SandboxMode, SandboxProfile
from corral.sandbox.quota import DiskQuota, QuotaKind, unmount
from corral.sandbox.uids import UidLease, kill_uid

SANDBOX_WORKDIR = "/workspace"
"""Where the episode's working directory appears inside the ``bwrap``/``unshare`` sandboxes."""
_PREFIX = "corral-workspace-"
_MARKER = ".corral-workspace"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_ENTRIES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/alternatives",
)


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

    Layout on the host: ``<root>/corral-workspace-XXXX/`` (mode 0711, owned by corral)
    holding ``work/`` (the agent's directory, owned by the sandbox uid, mode 0700),
    ``empty/`` and ``empty-file`` (to mask hidden paths), ``passwd``/``group`` (shown as
    /etc files), ``root/`` (the mount point of the unshare mode's new root) and a marker
    file. All of it is deleted by :meth:`close`. With ``max_disk_bytes``, ``work/`` has a
    :class:`DiskQuota` (a tmpfs mounted there, or a polled bound: see
    :mod:`corral.sandbox.quota`).

    The owner holds an ``flock`` on the directory for the workspace's life; the kernel
    drops it when the owner dies, so the first workspace a process creates in a directory
    deletes (and unmounts) what dead processes left there (:func:`sweep_stale`).

    Raises:
        SandboxError: the directory or the uid lease could not be set up.
    """

    def __init__(
        self,
        profile: SandboxProfile,
        hidden_paths: Sequence[str],
        workdir_root: str | None = None,
        max_disk_bytes: int | None = None,
    ) -> None:
        self.profile = profile
        self.quota: DiskQuota | None = None
        self.lease = UidLease(profile.uid_range, profile.kill) if profile.uid_range else None
        self.uid = self.lease.uid if self.lease else None
        self._lock_fd: int | None = None
        sweep_stale(workdir_root)
        try:
            self.root = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=workdir_root))
            self._lock_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            # Only now may a sweeper consider this directory (it skips unmarked ones).
            (self.root / _MARKER).touch(mode=0o400)
            self.root.chmod(0o711)
            self.host_workdir = self.root / "work"
            self.host_workdir.mkdir(mode=0o700)
            (self.root / "empty").mkdir(mode=0o555)
            (self.root / "empty-file").touch(mode=0o444)
            (self.root / "root").mkdir(mode=0o700)
            if self.uid is not None:
                os.chown(self.host_workdir, self.uid, self.uid)
            if max_disk_bytes is not None:
                kind: QuotaKind = "tmpfs" if profile.tmpfs_workspaces else "polled"
                self.quota = DiskQuota(self.host_workdir, max_disk_bytes, kind)
                owner = self.uid if self.uid is not None else os.getuid()
                self.quota.mount(owner, self.uid if self.uid is not None else os.getgid())
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
            if os.path.exists(real) and not path_under(real, bound):
                entries.append(MountEntry("ro", real, real))
                bound.append(real)
        for hidden in self.hidden_paths:
            if os.path.exists(hidden) and path_under(hidden, bound):
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
            try:
                if self.quota is not None:
                    self.quota.release()
            finally:
                root = getattr(self, "root", None)
                if root is not None:
                    remove_tree(root)
                if self._lock_fd is not None:
                    os.close(self._lock_fd)
                    self._lock_fd = None
                if lease is not None:
                    lease.release()

    def reset(self) -> None:
        """Make the working directory as new for another episode (its processes must be
        dead): empty, owned by the sandbox uid with mode 0700, no extended attributes,
        times of now. What the agent set on the directory itself goes with its files."""
        self.clear()
        directory = self.host_workdir
        for name in os.listxattr(directory, follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.removexattr(directory, name, follow_symlinks=False)
        owner = self.uid if self.uid is not None else os.getuid()
        os.chown(directory, owner, self.uid if self.uid is not None else os.getgid())
        directory.chmod(0o700)
        os.utime(directory)

    def clear(self) -> None:
        """Delete everything in the working directory (its processes must be dead)."""
        if not self.host_workdir.is_dir():
            return
        # The sandbox may have taken permissions away from its own directory.
        self.host_workdir.chmod(0o700)
        for entry in os.scandir(self.host_workdir):
            if entry.is_dir(follow_symlinks=False):
                remove_tree(Path(entry.path))
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


@functools.cache
def sweep_stale(directory: str | None) -> int:
    """Delete the workspaces that dead processes left in ``directory`` (default: the temp
    dir), unmounting their tmpfs first; runs once per process and directory.

    A workspace is stale when it carries the marker and its ``flock`` is free: its owner
    died without closing it (a live owner holds the lock; one still being created has no
    marker yet). Only directories owned by this process's user are considered.

    Returns:
        How many were deleted.
    """
    base = directory or tempfile.gettempdir()
    swept = 0
    try:
        candidates = [e.path for e in os.scandir(base) if e.name.startswith(_PREFIX)]
    except OSError:
        return 0
    for path in candidates:
        if not os.path.exists(os.path.join(path, _MARKER)):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its owner is alive
            with contextlib.suppress(OSError):
                unmount(Path(path) / "work")
                remove_tree(Path(path))
                swept += 1
        finally:
            os.close(fd)
    return swept


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
            if ancestor not in created and not path_under(ancestor, bound):
                result.append(MountEntry("dir", "", ancestor))
                created.add(ancestor)
        result.append(entry)
        if entry.kind in ("ro", "rw", "empty", "symlink"):
            bound.append(entry.target)
    return result


def path_under(path: str, roots: Sequence[str]) -> bool:
    """``path`` is one of ``roots`` or lies below one of them (plain string comparison)."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
