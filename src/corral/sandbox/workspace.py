"""One episode's private working directory and the filesystem view built around it.

Thread safety: a :class:`Workspace` belongs to one owner; uid leases are exclusive across
threads and processes (:mod:`corral.sandbox.uids`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from corral.sandbox.profile import SandboxError, SandboxMode, SandboxProfile
from corral.sandbox.uids import UidLease, kill_uid

SANDBOX_WORKDIR = "/workspace"
"""Where the episode's working directory appears inside the ``bwrap``/``unshare`` sandboxes."""
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
