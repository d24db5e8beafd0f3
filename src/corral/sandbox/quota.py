"""The disk quota of a workspace: a size-limited tmpfs where corral may mount one, else polling.

Two ways to bound what a sandbox writes into its working directory (``max_disk_bytes``):

* ``tmpfs`` (the namespace modes, when corral runs as root): the directory is a tmpfs
  mounted with ``size=`` and ``nr_inodes=``. The kernel refuses the byte (ENOSPC) or the
  file past the limit; the directory lives in memory (or swap) and is unmounted with the
  workspace.
* ``polled`` (the ``rlimits`` mode, and unprivileged users): the directory stays on the
  host filesystem; RLIMIT_FSIZE stops any single file at the limit and the parent measures
  the directory while the sandbox runs: every :data:`POLL_SECONDS`, or less often when a
  walk of the tree takes long (at most a fifth of the time goes to walking). What is
  written between two measurements can pass the limit, by the sandbox's write rate times
  the interval (tens of MB at page-cache speed).

Either way, :meth:`DiskQuota.exceeded` tells the parent that the limit was reached; the
sandbox is then killed with the ``disk`` outcome and the directory emptied
(:meth:`~corral.sandbox.workspace.Workspace.clear`), so the next action has room again.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Literal

QuotaKind = Literal["tmpfs", "polled"]
"""How a workspace's disk use is bounded (see the module docstring)."""

POLL_SECONDS: dict[QuotaKind, float] = {"tmpfs": 0.05, "polled": 0.02}
"""How often a running sandbox's directory is measured: a tmpfs costs one ``statvfs``, a
polled directory a walk of its tree (then at least four times the last walk's duration)."""
BYTES_PER_FILE = 4096
"""The quota allows one file (or directory) per this many bytes, and at least 1024."""

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(path: Path, size: int, files: int, uid: int, gid: int) -> None:
    """Mount a tmpfs of ``size`` bytes and ``files`` inodes at ``path``, owned by ``uid``.

    Raises:
        OSError: the mount was refused (not root, or no CAP_SYS_ADMIN).
    """
    options = f"size={size},nr_inodes={files},mode=0700,uid={uid},gid={gid}"
    result = _libc().mount(
        b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs on {path}: {os.strerror(code)}")


def unmount(path: Path) -> None:
    """Detach the mount at ``path`` (lazily: it goes once nothing uses it); no error if none."""
    if _libc().umount2(os.fsencode(path), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not a mount point, or no such path
            raise OSError(code, f"unmount {path}: {os.strerror(code)}")


@functools.cache
def tmpfs_mounts_work() -> bool:
    """This process may mount a size-limited tmpfs (tried once on a scratch directory)."""
    if os.geteuid() != 0:
        return False
    scratch = Path(tempfile.mkdtemp(prefix="corral-quota-probe-"))
    try:
        mount_tmpfs(scratch, 1024 * 1024, 64, os.getuid(), os.getgid())
    except OSError:
        return False
    else:
        unmount(scratch)
        return True
    finally:
        with contextlib.suppress(OSError):
            scratch.rmdir()


def file_limit(max_bytes: int) -> int:
    """How many files and directories a quota of ``max_bytes`` allows."""
    return max(1024, max_bytes // BYTES_PER_FILE)


class DiskQuota:
    """The bound on one working directory (``path``): ``max_bytes`` and :func:`file_limit`.

    Create it on an empty directory, call :meth:`mount` (a tmpfs quota mounts there),
    and :meth:`release` when the workspace goes.
    """

    def __init__(self, path: Path, max_bytes: int, kind: QuotaKind) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_files = file_limit(max_bytes)
        self.kind: QuotaKind = kind
        self.interval = POLL_SECONDS[kind]
        """Seconds until the directory should be measured again."""
        self._mounted = False

    def mount(self, uid: int, gid: int) -> None:
        """Mount the tmpfs (``tmpfs`` kind; nothing to do for ``polled``).

        Raises:
            OSError: the mount was refused.
        """
        if self.kind == "tmpfs":
            mount_tmpfs(self.path, self.max_bytes, self.max_files, uid, gid)
            self._mounted = True

    def release(self) -> None:
        """Unmount the tmpfs (its content goes with it); idempotent."""
        if self._mounted:
            unmount(self.path)
            self._mounted = False

    def exceeded(self) -> bool:
        """The directory reached its limit of bytes or of files."""
        if self.kind == "tmpfs":
            try:
                info = os.statvfs(self.path)
            except OSError:
                return False
            # The kernel refuses writes once no block (or inode) is free.
            return info.f_bfree == 0 or info.f_ffree == 0
        started = time.monotonic()
        try:
            return self._measure_exceeds()
        finally:
            spent = time.monotonic() - started
            self.interval = max(POLL_SECONDS["polled"], 4 * spent)

    def _measure_exceeds(self) -> bool:
        """Walk the directory, adding allocated bytes and entries; stop once over a limit."""
        used, files = 0, 0
        seen: set[int] = set()
        pending = [str(self.path)]
        while pending:
            try:
                entries = os.scandir(pending.pop())
            except OSError:
                continue  # removed meanwhile, or made unreadable: its files still count below
            with entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    files += 1
                    if info.st_ino not in seen:
                        seen.add(info.st_ino)
                        used += info.st_blocks * 512
                    if used >= self.max_bytes or files > self.max_files:
                        return True
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(entry.path)
        return False
