"""Leased sandbox uids: exclusive across threads and processes, swept clean when taken.

When corral runs as root, each sandbox runs as a uid of its own from a high range
(:data:`DEFAULT_UID_RANGE`), so its process count (RLIMIT_NPROC) and its signals reach
only itself, and every process it left behind can be found and killed by uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from corral.sandbox.profile import SandboxError

DEFAULT_UID_RANGE = range(1_879_048_192, 1_879_048_192 + 1_000_000)
"""Uids leased to sandboxes when corral runs as root: far above any real or subordinate uid."""


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
