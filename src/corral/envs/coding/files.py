"""A coding episode's working directory as data: captured for a snapshot, written back
into a fresh sandbox's directory on restore.

What is carried: regular files (their bytes, permission bits and modification time),
directories and symbolic links (their target, as text: a link is recreated, never
followed). Anything else in the directory (a FIFO, a socket) cannot be carried and
refuses the snapshot with :class:`~corral.errors.SnapshotUnsupported` naming it, rather
than losing it silently. What is not carried: owners (a restored entry belongs to the
new sandbox's uid), set-id and sticky bits, extended attributes, hard links (each link
becomes a file of its own) and the directory's own mode and times.

Both directions run in corral's process, as root where the sandbox runs as a leased
uid, on a directory the agent controls (capture) or that a client's snapshot describes
(restore), so neither trusts a path: capture never follows a link nor opens anything
but a regular file (``O_NOFOLLOW``, checked again on the open descriptor); restore
accepts only relative, normalised paths whose every parent is a directory the same
snapshot creates, and writes through directory descriptors opened with ``O_NOFOLLOW``.
Capture runs between actions, when no process of the agent is alive to change the
directory under it (every action's processes are killed when it ends).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import ConfigDict, Field

from corral.contract import WireModel
from corral.errors import BadSnapshot, SnapshotTooLarge, SnapshotUnsupported

MAX_PATH_CHARS = 4096
"""Longest path (and symbolic link target) an entry may have."""
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device"}


class WorkspaceEntry(WireModel):
    """One entry of the working directory.

    Attributes:
        path: relative to the working directory, ``/``-separated, normalised.
        kind: ``file``, ``dir`` or ``symlink``.
        mode: permission bits (``0o777`` at most).
        mtime_ns: modification time, nanoseconds since the epoch (files and directories).
        data: a file's contents.
        target: a symbolic link's target, as the link holds it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    kind: Literal["file", "dir", "symlink"]
    mode: int = Field(default=0o600, ge=0, le=0o777)
    mtime_ns: int = Field(default=0, ge=0)
    data: bytes = b""
    target: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_CHARS)


def capture(directory: Path, max_bytes: int, max_entries: int) -> list[WorkspaceEntry]:
    """The entries of ``directory``, parents before their contents, names in order.

    Raises:
        SnapshotTooLarge: the files hold more than ``max_bytes`` together, or there are
            more than ``max_entries`` entries.
        SnapshotUnsupported: an entry cannot be carried (a FIFO, a socket) or read.
    """
    entries: list[WorkspaceEntry] = []
    total = 0
    for relative, path, info in _walk(directory):
        if len(entries) >= max_entries:
            raise SnapshotTooLarge(
                f"the working directory holds more than {max_entries:,} entries, the most a "
                "snapshot of this environment carries",
                details={"limit_entries": max_entries},
            )
        mode = stat.S_IMODE(info.st_mode) & 0o777
        if stat.S_ISDIR(info.st_mode):
            entries.append(
                WorkspaceEntry(path=relative, kind="dir", mode=mode, mtime_ns=info.st_mtime_ns)
            )
        elif stat.S_ISLNK(info.st_mode):
            entries.append(WorkspaceEntry(path=relative, kind="symlink", target=os.readlink(path)))
        elif stat.S_ISREG(info.st_mode):
            data = _read_file(path, relative, max_bytes - total, max_bytes)
            total += len(data)
            entries.append(
                WorkspaceEntry(
                    path=relative, kind="file", mode=mode, mtime_ns=info.st_mtime_ns, data=data
                )
            )
        else:
            what = _KINDS.get(stat.S_IFMT(info.st_mode), "a special file")
            raise SnapshotUnsupported(
                f"the working directory's {relative!r} is {what}: a snapshot carries regular "
                "files, directories and symbolic links only",
                details={"path": relative},
            )
    return entries


def _walk(directory: Path) -> Iterator[tuple[str, str, os.stat_result]]:
    """(relative path, host path, lstat) of every entry below ``directory``, depth first,
    names sorted; never through a symbolic link."""
    pending = [("", str(directory))]
    while pending:
        prefix, host = pending.pop()
        try:
            with os.scandir(host) as listing:
                found = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            raise _unreadable(prefix or ".", exc) from None
        below = []
        for entry in found:
            relative = f"{prefix}{entry.name}"
            info = entry.stat(follow_symlinks=False)
            yield relative, entry.path, info
            if stat.S_ISDIR(info.st_mode):
                below.append((relative + "/", entry.path))
        pending.extend(reversed(below))


def _read_file(path: str, relative: str, budget: int, limit: int) -> bytes:
    """A regular file's bytes, at most ``budget`` of them (``limit``: the whole bound)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _unreadable(relative, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since it was listed
            raise SnapshotUnsupported(
                f"the working directory's {relative!r} changed while it was captured",
                details={"path": relative},
            )
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, max(budget - size, 0) + 1)):
            chunks.append(chunk)
            size += len(chunk)
            if size > budget:
                raise SnapshotTooLarge(
                    "the working directory's files hold more than the snapshot limit of "
                    f"{limit:,} bytes (at {relative!r})",
                    details={"path": relative, "limit_bytes": limit},
                )
        return b"".join(chunks)
    finally:
        os.close(fd)


def _unreadable(relative: str, exc: OSError) -> SnapshotUnsupported:
    return SnapshotUnsupported(
        f"the working directory's {relative!r} cannot be read for a snapshot: {exc.strerror}",
        details={"path": relative},
    )


def check(entries: Sequence[WorkspaceEntry], max_bytes: int, max_entries: int) -> None:
    """Refuse entries no capture could have produced, before anything is written.

    Raises:
        BadSnapshot: a path that is absolute, not normalised or leaves the directory;
            a path given twice; an entry whose parent is not a directory of the
            snapshot; a link without a target or a file with one; more than
            ``max_bytes`` or ``max_entries``.
    """
    if len(entries) > max_entries:
        raise BadSnapshot(
            f"the snapshot's workspace has {len(entries):,} entries; this environment "
            f"takes at most {max_entries:,}",
            details={"field": "files"},
        )
    total = sum(len(e.data) for e in entries)
    if total > max_bytes:
        raise BadSnapshot(
            f"the snapshot's workspace files hold {total:,} bytes; this environment takes "
            f"at most {max_bytes:,}",
            details={"field": "files"},
        )
    directories: set[str] = set()
    seen: set[str] = set()
    for entry in entries:
        path = entry.path
        parts = path.split("/")
        if (
            "\0" in path
            or path.startswith("/")
            or any(part in ("", ".", "..") for part in parts)
            or str(PurePosixPath(path)) != path
        ):
            raise _bad_entry(path, "is not a normalised path inside the working directory")
        if path in seen:
            raise _bad_entry(path, "is given twice")
        parent = "/".join(parts[:-1])
        if parent and parent not in directories:
            raise _bad_entry(path, "comes before (or without) its parent directory")
        if (entry.kind == "symlink") != (entry.target is not None):
            raise _bad_entry(path, "has a target but is no link, or is a link without one")
        if entry.kind != "file" and entry.data:
            raise _bad_entry(path, "holds data but is no file")
        if entry.target is not None and "\0" in entry.target:
            raise _bad_entry(path, "has a target with a NUL character")
        seen.add(path)
        if entry.kind == "dir":
            directories.add(path)


def _bad_entry(path: str, why: str) -> BadSnapshot:
    return BadSnapshot(
        f"the snapshot's workspace entry {path[:200]!r} {why}", details={"field": "files"}
    )


def write(directory: Path, entries: Sequence[WorkspaceEntry], owner: int | None) -> None:
    """Create ``entries`` (checked by :func:`check`) in the empty ``directory``, owned by
    uid and gid ``owner`` (None: left to corral's own user).

    Directories get their modes and times last, deepest first, so that creating their
    contents changes neither.

    Raises:
        BadSnapshot: the files do not fit the directory's disk quota.
        OSError: the directory could not be written.
    """
    descriptors: dict[str, int] = {}
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptors[""] = os.open(directory, flags)
    try:
        for entry in entries:
            parent, _, name = entry.path.rpartition("/")
            at = descriptors[parent]
            if entry.kind == "dir":
                os.mkdir(name, 0o700, dir_fd=at)
                descriptors[entry.path] = os.open(name, flags, dir_fd=at)
                if owner is not None:
                    os.fchown(descriptors[entry.path], owner, owner)
            elif entry.kind == "symlink":
                assert entry.target is not None  # check() made sure
                os.symlink(entry.target, name, dir_fd=at)
                if owner is not None:
                    os.chown(name, owner, owner, dir_fd=at, follow_symlinks=False)
            else:
                _write_file(at, name, entry, owner)
        for entry in reversed(entries):
            if entry.kind == "dir":
                fd = descriptors[entry.path]
                os.fchmod(fd, entry.mode)
                os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise BadSnapshot(
                f"the snapshot's workspace files do not fit this sandbox's disk: {exc.strerror}",
                details={"field": "files"},
            ) from None
        raise
    finally:
        for fd in descriptors.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _write_file(at: int, name: str, entry: WorkspaceEntry, owner: int | None) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=at)
    try:
        view = memoryview(entry.data)
        while view:
            view = view[os.write(fd, view) :]
        if owner is not None:
            os.fchown(fd, owner, owner)
        os.fchmod(fd, entry.mode)
        os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
    finally:
        os.close(fd)


__all__ = ["MAX_PATH_CHARS", "WorkspaceEntry", "capture", "check", "write"]
