"""Warm starts: a template process that has imported the server once and forks each new one.

A cold ``corral serve`` pays an interpreter and about half a CPU-second of imports
(FastAPI's models, uvicorn, picows, pydantic) before it reads its target, every time. A
:class:`WarmTemplate` pays that once: it is a child of this process that imports what
every server needs and then waits. Each :meth:`WarmTemplate.spawn` forks it; the fork
takes the server's environment, working directory, descriptors and session, then runs
``corral serve`` as ``python -m corral`` would (through ``runpy``), importing only the
environment's own modules. A pool of local servers starts for the price of one import.

What a warm server shares with its template, and why that is safe:

* The modules imported before the fork, as they were after import. Nothing the template
  imports reads the environment or the working directory at import time; the fork sets
  both (and ``sys.path[0]``, ``sys.argv``) before the command runs, and the import caches
  are invalidated, so an environment written after the template started is found.
* What the interpreter reads once, at its own start: ``PYTHON*`` variables, the locale,
  ``HOME`` (the user site directory) and the dynamic loader's ``LD_*``. Templates are
  keyed by these (:func:`startup_key`): a server whose values differ gets a template of
  its own, never a fork of one started with other values.
* The hash secret. Every fork of one template hashes strings alike, as the threads of one
  server do; ``random`` is re-seeded in each fork by the standard library itself.

Lifetime: the template dies with this process (parent-death signal ``SIGKILL``), and
each server dies with the template (its ``death_signal``), so the chain that stops a
cold server when its owner dies holds. The template reaps its children and reports each
exit status; :class:`WarmProcess` turns those reports into the ``subprocess.Popen`` calls
:class:`~corral.client.local_server.LocalServer` makes (``poll``, ``wait``,
``send_signal``). It is spawned from a thread of its own that lives as long as this
process: a parent-death signal follows the *thread* that forked, and a template spawned
from a short-lived worker thread would die with it.

Both sides live in this module, the owner's (:class:`WarmTemplate`,
:class:`WarmProcess`) and the template's (:func:`run_template`): they are the two ends of
one small protocol (a fork request with its descriptors; a pid, a ready or an exit
report back), which is easier to keep right when it is read and written in one place.

``CORRAL_WARM_START=0`` turns warm starts off (every server is then a fresh interpreter).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import importlib
import json
import os
import resource
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.errors import ServerStartError

WARM_START_ENV = "CORRAL_WARM_START"
"""Set to ``0`` to start every local server as a fresh interpreter."""

PRELOAD = (
    "corral.cli.main",
    "corral.cli.serve",
    "corral.server.app",
    "corral.server.native",
    "corral.adapters.openenv_env",
    "uvicorn",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.wsproto_impl",
    "uvloop",
    "picows",
)
"""What a template imports before it forks: what ``corral serve`` imports for any target."""

# Loaded in the parent: a child forked from a threaded process must not load libraries
# (or allocate) before exec, only make system calls.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1

_STARTUP_NAMES = ("HOME", "LANG", "LANGUAGE")
_STARTUP_PREFIXES = ("PYTHON", "LC_", "LD_")
_MESSAGE_BYTES = 1 << 20
_MAX_FDS = 16


def die_with_parent(signum: int) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent thread dies."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signum)


def startup_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables an interpreter reads once at its start (see the module docstring).

    Two servers may fork from one template only if these are equal. ``PYTHONUNBUFFERED``
    is left out: every server and template runs unbuffered.
    """
    return tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if (name in _STARTUP_NAMES or name.startswith(_STARTUP_PREFIXES))
            and name != "PYTHONUNBUFFERED"
        )
    )


def enabled(env: Mapping[str, str]) -> bool:
    """False when ``CORRAL_WARM_START=0`` is set in ``env``."""
    return env.get(WARM_START_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class ChildSetup:
    """What a server's process applies to itself before it runs: resource limits and
    niceness. Data, not a callable, so that a fork of a template can apply it as well as a
    fresh interpreter's ``preexec_fn`` (both call :meth:`apply`).

    Attributes:
        rlimits: ``(RLIMIT_*, (soft, hard))`` pairs, computed in the parent.
        nice: niceness added to the process's.
    """

    rlimits: tuple[tuple[int, tuple[int, int]], ...] = ()
    nice: int = 0

    def apply(self) -> None:
        """Set the limits and the niceness (system calls only: safe between fork and exec)."""
        for which, limit in self.rlimits:
            resource.setrlimit(which, limit)
        if self.nice:
            os.nice(self.nice)


class TemplateError(ServerStartError):
    """The template could not fork a server (it did not start, died, or refused)."""


class WarmProcess:
    """A server forked by a template: the part of ``subprocess.Popen`` a LocalServer uses.

    The server is the template's child, not ours, so its exit status comes from the
    template's report. Signals go through a pidfd opened as soon as the pid is known, so
    a late signal can never reach a recycled pid.
    """

    def __init__(self, template: WarmTemplate, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._template = template
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        """The exit status if the server has exited and it was reported, else None."""
        if self.returncode is None:
            self.returncode = self._template.exit_status(self.pid, self._pidfd)
            if self.returncode is not None:
                self._close_pidfd()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"warm server {self.pid}", timeout or 0.0)
            self._template.wait_for_news(left)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Signal the server; nothing happens once it has exited."""
        if self.poll() is not None:
            return
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        """SIGTERM, as ``Popen.terminate``."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, as ``Popen.kill``."""
        self.send_signal(signal.SIGKILL)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        self._close_pidfd()


UNKNOWN_STATUS = 255
"""The exit status given to a server whose template died before it could report one."""
_REPORT_WAIT_S = 5.0
"""How long an exited server's status may take to be reported (the template reaps at
once; the bound only keeps a lost report from blocking a poll)."""


class WarmTemplate:
    """One template process for one interpreter and one :func:`startup_key`.

    Thread-safe; :meth:`spawn` may be called from any thread. The template starts on the
    first spawn and lives until this process exits (or it dies; then the next spawn
    starts a new one).
    """

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.python = python
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self._lock = threading.Lock()  # one request in flight
        self._news = threading.Condition()
        self._replies: list[dict[str, object]] = []
        self._exited: dict[int, int] = {}
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._dead = False
        self._ready = threading.Event()
        self._start_error: str | None = None
        self._start_lock = threading.Lock()
        self._owner: threading.Thread | None = None
        self._broken: str | None = None
        """Why a template of this interpreter cannot run (it exited before it was ready):
        not tried again, each start would pay an interpreter for nothing."""

    # ------------------------------------------------------------------ owner side

    def start(self, timeout: float = 60.0) -> None:
        """Start the template if it is not running, and wait until it has preloaded.

        Raises:
            TemplateError: it did not start, or not within ``timeout`` seconds.
        """
        if self._broken is not None:
            raise TemplateError(f"the server template did not start: {self._broken}")
        with self._start_lock:
            with self._news:
                running = self._owner is not None and self._owner.is_alive() and not self._dead
            if not running:
                self._ready.clear()
                self._start_error = None
                with self._news:
                    self._dead = False
                    self._replies.clear()
                self._owner = threading.Thread(
                    target=self._own, name="corral-server-template", daemon=True
                )
                self._owner.start()
        if not self._ready.wait(timeout):
            raise TemplateError(f"the server template did not start within {timeout:g} s")
        if self._start_error is not None:
            raise TemplateError(f"the server template did not start: {self._start_error}")

    def spawn(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None,
        stdout: int,
        pass_fds: Sequence[int] = (),
        death_signal: int = signal.SIGTERM,
        setup: ChildSetup | None = None,
        timeout: float = 60.0,
    ) -> WarmProcess:
        """Fork a server running ``corral ARGS`` (the arguments after ``python -m corral``).

        ``stdout`` receives its output and errors; each of ``pass_fds`` stays open in it
        under the same number; its stdin is ``/dev/null``. ``setup`` is applied in it
        before the command runs.

        Raises:
            TemplateError: the template is not running and could not be started, or it
                died while forking.
        """
        request = json.dumps(
            {
                "args": list(args),
                "env": dict(env),
                "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                "pass_fds": list(pass_fds),
                "death_signal": int(death_signal),
                "rlimits": list(setup.rlimits) if setup is not None else [],
                "nice": setup.nice if setup is not None else 0,
            }
        ).encode()
        if len(request) > _MESSAGE_BYTES or len(pass_fds) + 1 > _MAX_FDS:
            raise TemplateError("the request is too large for a warm start")
        self.start(timeout)
        with self._lock:
            sock = self._sock
            if sock is None:
                raise TemplateError("the server template is gone")
            try:
                socket.send_fds(sock, [request], [stdout, *pass_fds])
            except OSError as exc:
                raise TemplateError(f"the server template is gone: {exc}") from None
            reply = self._next_reply(timeout)
        if "pid" not in reply:
            raise TemplateError(f"the server template refused to fork: {reply.get('error')}")
        pid = reply["pid"]
        assert isinstance(pid, int)
        return WarmProcess(self, pid)

    def exit_status(self, pid: int, pidfd: int | None) -> int | None:
        """The exit status of ``pid``, or None while it runs.

        The kernel's word decides whether it runs (its pidfd turns readable at the exit),
        as ``waitpid`` does for ``Popen.poll``; the template's report, which follows at
        once (it reaps on ``SIGCHLD``), gives the status. A dead template reports nothing
        more: its servers die of their parent-death signal, status unknown.
        """
        with self._news:
            if pid in self._exited:
                return self._exited.pop(pid)
        if pidfd is not None:
            gone = bool(select.select([pidfd], [], [], 0)[0])
        else:
            gone = not os.path.exists(f"/proc/{pid}")
        if not gone:
            return None
        deadline = time.monotonic() + _REPORT_WAIT_S
        with self._news:
            while pid not in self._exited and not self._dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._news.wait(left)
            return self._exited.pop(pid, UNKNOWN_STATUS)

    def wait_for_news(self, timeout: float | None) -> None:
        """Block until the template reports something (or dies), at most ``timeout`` s."""
        with self._news:
            # Polled while the template is dead: nothing will notify then. Alive, at most a
            # second: a report that came between the caller's look and this wait notified
            # nobody.
            if self._dead:
                self._news.wait(0.05)
            else:
                self._news.wait(1.0 if timeout is None else min(timeout, 1.0))

    def close(self) -> None:
        """Stop the template; servers it forked die of their parent-death signal."""
        with self._news:
            sock, process = self._sock, self._process
            self._sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
            if process.poll() is None:
                process.kill()
                process.wait(5)

    def _own(self) -> None:
        """The template's owner thread: spawn it, then read its reports until it is gone."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [self.python, "-c", f"import {__name__} as t; t.run_template({theirs.fileno()})"],
                # Its output is nobody's: a template that fails to start shows as a
                # TemplateError, and the caller's cold start then reports the real cause.
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self.env,
                pass_fds=(theirs.fileno(),),
                # Its own session: a terminal's Ctrl-C is the owner's to handle, as it is
                # for a cold server.
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, signal.SIGKILL),
            )
        except OSError as exc:
            self._start_error = str(exc)
            ours.close()
            self._ready.set()
            return
        finally:
            theirs.close()
        self._sock = ours
        try:
            while True:
                data = ours.recv(_MESSAGE_BYTES)
                if not data:
                    break
                message = json.loads(data)
                with self._news:
                    if "ready" in message:
                        self._ready.set()
                    elif "exited" in message:
                        self._exited[message["exited"]] = message["status"]
                        _count_reaped(message["cpu_s"])
                    else:
                        self._replies.append(message)
                    self._news.notify_all()
        except OSError:
            pass
        finally:
            with self._news:
                self._dead = True
                self._sock = None
                self._news.notify_all()
            if not self._ready.is_set():
                self._start_error = self._broken = "it exited while importing"
                self._ready.set()
            ours.close()
            if self._process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(5)

    def _next_reply(self, timeout: float) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        with self._news:
            while not self._replies:
                left = deadline - time.monotonic()
                if self._dead or left <= 0:
                    raise TemplateError("the server template died while forking a server")
                self._news.wait(left)
            return self._replies.pop(0)


_reaped_cpu_s = 0.0
_reaped_lock = threading.Lock()


def _count_reaped(seconds: float) -> None:
    global _reaped_cpu_s
    with _reaped_lock:
        _reaped_cpu_s += seconds


def reaped_cpu_seconds() -> float:
    """CPU-seconds of the warm servers reaped so far, in all of this process's templates.

    A warm server is its template's child, so ``getrusage(RUSAGE_CHILDREN)`` of this
    process never includes it; this is its counterpart (``tests/support/cpu_report.py``
    adds the two).
    """
    with _reaped_lock:
        return _reaped_cpu_s


_templates: dict[tuple[str, tuple[tuple[str, str], ...]], WarmTemplate] = {}
_templates_lock = threading.Lock()


def warm_template(python: str, env: Mapping[str, str]) -> WarmTemplate:
    """The template (made on first use) for servers of ``python`` with this ``env``."""
    key = (python, startup_key(env))
    with _templates_lock:
        template = _templates.get(key)
        if template is None:
            template = _templates[key] = WarmTemplate(python, env)
        return template


def _forget_templates() -> None:
    """In a fork of this process: its templates are the parent's (their sockets, their
    reader threads, which did not survive the fork); the child starts its own. The locks
    are new ones: another thread may have held the old ones at the fork."""
    global _templates_lock, _reaped_lock, _reaped_cpu_s
    _templates_lock, _reaped_lock = threading.Lock(), threading.Lock()
    _templates.clear()
    _reaped_cpu_s = 0.0


os.register_at_fork(after_in_child=_forget_templates)


# ---------------------------------------------------------------------- template side


def run_template(fd: int) -> None:
    """The template's main: preload, then fork a server per request (runs in the child)."""
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    # What every fork shares stays shared: the collector never touches (and so never
    # copies) the pages of objects that exist now.
    import gc

    gc.collect()
    gc.freeze()
    try:
        sock.send(json.dumps({"ready": os.getpid()}).encode())
    except OSError:
        return
    launch = _serve_requests(sock)
    if launch is not None:
        _become_server(*launch)


_Launch = tuple[int, list[str], dict[str, str], str, list[int], list[int], int, ChildSetup]


def _serve_requests(sock: socket.socket) -> _Launch | None:
    """Fork per request until the owner hangs up. In a fork, return what it must run."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        while True:
            ready = select.select([sock.fileno(), wake_r], [], [])[0]
            if wake_r in ready:
                os.read(wake_r, 4096)
                _report_exits(sock)
            if sock.fileno() not in ready:
                continue
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, _MAX_FDS)
            if not data:
                return None
            parent = os.getpid()
            try:
                request = json.loads(data)
                pid = os.fork()
            except Exception as exc:  # the owner is told why
                _close_all(fds)
                sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
                continue
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                sock.close()
                return (
                    parent,
                    list(request["args"]),
                    dict(request["env"]),
                    str(request["cwd"]),
                    fds,
                    [int(n) for n in request["pass_fds"]],
                    int(request["death_signal"]),
                    ChildSetup(
                        tuple(
                            (int(w), (int(lim[0]), int(lim[1]))) for w, lim in request["rlimits"]
                        ),
                        int(request["nice"]),
                    ),
                )
            _close_all(fds)
            sock.send(json.dumps({"pid": pid}).encode())
    except OSError:
        return None


def _report_exits(sock: socket.socket) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        report = {
            "exited": pid,
            "status": os.waitstatus_to_exitcode(status),
            "cpu_s": usage.ru_utime + usage.ru_stime,
        }
        sock.send(json.dumps(report).encode())


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _become_server(
    template: int,
    args: list[str],
    env: dict[str, str],
    cwd: str,
    received: list[int],
    wanted: list[int],
    death_signal: int,
    setup: ChildSetup,
) -> None:
    """In a fork: take the server's session, descriptors and environment; run the CLI."""
    os.setsid()
    die_with_parent(death_signal)
    if os.getppid() != template:
        os._exit(UNKNOWN_STATUS)  # the template died before the signal was armed
    setup.apply()
    # Descriptors: first above every number wanted, so that placing one never overwrites
    # another, then each onto its number.
    floor = max([2, *wanted]) + 1
    parked = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    _close_all(received)
    stdout, *passed = parked
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(stdout, 1)
    os.dup2(stdout, 2)
    for fd, number in zip(passed, wanted, strict=True):
        os.dup2(fd, number)  # dup2's copy is inheritable, as pass_fds makes it
    _close_all(parked)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    import tempfile

    tempfile.tempdir = None  # recomputed from this server's TMPDIR
    sys.path[0] = cwd
    sys.argv = ["corral", *args]  # runpy puts the path of corral/__main__.py first
    importlib.invalidate_caches()
    runpy.run_module("corral", run_name="__main__", alter_sys=True)
