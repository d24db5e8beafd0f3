"""The argv that starts a command inside a sandbox of a given profile.

``bwrap`` gets its options directly; the ``unshare`` mode runs ``unshare(1)`` with
corral's own init process (``_unshare_init.py``, run from source) as pid 1, which builds
the same filesystem view with ``mount(2)``, ``chroot``s and drops privileges. In the
``rlimits`` mode the command runs as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from importlib import resources

from corral.sandbox.profile import PYTHON_FLAGS, SandboxMode, SandboxProfile
from corral.sandbox.workspace import SANDBOX_WORKDIR, MountEntry, Workspace

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
"""``PATH`` inside every sandbox."""


def sandbox_environment(workspace: Workspace) -> dict[str, str]:
    """The whole environment of a sandbox's processes (nothing else is inherited)."""
    home = workspace.inside_workdir
    return {
        "PATH": SANDBOX_PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "USER": "sandbox",
    }


@functools.cache
def _source(name: str) -> str:
    return resources.files("corral.sandbox").joinpath(name).read_text(encoding="utf-8")


def script_argv(profile: SandboxProfile, name: str, *args: str) -> list[str]:
    """The argv running corral's sandbox-side script ``name`` from source, with ``args``.

    The scripts use the standard library only, and run as ``python -I -S -c <source>``,
    so they work with any interpreter the sandbox is given and never import corral.
    """
    return [profile.python.executable, *PYTHON_FLAGS, "-c", _source(name), *args]


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
    keep_capabilities: Sequence[str] = (),
) -> tuple[list[str], int | None]:
    """The argv that runs ``argv`` in a sandbox of ``profile``, and the uid to start it as.

    The sandbox has fresh pid, network, IPC and UTS namespaces and the filesystem view
    ``mounts`` (default: ``workspace.mounts(extra_ro_paths)``), starts in ``cwd`` with
    exactly ``environment``, and runs as the workspace's leased uid when it has one.
    File descriptors in ``child_fds`` (open in the caller, passed with ``pass_fds``)
    reach ``argv``; the ``unshare`` sandbox's init closes its own copies of them.

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
            keeps them when run as root; the ``unshare`` sandbox's init always drops them).
        read_only_root: make bwrap's root directory read-only too, as the ``unshare``
            sandbox's init always does (the mounts keep their own modes).
        keep_capabilities: run ``argv`` as root inside with these capabilities only
            (names such as ``"CAP_SETUID"``) instead of as the workspace's uid: a fork
            server that drops each of its children to that uid itself
            (:mod:`corral.sandbox.forkserver`). Only for the strategies that run as real
            root (``privileged``, ``root``), which :func:`keeps_capabilities` names.

    Returns:
        ``(argv, uid)``: start the argv as ``uid`` (None: as corral itself). In rlimits
        mode the argv is ``argv`` unchanged.
    """
    uid = workspace.uid
    if keep_capabilities and not keeps_capabilities(profile):
        raise ValueError(f"a {profile.describe()} sandbox cannot keep capabilities")
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
        if keep_capabilities:
            command += ["--cap-drop", "ALL"]
            for name in keep_capabilities:
                command += ["--cap-add", name]
            return [*command, "--", *argv], None
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
    init_config = {
        "root": str(workspace.root / "root"),
        "mounts": [dataclasses.asdict(m) for m in view],
        "empty_dir": str(workspace.root / "empty"),
        "empty_file": str(workspace.root / "empty-file"),
        "cwd": cwd,
        "uid": None if keep_capabilities else uid,
        "keep_caps": [CAPABILITIES[name] for name in keep_capabilities],
        "argv": argv,
        "env": environment,
        "close_fds": list(child_fds),
    }
    init = script_argv(profile, "_unshare_init.py", json.dumps(init_config))
    return [*command, "--", *init], None


CAPABILITIES = {"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7}
"""The capabilities a sandbox may keep (``keep_capabilities``), by number."""


def keeps_capabilities(profile: SandboxProfile) -> bool:
    """Whether sandboxes of ``profile`` can run a process as root with a few capabilities
    while the agent's code runs as a leased uid (a fork server's requirement): the
    namespace modes started by real root with a uid range."""
    return profile.strategy in ("privileged", "root") and profile.uid_range is not None


def _bwrap_mount(entry: MountEntry, workspace: Workspace) -> list[str]:
    if entry.kind == "dir":
        return ["--perms", "0755", "--dir", entry.target]
    if entry.kind == "symlink":
        return ["--symlink", entry.source, entry.target]
    if entry.kind == "empty":
        mask = workspace.root / ("empty" if os.path.isdir(entry.source) else "empty-file")
        return ["--ro-bind", str(mask), entry.target]
    return ["--ro-bind" if entry.kind == "ro" else "--bind", entry.source, entry.target]
