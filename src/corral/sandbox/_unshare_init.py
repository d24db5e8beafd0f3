"""Pid 1 of an ``unshare`` sandbox: builds the filesystem view, drops privileges, runs the command.

Like ``_worker.py`` this runs from source (``python -I -S -c <source> <config JSON>``), with
the standard library only, as the first process of fresh mount, pid, network, IPC and UTS
namespaces created by ``unshare(1)``. It is root there: real root when corral runs as
root, or the mapped root of a new user namespace otherwise.

It mounts a small tmpfs as the new root, bind-mounts the entries of ``config["mounts"]``
into it (read-only unless marked writable; ``empty`` entries hide a path behind an empty
read-only directory or file), adds ``/proc`` (of the new pid namespace) and a minimal
``/dev``, makes the new root read-only, ``chroot``s into it and names the host ``sandbox``.
It then forks: the child drops to ``config["uid"]`` (real root) or sheds every capability
(user namespace), sets ``no_new_privs`` and ``exec``s the command (a worker, or a whole
server); pid 1 stays behind to reap orphans, and exits with the command's status
(``128 + signal`` when it was killed by a signal). When pid 1 exits the kernel kills
every process left in the namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from typing import Any

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
# statvfs flags that a remount must repeat: the kernel refuses to clear "locked" flags
# of a mount inherited from a more privileged namespace.
_STATVFS_TO_MS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: 0x400,
    os.ST_NODIRATIME: 0x800,
    os.ST_RELATIME: 0x200000,
}
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """``mount(2)``."""
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def remount_read_only(target: str) -> None:
    """Make the mount at ``target`` read-only, keeping its other flags."""
    current = os.statvfs(target).f_flag
    keep = sum(ms for st, ms in _STATVFS_TO_MS.items() if current & st)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def _submounts(target: str) -> list[str]:
    """Mount points strictly below ``target`` (from /proc/self/mountinfo)."""
    prefix = target.rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                found.append(point)
    return found


def _make_mountpoint(path: str, like: str) -> None:
    if os.path.isdir(like):
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            with open(path, "w"):
                pass


def build_root(root: str, mounts: list[dict[str, Any]], empty_dir: str, empty_file: str) -> None:
    """Assemble the sandbox's filesystem under ``root``."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for entry in mounts:
        kind, source, target = entry["kind"], entry["source"], root + entry["target"]
        if kind == "dir":
            os.makedirs(target, mode=0o755, exist_ok=True)
            os.chmod(target, 0o755)
            continue
        if kind == "symlink":
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(source, target)
            continue
        if kind == "empty":
            source = empty_dir if os.path.isdir(target) or os.path.isdir(source) else empty_file
        _make_mountpoint(target, source)
        mount(source, target, None, MS_BIND | MS_REC)
        if kind != "rw":
            remount_read_only(target)
            for point in _submounts(target):
                remount_read_only(point)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    dev = root + "/dev"
    os.makedirs(dev, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        _make_mountpoint(f"{dev}/{name}", f"/dev/{name}")
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    remount_read_only(dev)
    remount_read_only(root)


def drop_capabilities() -> None:
    """Shed every capability for good (used when "root" is only a user-namespace root)."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient caps")
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def keep_only_capabilities(keep: list[int]) -> None:
    """Stay root but with the capabilities ``keep`` only (a fork server that drops its
    children to the sandbox uid itself); none can be regained."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if cap not in keep:
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient caps")
    mask = sum(1 << cap for cap in keep)  # every kept capability is below 32
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(mask, mask, 0, 0, 0, 0)  # effective, permitted, inheritable
    _check(_libc.capset(header, data), "capset")


def become_sandbox_user(uid: int | None, keep_caps: list[int]) -> None:
    """Switch to the sandbox's unprivileged identity (or a root with ``keep_caps`` only),
    irreversibly."""
    if keep_caps:
        keep_only_capabilities(keep_caps)
    elif uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:
        drop_capabilities()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def main(argv: list[str]) -> int:
    """Entry point: ``argv[1]`` is the JSON config written by the parent."""
    config = json.loads(argv[1])
    os.umask(0o022)
    socket.sethostname("sandbox")
    build_root(config["root"], config["mounts"], config["empty_dir"], config["empty_file"])
    os.chroot(config["root"])
    os.chdir(config["cwd"])
    worker = os.fork()
    if worker == 0:
        try:
            os.setsid()
            become_sandbox_user(config["uid"], config.get("keep_caps") or [])
            argv_ = config["argv"]
            os.execve(argv_[0], argv_, config["env"])
        except BaseException as exc:
            print(f"corral sandbox init: {exc}", file=sys.stderr, flush=True)
        os._exit(127)
    for key in config["close_fds"]:
        os.close(int(key))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == worker:
            if os.WIFSIGNALED(status):
                return 128 + os.WTERMSIG(status)
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
