"""A cold sandboxed worker: a sandbox of its own, started for one worker and killed with it.

A :class:`SandboxProcess` starts corral's worker (``_worker.py``, from source) as the
main process of a fresh sandbox of one profile around a
:class:`~corral.sandbox.workspace.Workspace`, and talks to it through
:class:`~corral.sandbox.channel.WorkerChannel`. Killing it kills the sandbox's whole
process group and, with a leased uid, every process of that uid. This is how every mode
runs code without a warm sandbox (:mod:`corral.sandbox.forkserver` is the warm way).

Thread safety: nothing here holds global mutable state. Every file descriptor is
close-on-exec except the ones passed to a sandbox explicitly, so concurrently spawned
sandboxes never inherit each other's pipes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Sequence

from corral.sandbox.channel import Status, WorkerChannel
from corral.sandbox.command import sandbox_command, sandbox_environment, script_argv
from corral.sandbox.limits import SandboxLimits
from corral.sandbox.profile import SandboxError, SandboxMode, SandboxProfile
from corral.sandbox.uids import kill_uid
from corral.sandbox.workspace import Workspace

_KILL_TIMEOUT = 30.0


class SandboxProcess(WorkerChannel):
    """One sandboxed worker process, started (and awaited) by the constructor.

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
        super().__init__(profile, workspace, limits)
        self._reaped = False
        self._pidfd: int | None = None
        self._lifeline_w = -1
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        lifeline_r, self._lifeline_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._open(request_w, reply_r, out_r, err_r)
        child_fds = (request_r, reply_w, lifeline_r)
        config = {
            **self.worker_config(cpu_hard),
            "request_fd": request_r,
            "reply_fd": reply_w,
            "lifeline_fd": lifeline_r,
        }
        worker_argv = script_argv(profile, "_worker.py", json.dumps(config))
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
                env=sandbox_environment(workspace),
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
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
        except OSError:
            self._pidfd = None
        self._await_ready()

    # -- construction helpers ---------------------------------------------------------

    def _command(
        self, worker_argv: list[str], child_fds: Sequence[int], extra_ro_paths: Sequence[str]
    ) -> tuple[list[str], int | None]:
        """The argv to run and the uid to run it as (None: corral's own)."""
        return sandbox_command(
            self.profile,
            self.workspace,
            worker_argv,
            sandbox_environment(self.workspace),
            child_fds=child_fds,
            extra_ro_paths=extra_ro_paths,
        )

    # -- how it ends --------------------------------------------------------------------

    def _exit_fd(self) -> int | None:
        return self._pidfd

    def _raw_status(self) -> Status | None:
        """Read without reaping the leader, so its pid (and group) stays reserved."""
        if self._reaped:
            code = self._proc.returncode
            return ("signal", -code) if code < 0 else ("exit", code)
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped behind our back: it is gone, however it ended
            return ("exit", 0)
        if info is None:
            return None
        exited = info.si_code == os.CLD_EXITED
        return ("exit", info.si_status) if exited else ("signal", info.si_status)

    def _terminate(self) -> None:
        if not hasattr(self, "_proc"):
            return
        with self._lock:
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

    def _close_fds(self) -> None:
        super()._close_fds()
        for name in ("_lifeline_w", "_pidfd"):
            fd = getattr(self, name, None)
            if fd is not None and fd >= 0:
                setattr(self, name, None if name == "_pidfd" else -1)
                with contextlib.suppress(OSError):
                    os.close(fd)
