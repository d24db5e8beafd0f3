"""A warm sandbox: namespaces, a workspace and a fork server that outlive their workers.

Starting a sandbox costs a ``bwrap`` (or ``unshare``) and an interpreter: tens of
milliseconds of CPU. A :class:`WarmSandbox` pays that once and then runs each worker as
a ``fork`` of a zygote that lives in the sandbox (``_worker.py``'s :class:`Zygote`): a
:class:`ForkedWorker` is ready in about a millisecond, before an action asks for it.

What keeps one worker's run from reaching the next, and one episode from the next:

* The zygote never runs the agent's code. It runs as root inside the sandbox with
  ``CAP_SETUID``, ``CAP_SETGID`` and ``CAP_KILL`` only; every worker drops to the
  workspace's leased uid before it reads a request, so the agent can neither signal,
  trace nor read the zygote, and inherits nothing of an earlier worker (a worker is a
  fresh copy of the zygote: its modules, environment and descriptors).
* After a worker, :meth:`WarmSandbox.sweep` kills every process of the agent (one
  ``kill(-1)`` in the sandbox's pid namespace, which spares pid 1 and the zygote) and
  waits until none is left, fork bombs included.
* Between episodes, :meth:`WarmSandbox.recycle` sweeps, empties the working directory
  and resets its root (mode, owner, times, extended attributes), and has the uid remove
  what it could leave in the kernel: System V IPC objects and its keyrings (POSIX
  message queues it cannot create). Only a sandbox whose recycling found nothing amiss is
  used again; any problem (a process that survived, an object that could not be removed,
  an unknown machine for ``keyctl``) retires it.

What a reused sandbox does carry from one episode to the next: counters, not data —
the pid namespace's next pid, the tmpfs's inode numbers, the leased uid itself.

Warm sandboxes need the namespace modes started by real root with a uid range
(:func:`~corral.sandbox.command.keeps_capabilities`): there the zygote's identity differs
from the agent's. Elsewhere every worker is a cold
:class:`~corral.sandbox.process.SandboxProcess`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

from corral.sandbox import _worker
from corral.sandbox.channel import Status, WorkerChannel
from corral.sandbox.command import (
    keeps_capabilities,
    sandbox_command,
    sandbox_environment,
    script_argv,
)
from corral.sandbox.limits import SandboxLimits
from corral.sandbox.profile import SandboxError, SandboxProfile
from corral.sandbox.uids import kill_uid
from corral.sandbox.workspace import Workspace

ZYGOTE_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL")
"""What the zygote keeps of root: becoming the sandbox uid in each worker, and killing
the agent's processes (in the sandbox's pid namespace, the only ones it can name)."""
_KILL_TIMEOUT = 30.0


class WarmSandbox:
    """One long-lived sandbox with its workspace and fork server (see the module docstring).

    One owner at a time (an environment's episode, or the pool between episodes) calls
    its methods; :meth:`sweep` and :meth:`kill` may also come from another thread.

    Args:
        profile: a profile for which :func:`~corral.sandbox.command.keeps_capabilities`.
        limits: the limits of every worker it runs (and its workspace's disk quota).
        hidden_paths / workdir_root / extra_ro_paths: as for a cold sandbox.

    Raises:
        SandboxError: the sandbox or its fork server did not start.
        ValueError: ``profile`` cannot run a fork server.
    """

    def __init__(
        self,
        profile: SandboxProfile,
        limits: SandboxLimits,
        hidden_paths: Sequence[str],
        workdir_root: str | None = None,
        extra_ro_paths: Sequence[str] = (),
    ) -> None:
        if not keeps_capabilities(profile):
            raise ValueError(f"a {profile.describe()} sandbox cannot run a fork server")
        self.profile = profile
        self.limits = limits
        self.extra_ro_paths = tuple(extra_ro_paths)
        self.episodes = 0
        """Episodes this sandbox was recycled after."""
        self._control_lock = threading.Lock()
        self._exits: dict[int, Status] = {}
        self._control: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._next: ForkedWorker | None = None
        self._broken = False
        self.workspace = Workspace(
            profile, hidden_paths, workdir_root, max_disk_bytes=limits.max_disk_bytes
        )
        try:
            self._start()
        except BaseException:
            self.workspace.close()
            raise

    # -- the fork server ----------------------------------------------------------------

    def _start(self) -> None:
        """Start the sandbox and its zygote; return once the zygote said it is ready."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {"zygote": True, "control_fd": child.fileno()}
        argv, user = sandbox_command(
            self.profile,
            self.workspace,
            script_argv(self.profile, "_worker.py", json.dumps(config)),
            sandbox_environment(self.workspace),
            child_fds=[child.fileno()],
            extra_ro_paths=self.extra_ro_paths,
            # Root without CAP_DAC_OVERRIDE cannot enter the uid's 0700 directory; the
            # workers change into it themselves once they are that uid.
            cwd="/",
            keep_capabilities=ZYGOTE_CAPABILITIES,
        )
        log_path = self.workspace.root / "forkserver.log"
        try:
            with open(log_path, "wb") as log:
                self._process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=[child.fileno()],
                    close_fds=True,
                    start_new_session=True,
                    cwd=str(self.workspace.root),
                    env=sandbox_environment(self.workspace),
                    user=user,
                )
        except OSError as exc:
            parent.close()
            raise SandboxError(f"cannot start the {self.profile.mode} sandbox: {exc}") from exc
        finally:
            child.close()
        self._control = parent
        self._broken = False
        self._exits.clear()
        try:
            ready = self._receive(time.monotonic() + self.limits.start_timeout, "ready")
        except SandboxError as exc:
            self._hard_kill()
            detail = log_path.read_text(errors="replace").strip()[-2000:]
            raise SandboxError(f"{exc}: {detail or 'no error output'}") from None
        prefix = os.path.realpath(str(ready.get("prefix")))
        if prefix not in self.profile.python.prefixes:
            self._hard_kill()
            raise SandboxError(
                f"the sandbox interpreter found its standard library under {prefix}, not "
                f"{' or '.join(self.profile.python.prefixes)}: part of its installation is "
                "not visible in the sandbox (pass its directories as extra_ro_paths)"
            )

    def _receive(self, deadline: float, wanted: str) -> dict[str, Any]:
        """Read control packets until one of op ``wanted``; exits are recorded on the way.

        The caller holds the control lock (or is the constructor).

        Raises:
            SandboxError: the zygote is gone, broke the protocol, or did not answer in time.
        """
        control = self._control
        if control is None or self._broken:
            raise SandboxError("the sandbox's fork server is gone")
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._broken = True
                raise SandboxError(f"the sandbox's fork server did not answer {wanted!r} in time")
            control.settimeout(remaining)
            try:
                message, fds = _worker.control_receive(control)
            except TimeoutError:
                continue
            except (OSError, _worker.ProtocolViolation) as exc:
                self._broken = True
                raise SandboxError(f"the sandbox's fork server failed: {exc}") from None
            for fd in fds:  # the zygote never sends descriptors
                os.close(fd)
            if message is None:
                self._broken = True
                raise SandboxError("the sandbox's fork server exited")
            if message["op"] == "exited":
                self._record_exit(message)
            elif message["op"] == wanted:
                return message
            else:
                self._broken = True
                raise SandboxError(f"the fork server sent {message['op']!r}, not {wanted!r}")

    def _record_exit(self, message: dict[str, Any]) -> None:
        kind, value = message["status"]
        self._exits[int(message["pid"])] = ("signal" if kind == "signal" else "exit", int(value))

    def _request(
        self, message: dict[str, Any], wanted: str, fds: Sequence[int] = ()
    ) -> dict[str, Any]:
        """Send one request and wait for its reply (under the control lock).

        Raises:
            SandboxError: the zygote did not answer (the sandbox is then killed whole).
        """
        with self._control_lock:
            try:
                if self._control is None or self._broken:
                    raise SandboxError("the sandbox's fork server is gone")
                try:
                    self._control.settimeout(self.limits.start_timeout)
                    _worker.control_send(self._control, message, list(fds))
                except OSError as exc:
                    self._broken = True
                    raise SandboxError(f"the sandbox's fork server is gone: {exc}") from None
                return self._receive(time.monotonic() + self.limits.start_timeout, wanted)
            except SandboxError:
                self._hard_kill()
                raise

    def exit_status(self, pid: int) -> Status | None:
        """How worker ``pid`` ended, if the zygote said so (or is gone); never blocks."""
        status = self._exits.get(pid)
        if status is not None:
            return status
        if not self._control_lock.acquire(blocking=False):
            return None  # another thread is talking to the zygote; ask again later
        try:
            if self._control is not None:
                self._control.setblocking(False)
            while self._control is not None and not self._broken:
                try:
                    message, fds = _worker.control_receive(self._control, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except (OSError, _worker.ProtocolViolation):
                    self._broken = True
                    break
                for fd in fds:
                    os.close(fd)
                if message is None:
                    self._broken = True
                elif message["op"] == "exited":
                    self._record_exit(message)
                else:  # no request is waiting for a reply: the zygote is confused
                    self._broken = True
        finally:
            self._control_lock.release()
        status = self._exits.get(pid)
        if status is None and self._broken:
            return ("signal", signal.SIGKILL)  # the sandbox is gone, and the worker with it
        return status

    def forget(self, pid: int) -> None:
        """Drop what is known of worker ``pid`` (it is closed)."""
        self._exits.pop(pid, None)

    @property
    def control_fd(self) -> int | None:
        """The control socket's descriptor (readable when the zygote has news)."""
        return None if self._control is None else self._control.fileno()

    @property
    def alive(self) -> bool:
        """The fork server answers (as far as known without asking it)."""
        return not self._broken and self._process is not None and self._process.poll() is None

    # -- workers --------------------------------------------------------------------------

    def worker(self, cpu_hard: int) -> ForkedWorker:
        """A ready worker: the one forked ahead of time, or a new one.

        Its lifetime CPU limit is lowered to ``cpu_hard`` before it runs anything (one
        forked ahead of time was given the largest any episode may need).

        Raises:
            SandboxError: no worker could be started (the sandbox is then broken).
        """
        worker, self._next = self._next, None
        if worker is None or not worker.usable():
            if worker is not None:
                worker.close()
            if not self.alive:
                self.restart()
            worker = self._spawn({"op": "spawn"}, cpu_hard, "spawned")
        worker.cpu_hard = cpu_hard
        worker.ensure_ready()
        return worker

    def worker_ahead(self, cpu_hard: int) -> None:
        """Fork a worker now for the next :meth:`worker` call (a spare sandbox's).

        Raises:
            SandboxError: it could not be started.
        """
        if self._next is None:
            self._next = self._spawn({"op": "spawn"}, cpu_hard, "spawned")

    def _spawn(self, message: dict[str, Any], cpu_hard: int, wanted: str) -> ForkedWorker:
        """Send ``message`` with a new worker's configuration and pipes attached."""
        worker = ForkedWorker(self)
        assert self.workspace.uid is not None  # keeps_capabilities() implies a leased uid
        message = {
            **message,
            "config": worker.worker_config(cpu_hard),
            "uid": self.workspace.uid,
        }
        try:
            reply = self._request(message, wanted, worker.child_fds())
        except BaseException:
            worker.close()
            raise
        finally:
            worker.release_child_fds()
        worker.pid = int(reply["pid"])
        if reply.get("problems"):
            worker.close()
            raise SandboxError(f"the sandbox could not be swept: {reply['problems']}")
        return worker

    def finish(self, worker: ForkedWorker, next_cpu_hard: int | None) -> None:
        """End ``worker`` (and every process of the agent) and, with ``next_cpu_hard``,
        fork the next worker at once, in the same round trip to the zygote.

        Raises:
            SandboxError: the sandbox could not be swept (it is killed whole then).
        """
        worker.closing()
        if next_cpu_hard is None or not self.alive:
            self.sweep()
            return
        self._next = self._spawn({"op": "sweep"}, next_cpu_hard, "swept")

    def sweep(self) -> None:
        """Kill every process of the agent and wait until none is left. Any thread.

        Raises:
            SandboxError: processes survived, or the zygote did not answer; the whole
                sandbox is killed then (nothing of the agent survives either way).
        """
        if not self.alive:
            self._hard_kill()
            return
        reply = self._request({"op": "sweep"}, "swept")
        for pid, (kind, value) in reply["exits"]:
            self._exits[int(pid)] = ("signal" if kind == "signal" else "exit", int(value))
        if reply["problems"]:
            self._hard_kill()
            raise SandboxError(f"the sandbox could not be swept: {reply['problems']}")

    def recycle(self, cpu_hard: int) -> bool:
        """Make the sandbox as good as new for another episode; True if it is.

        Sweeps, scrubs the uid's kernel objects and forks a worker ahead of time (with
        lifetime CPU ``cpu_hard``), all in one round trip to the zygote, then empties the
        working directory and resets its root: no process of the uid is left by then
        (the new worker is still the zygote's identity, and it does not touch the
        directory before its first request). A sandbox that fails any of it must not be
        used again (close it).
        """
        worker, self._next = self._next, None
        if worker is not None:
            worker.closing()
        try:
            if not self.alive:
                return False
            self._next = self._spawn({"op": "scrub"}, cpu_hard, "scrubbed")
            self.workspace.reset()
        except SandboxError:
            return False
        self.episodes += 1
        self._exits.clear()
        return True

    # -- lifecycle ------------------------------------------------------------------------

    def restart(self) -> None:
        """Replace a dead fork server by a new one on the same workspace.

        Raises:
            SandboxError: the new one did not start.
        """
        self._hard_kill()
        self._start()

    def kill(self) -> None:
        """Kill the whole sandbox at once (any thread); it can be restarted."""
        with self._control_lock:
            self._hard_kill()

    def _hard_kill(self) -> None:
        """Kill the sandbox's outermost process (its namespaces die with it) and every
        process of the uid; close the control socket."""
        self._broken = True
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            try:
                process.wait(timeout=_KILL_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise SandboxError(
                    f"sandbox process {process.pid} survived SIGKILL for {_KILL_TIMEOUT:g} s"
                ) from None
        if self.workspace.uid is not None and not self.workspace.closed:
            kill_uid(self.workspace.uid, self.profile.kill)
        if self._control is not None:
            self._control.close()
            self._control = None

    def close(self) -> None:
        """Kill the sandbox and delete its workspace (idempotent)."""
        worker, self._next = self._next, None
        if worker is not None:
            worker.closing()
        try:
            self.kill()
        finally:
            self.workspace.close()


class ForkedWorker(WorkerChannel):
    """A worker forked by a :class:`WarmSandbox`'s zygote.

    Its exit is reported by the zygote; killing it sweeps the sandbox (every process of
    the agent goes, the zygote stays).
    """

    def __init__(self, sandbox: WarmSandbox) -> None:
        super().__init__(sandbox.profile, sandbox.workspace, sandbox.limits)
        self.sandbox = sandbox
        self.pid: int | None = None
        self.cpu_hard: int | None = None
        """Sent with the first request: the worker lowers its lifetime CPU limit to it."""
        self._ready = False
        self._final: Status | None = None
        self._child: list[int] = []
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._child = [request_r, reply_w, out_w, err_w]
        self._open(request_w, reply_r, out_r, err_r)

    def child_fds(self) -> list[int]:
        """The worker's ends of its pipes, to send to the zygote."""
        return list(self._child)

    def release_child_fds(self) -> None:
        """Close our copies of the worker's ends (sent, or no longer needed)."""
        for fd in self._child:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._child = []

    def ensure_ready(self) -> None:
        """Wait for the worker's ``ready`` (once).

        Raises:
            SandboxError: it did not start.
        """
        if not self._ready:
            self._await_ready()
            self._ready = True

    def usable(self) -> bool:
        """Alive, and either ready or not known to have failed."""
        return self.pid is not None and self.alive()

    def request_extras(self) -> dict[str, Any]:
        """The first request lowers the worker's lifetime CPU limit (see ``cpu_hard``)."""
        extras = {} if self.cpu_hard is None else {"cpu_hard": self.cpu_hard}
        self.cpu_hard = None
        return extras

    def closing(self) -> None:
        """The sandbox ends this worker itself: just release the pipes."""
        self._closed = True
        with self._lock:
            if self._killed_by is None:
                self._killed_by = "closed"
        self._close_fds()
        self.release_child_fds()
        if self.pid is not None:
            # How it ended stays known (for the observation's account of it).
            self._final = self.sandbox.exit_status(self.pid)
            self.sandbox.forget(self.pid)

    def _exit_fd(self) -> int | None:
        return self.sandbox.control_fd

    def _raw_status(self) -> Status | None:
        if self._closed:
            return self._final or ("signal", signal.SIGKILL)
        if self.pid is None:
            return None
        return self.sandbox.exit_status(self.pid)

    def _terminate(self) -> None:
        # A failed sweep killed the sandbox whole: the worker is gone all the same.
        with contextlib.suppress(SandboxError):
            self.sandbox.sweep()
