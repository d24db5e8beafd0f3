"""What a sandbox is on this machine: the isolation modes, a working profile, the errors.

A :class:`SandboxProfile` is the result of probing (:mod:`corral.sandbox.probe`): a mode
that was seen to work here, how it is realised and which interpreter runs inside.
"""

from __future__ import annotations

import dataclasses
import enum

from corral.errors import PlatformError

PYTHON_FLAGS = ("-I", "-S", "-B", "-X", "utf8")
"""How every sandboxed interpreter runs: isolated, no site, no bytecode files, UTF-8."""


class SandboxMode(enum.StrEnum):
    """How a sandbox isolates the agent's code (strongest first)."""

    BWRAP = "bwrap"
    """bubblewrap: new pid/net/ipc/uts namespaces and a minimal read-only filesystem."""
    UNSHARE = "unshare"
    """util-linux ``unshare`` and corral's own init process: the same isolation as ``bwrap``."""
    RLIMITS = "rlimits"
    """Resource limits, an unprivileged uid (as root) and Python-level guards only."""


class SandboxError(PlatformError, RuntimeError):
    """The sandbox could not be set up or started (a problem of the machine, not the agent)."""


class SandboxUnavailable(SandboxError):
    """No requested sandbox mode works on this machine; the message says why for each."""


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
        tmpfs_workspaces: working directories can be size-limited tmpfs mounts (the
            namespace modes, where corral may mount); otherwise their disk use is polled
            (see :mod:`corral.sandbox.quota`).
    """

    mode: SandboxMode
    strategy: str
    python: PythonInfo
    tool: str | None
    setpriv: str | None
    uid_range: range | None
    kill: str | None
    tmpfs_workspaces: bool = False

    def describe(self) -> str:
        """One line for logs and state: mode, strategy and interpreter."""
        return f"{self.mode} ({self.strategy}, python {self.python.executable})"
