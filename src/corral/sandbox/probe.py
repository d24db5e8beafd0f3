"""Which sandbox modes work on this machine: each is tried for real, once per process.

profile = resolve_profile("auto")   # the strongest mode that works, or SandboxUnavailable
available_modes()                   # {mode: None if it works, else the reason}
modes_in_use()                      # the modes resolved in this process (for /health)

**No silent fall to the weak mode.** ``"auto"`` takes a namespace mode (``bwrap``,
``unshare``) or fails: ``rlimits`` guards code at the Python level only (see
:mod:`corral.sandbox`), so it is taken only when asked for by name, with
``allow_weak=True``, or with ``$CORRAL_SANDBOX_ALLOW_WEAK=1`` (how an operator allows it
for a server). A hardened container (no bwrap in the image, user namespaces refused by
its seccomp profile) used to run the coding environment in ``rlimits`` without a word,
while its capacity had been measured under ``bwrap`` (issue 30.16).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Literal

from corral.sandbox.limits import SandboxLimits
from corral.sandbox.process import SandboxProcess
from corral.sandbox.profile import (
    PYTHON_FLAGS,
    PythonInfo,
    SandboxError,
    SandboxMode,
    SandboxProfile,
    SandboxUnavailable,
)
from corral.sandbox.quota import tmpfs_mounts_work
from corral.sandbox.uids import DEFAULT_UID_RANGE
from corral.sandbox.workspace import Workspace

_PROBE_TIMEOUT = 20.0

ALLOW_WEAK_ENV = "CORRAL_SANDBOX_ALLOW_WEAK"
"""``1`` lets ``"auto"`` settle for the ``rlimits`` mode (module docstring)."""

_IN_USE: dict[SandboxMode, str] = {}
"""The modes :func:`resolve_profile` returned in this process, with their strategies."""


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
            [executable, *PYTHON_FLAGS, "-c", script],
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
            tmpfs_workspaces=mode is not SandboxMode.RLIMITS and tmpfs_mounts_work(),
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


def weak_allowed() -> bool:
    """``$CORRAL_SANDBOX_ALLOW_WEAK`` says ``"auto"`` may settle for ``rlimits``."""
    return os.environ.get(ALLOW_WEAK_ENV, "").strip().lower() in ("1", "true", "yes")


def resolve_profile(
    sandbox: SandboxMode | Literal["auto"],
    python: str | None = None,
    uid_range: range | None = DEFAULT_UID_RANGE,
    *,
    allow_weak: bool | None = None,
) -> SandboxProfile:
    """The profile for ``sandbox`` (``"auto"``: the strongest namespace mode that works).

    Args:
        sandbox: a mode, or ``"auto"``.
        python: the sandbox interpreter (default: corral's own).
        uid_range: uids leased to sandboxes when running as root.
        allow_weak: let ``"auto"`` settle for ``rlimits`` (default:
            ``$CORRAL_SANDBOX_ALLOW_WEAK``); naming ``rlimits`` always allows it.

    Raises:
        SandboxUnavailable: the requested mode (or, for ``"auto"``, every namespace mode,
            and ``rlimits`` unless allowed) does not work here; the message gives the
            reason for each and how to allow the weak mode.
    """
    executable = python or default_python()
    weak_ok = sandbox != "auto" or (weak_allowed() if allow_weak is None else allow_weak)
    modes = list(SandboxMode) if sandbox == "auto" else [SandboxMode(sandbox)]
    reasons = []
    for mode in modes:
        if mode is SandboxMode.RLIMITS and not weak_ok:
            reasons.append(
                "rlimits (Python-level guards, no isolation from other sessions or the "
                f"server) is not taken by 'auto' unless allowed: ${ALLOW_WEAK_ENV}=1, "
                "allow_weak=True or sandbox='rlimits'; or run where bwrap or unshare work "
                "(docs/scaling.md, 'The coding environment in a Pod')"
            )
            continue
        result = probe(mode, executable, uid_range)
        if isinstance(result, SandboxProfile):
            _IN_USE.setdefault(result.mode, result.strategy)
            return result
        reasons.append(result)
    raise SandboxUnavailable("no usable sandbox: " + " | ".join(reasons))


def modes_in_use() -> dict[SandboxMode, str]:
    """The modes resolved in this process so far, with their strategies (a server says
    them in ``/health`` and ``/metrics``)."""
    return dict(_IN_USE)


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
