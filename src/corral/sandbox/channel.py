"""Talking to one sandboxed worker: its pipes, its requests, its limits, its verdicts.

A worker is corral's ``_worker.py`` running in a sandbox; the parent speaks its framed
protocol over pipes: ``exec`` runs code in the worker's namespace, ``tests`` calls one of
its functions once per case. :class:`WorkerChannel` enforces the wall clock and the
output caps, watches the disk quota, reads the kernel's verdict (CPU time, signals) from
the exit status, and reports each call as an :mod:`outcome <corral.sandbox.outcomes>`.

How a worker is started and killed is its subclass's: a cold
:class:`~corral.sandbox.process.SandboxProcess` is a sandbox of its own, started per
worker; a :class:`~corral.sandbox.forkserver.ForkedWorker` is forked inside a warm
sandbox that outlives it (:mod:`corral.sandbox.forkserver`).

Thread safety: one thread at a time calls ``execute``/``run_tests``/``close`` (the
owner); ``kill`` may be called from any thread at any moment and makes a running call
return. File descriptors are only closed by ``close``, never under a reader's feet.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

from corral.sandbox import _worker
from corral.sandbox.limits import SandboxLimits
from corral.sandbox.outcomes import CaseOutcome, ExecOutcome, KilledReason, TestsOutcome
from corral.sandbox.profile import SandboxError, SandboxMode, SandboxProfile
from corral.sandbox.uids import processes_of
from corral.sandbox.workspace import Workspace

Status = tuple[Literal["exit", "signal"], int]
"""How a worker ended: ``("exit", code)`` or ``("signal", number)``."""


class _Capture:
    """One phase's output: kept up to ``cap`` bytes per stream, or only counted."""

    def __init__(self, cap: int, keep: bool) -> None:
        self.cap = cap
        self.keep = keep
        self.data = {1: bytearray(), 2: bytearray()}
        self.seen = {1: 0, 2: 0}

    def feed(self, stream: int, chunk: bytes) -> bool:
        """Record a chunk; True once the stream went over the cap."""
        self.seen[stream] += len(chunk)
        if self.keep:
            room = self.cap - len(self.data[stream])
            if room > 0:
                self.data[stream] += chunk[:room]
        return self.seen[stream] > self.cap

    def truncated(self, stream: int) -> bool:
        """More than ``cap`` bytes arrived on ``stream``."""
        return self.seen[stream] > self.cap


class _Ended(Exception):
    """The worker ended (or was killed) while a reply was awaited."""

    def __init__(self, reason: KilledReason) -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerChannel:
    """The parent's side of one worker: its pipes, requests and limits.

    Subclasses start the worker (and then call :meth:`_open` with the parent's ends of
    its pipes), and say how it ends: :meth:`_exit_fd` (a descriptor readable once it
    may have ended), :meth:`_raw_status` (how it ended, if it did) and
    :meth:`_terminate` (kill it and everything it started).
    """

    def __init__(
        self, profile: SandboxProfile, workspace: Workspace, limits: SandboxLimits
    ) -> None:
        self.profile = profile
        self.workspace = workspace
        self.limits = limits
        self.worker_pid: int | None = None
        self._lock = threading.Lock()
        self._killed_by: KilledReason | None = None
        self._closed = False
        self._cleared = False
        self._next_disk_check = 0.0
        self._pending = bytearray()
        # The parent's ends of the worker's pipes (-1 until opened and once closed).
        self._request_w = self._reply_r = self._out_r = self._err_r = -1

    def _open(self, request_w: int, reply_r: int, out_r: int, err_r: int) -> None:
        """Take the parent's ends of the worker's pipes (made non-blocking here)."""
        self._request_w, self._reply_r, self._out_r, self._err_r = request_w, reply_r, out_r, err_r
        for fd in (request_w, reply_r, out_r, err_r):
            os.set_blocking(fd, False)

    # -- what subclasses say ----------------------------------------------------------

    def _exit_fd(self) -> int | None:
        """A descriptor that becomes readable when the worker may have ended (None: poll)."""
        raise NotImplementedError

    def _raw_status(self) -> Status | None:
        """How the worker ended, as the kernel reported it; None while it runs."""
        raise NotImplementedError

    def _terminate(self) -> None:
        """Kill the worker and everything it started; return once they are gone.

        Raises:
            SandboxError: they did not die (stuck in the kernel).
        """
        raise NotImplementedError

    def request_extras(self) -> dict[str, Any]:
        """Fields to add to the next request (a subclass's; none by default)."""
        return {}

    # -- the worker's configuration -----------------------------------------------------

    def worker_config(self, cpu_hard: int) -> dict[str, Any]:
        """The ``_worker.py`` configuration every worker gets (its limits and directory);
        the starter adds the descriptors."""
        rlimits = self.profile.mode is SandboxMode.RLIMITS
        return {
            "workdir": self.workspace.inside_workdir,
            "limits": {
                **self.limits.model_dump(),
                "max_file_bytes": self._max_file_bytes(),
                "cpu_hard": max(cpu_hard, self.limits.cpu_seconds + 1),
                "nproc": self._nproc(),
            },
            "no_new_privs": rlimits,
            "guards": self._guards() if rlimits else None,
        }

    def _nproc(self) -> int:
        """RLIMIT_NPROC for the worker.

        A leased uid or a user namespace gives the sandbox its own process count. In the
        rlimits mode without root the count is shared with every process of the user,
        so the budget is added to what the user already runs (a weaker, racy bound).
        """
        budget = self.limits.max_processes
        if self.profile.mode is SandboxMode.RLIMITS and self.workspace.uid is None:
            return budget + len(processes_of(os.getuid()))
        return budget

    def _max_file_bytes(self) -> int:
        """RLIMIT_FSIZE: no single file may be larger than the whole disk quota."""
        quota = self.workspace.quota
        cap = self.limits.max_file_bytes
        return cap if quota is None else min(cap, quota.max_bytes)

    def _guards(self) -> dict[str, list[str]]:
        devices = [f"/dev/{name}" for name in ("null", "zero", "full", "random", "urandom")]
        return {
            "read": [*self.profile.python.path, *devices],
            "write": [str(self.workspace.host_workdir), "/dev/null"],
            "deny": list(self.workspace.hidden_paths),
        }

    def _await_ready(self) -> None:
        capture = _Capture(self.limits.max_output_bytes, keep=True)
        try:
            message = self._next_message(time.monotonic() + self.limits.start_timeout, capture)
        except _Ended as ended:
            status = self._status_text()
            self.close()
            detail = capture.data[2].decode("utf-8", "replace").strip()[-2000:]
            what = "did not start in time" if ended.reason == "wall_clock" else "failed to start"
            raise SandboxError(
                f"the {self.profile.mode} sandbox {what} ({status}): {detail or 'no error output'}"
            ) from None
        if message.get("op") != "ready":
            self.close()
            raise SandboxError(f"the sandbox sent {message.get('op')!r} instead of 'ready'")
        prefix = os.path.realpath(str(message.get("prefix")))
        if prefix not in self.profile.python.prefixes:
            self.close()
            raise SandboxError(
                f"the sandbox interpreter found its standard library under {prefix}, not "
                f"{' or '.join(self.profile.python.prefixes)}: part of its installation is "
                "not visible in the sandbox (pass its directories as extra_ro_paths)"
            )
        self.worker_pid = int(message["pid"])

    # -- lifecycle --------------------------------------------------------------------

    def alive(self) -> bool:
        """The worker is still running: not killed, and it has not exited."""
        with self._lock:
            if self._killed_by is not None:
                return False
        return self._raw_status() is None

    def kill(self, reason: KilledReason = "closed") -> None:
        """Kill the worker and everything it started. Any thread; idempotent.

        ``reason`` is recorded unless an earlier one was.

        Raises:
            SandboxError: the sandbox's processes did not die (stuck in the kernel).
        """
        with self._lock:
            if self._killed_by is None:
                self._killed_by = reason
        self._terminate()
        if self._killed_by == "disk" and not self._cleared and not self.workspace.closed:
            # A full directory would fail every later action: it starts over, empty.
            self._cleared = True
            self.workspace.clear()

    def close(self) -> None:
        """Kill the worker and release its pipes (the owner thread only)."""
        if self._closed:
            return
        self._closed = True
        self.kill()
        self._close_fds()

    def _close_fds(self) -> None:
        for name in ("_request_w", "_reply_r", "_out_r", "_err_r"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _status(self) -> Status | None:
        """How the worker ended; None if it has not."""
        status = self._raw_status()
        if status is None:
            return None
        kind, value = status
        if kind == "exit" and self.profile.mode is not SandboxMode.RLIMITS and value > 128:
            # bwrap and the unshare init report a worker killed by signal N as 128 + N.
            return ("signal", value - 128)
        return status

    def _quota_text(self) -> str:
        quota = self.workspace.quota
        if quota is None:
            return "no quota"
        return f"{quota.max_bytes} bytes or {quota.max_files} files"

    def _status_text(self) -> str:
        status = self._status()
        if status is None:
            return "still running"
        kind, value = status
        if kind == "exit":
            return f"exit status {value}"
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(value).name}"
        return f"killed by signal {value}"

    def _death_reason(self) -> KilledReason:
        """Why the worker ended by itself, read from its exit status."""
        status = self._status()
        if status is None or status[0] == "exit":
            if status is not None and status[1] == _worker.EXIT_AFTER_MEMORY_ERROR:
                return "memory"
            return "exited"
        return "cpu_time" if status[1] == signal.SIGXCPU else "signal"

    # -- I/O --------------------------------------------------------------------------

    def _send(self, message: dict[str, Any], deadline: float, capture: _Capture) -> None:
        """Write one request, reading output meanwhile so neither side can block the other."""
        data = memoryview(_worker.encode_frame(message))
        while data:
            try:
                data = data[os.write(self._request_w, data) :]
            except BlockingIOError:
                self._wait(deadline, capture, writing=True)
            except OSError:  # EPIPE: the worker is gone
                self._finish(self._killed_by or self._death_reason())

    def _next_message(self, deadline: float, capture: _Capture) -> dict[str, Any]:
        """Read output and replies until one reply frame is complete.

        Raises:
            _Ended: the worker died, overran ``deadline`` or the output cap, broke the
                protocol, or was killed from another thread (the sandbox is dead then).
        """
        while True:
            message = self._pop_frame()
            if message is not None:
                return message
            self._wait(deadline, capture, writing=False)

    def _finish(self, reason: KilledReason) -> None:
        self.kill(reason)
        raise _Ended(self._killed_by or reason)

    def _pop_frame(self) -> dict[str, Any] | None:
        size_of_header = _worker.HEADER.size
        if len(self._pending) < size_of_header:
            return None
        size = int(_worker.HEADER.unpack_from(self._pending)[0])
        if size > _worker.MAX_MESSAGE_BYTES:
            self._finish("protocol")
        end = size_of_header + size
        if len(self._pending) < end:
            return None
        payload = bytes(self._pending[size_of_header:end])
        del self._pending[:end]
        try:
            return _worker.decode_payload(payload)
        except _worker.ProtocolViolation:
            self._finish("protocol")
            raise  # unreachable: _finish raises

    def _wait(self, deadline: float, capture: _Capture, writing: bool) -> None:
        """Wait until the request pipe is writable (``writing``) or a reply chunk arrived.

        Output that arrives meanwhile goes to ``capture``. Ends the sandbox (raising
        :class:`_Ended`) on a deadline, output overflow, the worker's exit or a kill.
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self._out_r, selectors.EVENT_READ, 1)
            selector.register(self._err_r, selectors.EVENT_READ, 2)
            selector.register(self._reply_r, selectors.EVENT_READ, "reply")
            if writing:
                selector.register(self._request_w, selectors.EVENT_WRITE, "request")
            exit_fd = self._exit_fd()
            if exit_fd is not None:
                selector.register(exit_fd, selectors.EVENT_READ, "exit")
            while True:
                if self._killed_by is not None:
                    raise _Ended(self._killed_by)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._finish("wall_clock")
                if self._disk_due() and self._disk_full():
                    self._finish("disk")
                # Without an exit descriptor the exit is polled; with one, the short
                # timeout only bounds how late a kill from another thread is noticed.
                timeout = min(remaining, 0.05 if exit_fd is None else 0.2)
                if self.workspace.quota is not None:
                    timeout = min(timeout, self.workspace.quota.interval)
                exited = False
                progressed = False
                for key, _ in selector.select(timeout):
                    if key.data == "exit":
                        exited = self._raw_status() is not None
                    elif key.data == "request":
                        progressed = True
                    elif key.data == "reply":
                        chunk = self._read(self._reply_r)
                        if chunk:
                            self._pending += chunk
                            progressed = True
                        elif chunk == b"":
                            selector.unregister(self._reply_r)
                    else:
                        chunk = self._read(key.fd)
                        if chunk == b"":
                            selector.unregister(key.fd)
                        elif chunk and capture.feed(key.data, chunk):
                            self._finish("output_limit")
                if exited or (exit_fd is None and self._raw_status() is not None):
                    self._drain(capture)
                    if self._complete_frame_pending():
                        return  # the last reply arrived just before the exit
                    self._finish(self._killed_by or self._death_reason())
                if progressed:
                    self._drain(capture)
                    return

    def _disk_due(self) -> bool:
        """Time to measure the working directory again (at the quota's interval)."""
        quota = self.workspace.quota
        now = time.monotonic()
        if quota is None or now < self._next_disk_check:
            return False
        self._next_disk_check = now + quota.interval
        return True

    def _disk_full(self) -> bool:
        """The working directory reached its disk quota."""
        quota = self.workspace.quota
        return quota is not None and not self.workspace.closed and quota.exceeded()

    def _complete_frame_pending(self) -> bool:
        size_of_header = _worker.HEADER.size
        if len(self._pending) < size_of_header:
            return False
        size = int(_worker.HEADER.unpack_from(self._pending)[0])
        return len(self._pending) >= size_of_header + size

    @staticmethod
    def _read(fd: int) -> bytes | None:
        """What ``fd`` has: bytes, ``b""`` at end-of-file, None when nothing is ready."""
        try:
            return os.read(fd, 65536)
        except BlockingIOError:
            return None

    def _drain(self, capture: _Capture) -> None:
        """Read what was already written: it precedes the reply or exit just seen."""
        for stream, fd in ((1, self._out_r), (2, self._err_r)):
            while chunk := self._read(fd):
                if capture.feed(stream, chunk):
                    self._finish("output_limit")
        while chunk := self._read(self._reply_r):
            self._pending += chunk

    # -- requests ---------------------------------------------------------------------

    def execute(self, code: str, filename: str) -> ExecOutcome:
        """Run ``code`` in the worker's namespace; collect its output and exit code."""
        limits = self.limits
        capture = _Capture(limits.max_output_bytes, keep=True)
        started = time.monotonic()
        deadline = started + limits.wall_seconds
        outcome = ExecOutcome()
        try:
            request = {
                "op": "exec",
                "code": code,
                "filename": filename,
                "cpu": limits.cpu_seconds,
                **self.request_extras(),
            }
            self._send(request, deadline, capture)
            reply = self._next_message(deadline, capture)
            if reply["op"] != "done":
                self._finish("protocol")
            if reply.get("memory"):
                self.kill("memory")
                outcome.killed_reason = "memory"
            elif self._disk_full():
                # The code finished, perhaps after catching ENOSPC: the quota still ends it.
                self.kill("disk")
                outcome.killed_reason = "disk"
            else:
                outcome.exit_code = int(reply["exit_code"])
            outcome.error = None if reply["error"] is None else str(reply["error"])
            outcome.cpu_time = float(reply["cpu_time"])
        except _Ended as ended:
            outcome.killed_reason = ended.reason
        except (KeyError, TypeError, ValueError):
            self.kill("protocol")
            outcome.killed_reason = "protocol"
        outcome.wall_time = time.monotonic() - started
        outcome.stdout, outcome.stderr = bytes(capture.data[1]), bytes(capture.data[2])
        outcome.stdout_truncated = capture.truncated(1)
        outcome.stderr_truncated = capture.truncated(2)
        if outcome.killed_reason is not None:
            outcome.error = self.explain(outcome.killed_reason)
        return outcome

    def run_tests(self, func: str, cases: Sequence[Sequence[Any]]) -> TestsOutcome:
        """Call ``func(*args)`` in the worker for each case. Their output is discarded."""
        limits = self.limits
        capture = _Capture(limits.max_output_bytes, keep=False)
        deadline = time.monotonic() + limits.test_wall_seconds
        results: list[CaseOutcome] = []
        request = {
            "op": "tests",
            "func": func,
            "cases": [list(case) for case in cases],
            "cpu": limits.cpu_seconds,
            **self.request_extras(),
        }
        try:
            self._send(request, deadline, capture)
            while True:
                reply = self._next_message(deadline, capture)
                if reply["op"] == "tests_done" and len(results) == len(cases):
                    if self._disk_full():
                        self.kill("disk")
                        return TestsOutcome(results, killed_reason="disk")
                    return TestsOutcome(results)
                if reply["op"] != "case" or int(reply["index"]) != len(results):
                    self._finish("protocol")
                error = reply.get("error")
                results.append(
                    CaseOutcome(
                        index=len(results),
                        ok=bool(reply["ok"]),
                        value=reply.get("value"),
                        error=None if error is None else str(error),
                    )
                )
                if reply.get("memory"):
                    self.kill("memory")
                    return TestsOutcome(results, killed_reason="memory")
        except _Ended as ended:
            return TestsOutcome(results, killed_reason=ended.reason)
        except (KeyError, TypeError, ValueError):
            self.kill("protocol")
            return TestsOutcome(results, killed_reason="protocol")

    def explain(self, reason: KilledReason, phase: Literal["code", "tests"] = "code") -> str:
        """A sentence saying why the worker ended, with the limit involved."""
        limits = self.limits
        wall = limits.wall_seconds if phase == "code" else limits.test_wall_seconds
        return {
            "wall_clock": f"killed: wall-clock limit of {wall:g} s exceeded",
            "cpu_time": f"killed: CPU time limit of {limits.cpu_seconds} s exceeded",
            "memory": f"killed: memory limit of {limits.memory_bytes} bytes reached",
            "output_limit": f"killed: output exceeded {limits.max_output_bytes} bytes",
            "disk": f"killed: the working directory reached its disk limit ({self._quota_text()})",
            "signal": f"killed: {self._status_text()}",
            "exited": f"the process ended before finishing ({self._status_text()})",
            "protocol": "killed: the worker's reply channel was corrupted",
            "closed": "killed: the environment was closed",
        }[reason]
