"""The process that runs the agent's code inside the sandbox.

corral never imports this file to run it: the sandbox starts
``python -I -S -B -X utf8 -c <this file's source> <config JSON>``, so it uses the standard
library only and must work on any CPython >= 3.8 the sandbox is given. (The parent does
import it for :func:`canonical` and the framing helpers, so both sides share one
definition.)

Protocol. Two pipes carry messages, each a 4-byte big-endian length and that many bytes
of UTF-8 JSON: requests arrive on ``config["request_fd"]``, replies leave on
``config["reply_fd"]``. The agent's output goes to the ordinary fds 1 and 2, which the
parent reads separately. A third pipe, ``config["lifeline_fd"]``, is never written to: it
reaches end-of-file only when the parent process is gone, and then the worker kills its
own process group, so a crashed server leaves no sandbox behind.

1. On start the worker applies its resource limits (and, in the ``rlimits`` mode, the
   Python-level guards), then sends ``{"op": "ready", ...}``.
2. ``{"op": "exec", "code", "filename", "cpu"}`` runs code in the session namespace and
   answers ``{"op": "done", "exit_code", "error", "memory", "cpu_time"}``.
3. ``{"op": "tests", "func", "cases", "cpu"}`` calls ``func(*args)`` for each case and sends
   one ``{"op": "case", "index", "ok", "value", "error", "memory"}`` per case, then
   ``{"op": "tests_done"}``. Values are sent in :func:`canonical` form; the expected
   values never enter the sandbox, the parent compares.

After a ``MemoryError`` (the address-space limit was hit) the worker reports it and exits
with :data:`EXIT_AFTER_MEMORY_ERROR`, because an interpreter that ran out of memory midway
through arbitrary code is not trustworthy any more.

A request may carry ``"cpu_hard"``: the worker lowers its lifetime CPU limit to it before
running anything (a warm worker is started before its episode's budget is known).

**The fork server** (``config["zygote"]``). A warm sandbox runs this file as a
:class:`Zygote` instead: a process that never runs the agent's code and forks a fresh
worker for each one that is asked of it, so a worker costs a ``fork`` rather than a
sandbox and an interpreter. It runs as root inside the sandbox's namespaces with three
capabilities only (``CAP_SETUID``, ``CAP_SETGID``, ``CAP_KILL``); each worker it forks
drops to the sandbox's unprivileged uid before it reads a request, so the agent's code
can neither signal, trace nor read the zygote, and one ``kill(-1)`` from the zygote
reaches every process of the agent (pid 1 of the namespace and the zygote aside). The
zygote speaks to the parent over a ``SOCK_SEQPACKET`` socket (``config["control_fd"]``),
one JSON object per packet, a new worker's pipes attached as ``SCM_RIGHTS``:

* ``{"op": "spawn", "config", "uid"}`` + 4 descriptors (request, reply, stdout, stderr)
  forks a worker → ``{"op": "spawned", "pid"}``;
* ``{"op": "sweep"}`` kills every process of the agent and waits until none is left →
  ``{"op": "swept", "exits": [[pid, status], ...], "problems": [...]}``;
* ``{"op": "scrub", "uid"}`` also removes what the uid could leave in the kernel beyond
  its processes (System V IPC objects, its keyrings) → ``{"op": "scrubbed", ...}``;
* ``sweep`` and ``scrub`` may carry a ``spawn``'s ``config`` and descriptors: a fresh
  worker is forked once the sweep is done (its ``"pid"`` is in the reply);
* whenever a worker exits by itself: ``{"op": "exited", "pid", "status"}``.

End-of-file on the socket (the parent is gone) kills every process of the agent and
ends the zygote (and with it the sandbox).

This file holds both the worker and the zygote because the sandbox runs it as one
``-c`` source: the zygote forks workers that are already this interpreter, with the
worker's code imported.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import linecache
import math
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback
import types
from typing import Any, NoReturn

HEADER = struct.Struct(">I")
"""Frame header: the payload length as a 4-byte big-endian unsigned int."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest frame either side accepts; anything longer is a protocol violation."""
EXIT_AFTER_MEMORY_ERROR = 86
"""Exit status of a worker that stopped after the agent's code ran out of memory."""
CANONICAL_MAX_DEPTH = 64
"""Deeper values are reported as ``["other", ...]`` rather than walked."""
CANONICAL_MAX_ITEMS = 200_000
"""Values with more items than this are reported as too large."""


class ProtocolViolation(Exception):
    """A frame was malformed, too large, or cut short."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """Serialize one message as a length-prefixed JSON frame."""
    payload = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolViolation(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> dict[str, Any]:
    """Parse a frame's payload; it must be a JSON object with a string ``op``."""
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolViolation(f"frame is not UTF-8 JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolViolation("frame is not a JSON object with a string 'op'")
    return message


def _read_exact(fd: int, size: int) -> bytes | None:
    """Read exactly ``size`` bytes; None on end-of-file before the first byte."""
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            if chunks:
                raise ProtocolViolation("end of file inside a frame")
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> dict[str, Any] | None:
    """Read one message from ``fd``; None when the peer closed the pipe."""
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_MESSAGE_BYTES:
        raise ProtocolViolation(f"frame of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
    payload = _read_exact(fd, size) if size else b""
    if payload is None:
        raise ProtocolViolation("end of file inside a frame")
    return decode_payload(payload)


def send(fd: int, message: dict[str, Any]) -> None:
    """Write one message to ``fd`` completely."""
    view = memoryview(encode_frame(message))
    while view:
        written = os.write(fd, view)
        view = view[written:]


def canonical(value: Any) -> Any:
    """A JSON-safe, type-preserving description of a Python value, for comparison.

    Plain data maps to tagged lists: ``["int", 3]``, ``["float", 0.5]`` (or ``"nan"``,
    ``"inf"``, ``"-inf"``), ``["bool", true]``, ``["str", "x"]``, ``["none"]``,
    ``["bytes", "<hex>"]``, ``["list", [...]]``, ``["tuple", [...]]``,
    ``["dict", [[key, value], ...]]``, ``["set", [...]]``, ``["frozenset", [...]]``.
    Anything else (or anything too deep or too large) becomes
    ``["other", type name, short repr]``, which matches nothing.
    """
    budget = [CANONICAL_MAX_ITEMS]
    return _canonical(value, 0, budget)


def _canonical(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        return ["other", type(value).__name__, "value too large to compare"]
    if depth > CANONICAL_MAX_DEPTH:
        return ["other", type(value).__name__, "value nested too deeply to compare"]
    if value is None:
        return ["none"]
    if isinstance(value, bool):
        return ["bool", bool(value)]
    if isinstance(value, int):
        return ["int", int.__index__(value)]
    if isinstance(value, float):
        number = float.__float__(value)
        if math.isnan(number):
            return ["float", "nan"]
        if math.isinf(number):
            return ["float", "inf" if number > 0 else "-inf"]
        return ["float", number]
    if isinstance(value, str):
        return ["str", str.__str__(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", bytes(value).hex()]
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            items = []
            for item in value:
                items.append(_canonical(item, depth + 1, budget))
                if budget[0] < 0:
                    break
            return [kind.__name__, items]
    if isinstance(value, dict):
        pairs = [
            [_canonical(k, depth + 1, budget), _canonical(v, depth + 1, budget)]
            for k, v in dict.items(value)
        ]
        return ["dict", pairs]
    try:
        text = repr(value)[:200]
    except Exception:
        text = "<unrepresentable>"
    return ["other", type(value).__name__, text]


def apply_limits(config: dict[str, Any]) -> None:
    """Apply the resource limits in ``config["limits"]`` to this process and its children.

    The hard limits equal the soft ones (CPU time aside), so code in the sandbox can
    lower them but never raise them again.
    """
    limits = config["limits"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, key in (
        ("RLIMIT_AS", "memory_bytes"),
        ("RLIMIT_DATA", "memory_bytes"),
        ("RLIMIT_FSIZE", "max_file_bytes"),
        ("RLIMIT_NOFILE", "max_open_files"),
        ("RLIMIT_NPROC", "nproc"),
    ):
        value = int(limits[key])
        resource.setrlimit(getattr(resource, name), (value, value))
    # No POSIX message queue can be created: a queue outlives its processes, and a worker
    # of a warm sandbox must leave nothing behind (System V IPC is scrubbed instead).
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (int(limits["cpu_seconds"]), int(limits["cpu_hard"])))
    niceness = int(limits["nice"])
    if niceness:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)


def set_cpu_budget(seconds: int) -> None:
    """Let the process use ``seconds`` more CPU seconds from now (within the hard limit)."""
    # RLIMIT_CPU counts whole seconds: rounding keeps the budget within half a second.
    soft = max(round(cpu_seconds_used() + seconds), math.ceil(cpu_seconds_used()))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def lower_cpu_hard(seconds: Any) -> None:
    """Lower the lifetime CPU limit to ``seconds`` (a request's ``cpu_hard``), never raise it."""
    if seconds is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    wanted = int(seconds)
    if hard == resource.RLIM_INFINITY or wanted < hard:
        resource.setrlimit(resource.RLIMIT_CPU, (min(soft, wanted), wanted))


def cpu_seconds_used() -> float:
    """CPU time (user + system) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def set_no_new_privs() -> None:
    """Forbid gaining privileges through set-uid binaries or file capabilities."""
    import ctypes

    pr_set_no_new_privs = 38
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(code)}")
    # Forget ctypes again so that the guards see (and refuse) any later import of it.
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.")]:
        del sys.modules[name]


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_ALWAYS_DENIED = {
    "os.exec": "running programs",
    "os.posix_spawn": "running programs",
    "os.spawn": "running programs",
    "os.system": "running programs",
    "os.forkpty": "running programs",
    "os.startfile": "running programs",
    "pty.spawn": "running programs",
    "subprocess.Popen": "running programs",
    "socket.__new__": "network access",
    "socket.bind": "network access",
    "socket.connect": "network access",
    "socket.sendto": "network access",
    "socket.sendmsg": "network access",
    "socket.getaddrinfo": "network access",
    "socket.gethostbyname": "network access",
}
_DENIED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend"}
_WRITE_EVENTS = {
    "os.chflags": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.link": (0, 1),
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.removexattr": (0,),
    "os.rename": (0, 1),
    "os.rmdir": (0,),
    "os.setxattr": (0,),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.utime": (0,),
}
_READ_EVENTS = {"os.listdir": (0,), "os.scandir": (0,), "os.listxattr": (0,), "os.getxattr": (0,)}


def install_guards(read_roots: list[str], write_roots: list[str], deny_roots: list[str]) -> None:
    """Refuse, at the Python level, what the ``rlimits`` mode cannot refuse at the OS level.

    An audit hook (which cannot be removed once added) refuses: opening, listing or
    changing paths outside the allowed roots, running programs, creating sockets, loading
    ``ctypes``/``cffi``/``_posixsubprocess``, and signalling processes outside this
    process group. This stops accidents and naive escapes; it is not a security boundary
    against code written to get around it.
    """
    import threading  # not at the top: see main()

    local = threading.local()
    own_group = os.getpgid(0)

    def under(path: str, roots: list[str]) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    def check_path(raw: Any, write: bool) -> None:
        if isinstance(raw, int):
            return  # an already open file descriptor
        path = os.path.realpath(os.fsdecode("." if raw is None else raw))
        allowed = (
            under(path, write_roots) if write else under(path, read_roots + write_roots)
        ) and not under(path, deny_roots)
        if not allowed:
            verb = "writing to" if write else "reading"
            raise PermissionError(
                errno.EACCES,
                f"sandbox (rlimits mode): {verb} {path} is not allowed; use the working directory",
            )

    def check_signal(target: int, group: bool) -> None:
        if group:
            allowed = target in (0, own_group)
        elif target == 0 or target == os.getpid():
            allowed = True
        elif target < -1:
            allowed = -target == own_group
        elif target > 0:
            try:
                allowed = os.getpgid(target) == own_group
            except OSError:
                allowed = True  # no such process: let the call fail normally
        else:
            allowed = False
        if not allowed:
            raise PermissionError(
                errno.EPERM,
                "sandbox (rlimits mode): signalling processes outside the sandbox is not allowed",
            )

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if getattr(local, "busy", False):
            return
        local.busy = True
        try:
            if event == "open":
                mode, flags = args[1], args[2]
                write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                    isinstance(flags, int) and flags & _WRITE_FLAGS
                )
                check_path(args[0], write)
            elif event in _WRITE_EVENTS:
                for index in _WRITE_EVENTS[event]:
                    check_path(args[index], True)
            elif event in _READ_EVENTS:
                check_path(args[_READ_EVENTS[event][0]], False)
            elif event in _ALWAYS_DENIED or event.startswith("ctypes."):
                what = _ALWAYS_DENIED.get(event, "ctypes")
                raise PermissionError(
                    errno.EPERM, f"sandbox (rlimits mode): {what} is not allowed ({event})"
                )
            elif event == "import" and str(args[0]).split(".")[0] in _DENIED_IMPORTS:
                raise PermissionError(
                    errno.EPERM, f"sandbox (rlimits mode): importing {args[0]} is not allowed"
                )
            elif event == "os.kill":
                check_signal(int(args[0]), group=False)
            elif event == "os.killpg":
                check_signal(int(args[0]), group=True)
        finally:
            local.busy = False

    sys.addaudithook(hook)


class RequestLoop:
    """The request loop: one namespace per worker, shared by every ``exec``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.request_fd = int(config["request_fd"])
        self.reply_fd = int(config["reply_fd"])
        self.workdir = str(config["workdir"])
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = builtins
        # The agent's code runs as __main__ (so pickling and `if __name__ == "__main__"`
        # behave); the worker keeps its own functions through closures and `self`.
        sys.modules["__main__"] = module
        self.namespace: dict[str, Any] = module.__dict__
        self.stdout = sys.stdout
        self.stderr = sys.stderr

    def serve(self, enter: Any = None) -> None:
        """Answer requests until the parent closes the request pipe.

        ``enter`` (a callable) runs once the first request has arrived, before it is
        handled: a worker forked ahead of time becomes the sandbox uid only then.
        """
        send(
            self.reply_fd,
            {
                "op": "ready",
                "pid": os.getpid(),
                "uid": os.getuid(),
                "prefix": sys.base_prefix,
                "python": sys.version,
            },
        )
        while True:
            request = receive(self.request_fd)
            if request is None:
                return
            if enter is not None:
                enter()
                enter = None
            if request["op"] == "exec":
                self.execute(request)
            elif request["op"] == "tests":
                self.run_tests(request)
            else:
                raise ProtocolViolation(f"unknown request op {request['op']!r}")

    def _restore_streams(self) -> None:
        sys.stdout, sys.stderr = self.stdout, self.stderr

    def _flush(self) -> None:
        for stream in (sys.stdout, sys.stderr, self.stdout, self.stderr):
            with contextlib.suppress(Exception):
                stream.flush()

    def execute(self, request: dict[str, Any]) -> None:
        """Run one action's code; report its exit code and error."""
        source = str(request["code"])
        filename = str(request["filename"])
        self._restore_streams()
        # Registering the source lets tracebacks show the agent's lines.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        lower_cpu_hard(request.get("cpu_hard"))
        set_cpu_budget(int(request["cpu"]))
        started = cpu_seconds_used()
        exit_code, error, memory = 0, None, False
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
            exec(code, self.namespace)
        except SystemExit as exc:
            exit_code, error = self._system_exit(exc)
        except MemoryError:
            exit_code, error, memory = 1, "MemoryError: the memory limit was reached", True
            self._print_exception()
        except BaseException as exc:
            exit_code, error = 1, _describe(exc)
            self._print_exception()
        self._flush()
        self._restore_streams()
        reply = {
            "op": "done",
            "exit_code": exit_code,
            "error": error,
            "memory": memory,
            "cpu_time": round(cpu_seconds_used() - started, 6),
        }
        send(self.reply_fd, reply)
        if memory:
            os._exit(EXIT_AFTER_MEMORY_ERROR)

    def _system_exit(self, exc: SystemExit) -> tuple[int, str | None]:
        code = exc.code
        if code is None:
            return 0, None
        if isinstance(code, int):
            return code, None if code == 0 else f"SystemExit: {code}"
        # As the interpreter does: a non-integer exit code is printed and means failure.
        with contextlib.suppress(Exception):
            print(code, file=sys.stderr)
        return 1, _describe(exc)

    def _print_exception(self) -> None:
        kind, exc, tb = sys.exc_info()
        if kind is None or exc is None:
            return
        # Drop the worker's own frame so the traceback starts in the agent's code.
        with contextlib.suppress(Exception):
            traceback.print_exception(kind, exc, tb.tb_next if tb else None, file=self.stderr)

    def run_tests(self, request: dict[str, Any]) -> None:
        """Call the entry point once per case; stream each result back."""
        self._restore_streams()
        lower_cpu_hard(request.get("cpu_hard"))
        set_cpu_budget(int(request["cpu"]))
        name = str(request["func"])
        func = self.namespace.get(name)
        for index, args in enumerate(request["cases"]):
            reply: dict[str, Any] = {"op": "case", "index": index, "ok": False, "memory": False}
            if not callable(func):
                reply["error"] = (
                    f"{name} is not defined"
                    if func is None
                    else f"{name} is a {type(func).__name__}, not a function"
                )
            else:
                try:
                    reply["value"] = canonical(func(*args))
                    reply["ok"] = True
                except MemoryError:
                    reply.update(error="MemoryError", memory=True)
                except BaseException as exc:
                    reply["error"] = f"raised {type(exc).__name__}"
            self._flush()
            self._restore_streams()
            send(self.reply_fd, reply)
            if reply["memory"]:
                os._exit(EXIT_AFTER_MEMORY_ERROR)
        send(self.reply_fd, {"op": "tests_done"})


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    summary = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return summary[:1000]


def _watch_lifeline(fd: int) -> None:
    """Kill this process group once the parent is gone (the lifeline reads end-of-file)."""
    try:
        while os.read(fd, 64):
            pass
    except OSError:
        pass
    try:
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(1)


def serve_worker(config: dict[str, Any], uid: int | None = None) -> None:
    """Set up this process as a worker (limits applied already) and answer requests.

    With ``uid`` (a worker forked by the zygote, still root with its capabilities), the
    process becomes ``uid`` when its first request arrives, and only then enters the
    working directory: until an action is asked of it, nothing runs as the sandbox uid.
    """
    if config.get("no_new_privs"):
        set_no_new_privs()
    for stream in (sys.stdout, sys.stderr):
        # Line buffering, as on a terminal: what was printed before a kill is not lost.
        stream.reconfigure(errors="backslashreplace", line_buffering=True)  # type: ignore[union-attr]
    workdir = str(config["workdir"])
    worker = RequestLoop(config)

    def enter() -> None:
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # every capability goes with root
        os.chdir(workdir)
        sys.path.insert(0, workdir)
        guards = config.get("guards")
        if guards:
            install_guards(guards["read"], guards["write"], guards["deny"])

    if uid is None:
        enter()
        worker.serve()
    else:
        worker.serve(enter)


# -- the fork server --------------------------------------------------------------------

ZYGOTE_MAX_PACKET = 1024 * 1024
"""Largest control packet either side sends (a worker's configuration, a reply)."""
ZYGOTE_SWEEP_SECONDS = 10.0
"""How long a sweep may take before the zygote reports processes it could not kill."""
_IPC_RMID = 0
_KEYCTL_CLEAR = 7
_KEYCTL_GET_PERSISTENT = 22
_KEY_SPEC_PROCESS_KEYRING = -2
_KEY_SPEC_USER_KEYRING = -4
_KEY_SPEC_USER_SESSION_KEYRING = -5
_KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 280, "s390x": 280}
"""``keyctl(2)``'s system call number by machine (libc has no wrapper for it)."""


def control_send(
    sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()
) -> None:
    """Send one control packet (``message`` as JSON), with ``fds`` attached."""
    payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
    ancillary = []
    if fds:
        fd_bytes = struct.pack(f"{len(fds)}i", *fds)
        ancillary.append((socket.SOL_SOCKET, socket.SCM_RIGHTS, fd_bytes))
    sock.sendmsg([payload], ancillary)


def control_receive(sock: socket.socket, flags: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """Read one control packet: its message (None at end-of-file) and attached descriptors.

    Raises:
        ProtocolViolation: the packet was cut short or is not a JSON object with an ``op``
            (any descriptors it carried are closed).
        BlockingIOError: ``flags`` has ``MSG_DONTWAIT`` and no packet is waiting.
    """
    data, ancillary, msg_flags, _ = sock.recvmsg(
        ZYGOTE_MAX_PACKET, socket.CMSG_SPACE(16 * struct.calcsize("i")), flags
    )
    fds: list[int] = []
    for level, kind, blob in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(blob) - len(blob) % struct.calcsize("i")
            fds.extend(struct.unpack(f"{usable // struct.calcsize('i')}i", blob[:usable]))
    for fd in fds:
        os.set_inheritable(fd, False)
    try:
        if msg_flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolViolation("control packet cut short")
        if not data:
            return None, fds
        return decode_payload(data), fds
    except ProtocolViolation:
        for fd in fds:
            os.close(fd)
        raise


def exit_status(status: int) -> list[Any]:
    """A wait status as ``["exit", code]`` or ``["signal", number]``."""
    if os.WIFSIGNALED(status):
        return ["signal", os.WTERMSIG(status)]
    return ["exit", os.WEXITSTATUS(status)]


class Zygote:
    """The fork server of a warm sandbox (see the module docstring).

    It never runs the agent's code, imports nothing after it starts, and keeps no state
    that a worker could change: a worker is a copy of it made by ``fork``, which drops to
    the sandbox uid and closes every descriptor of the zygote's before it reads a request.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        if os.getppid() != 1:
            # kill(-1) is only safe as the child of a pid namespace's first process.
            raise SystemExit("corral zygote: not in a pid namespace of its own; refusing to run")
        # The descriptor keeps its number from the parent, where it can be past 1023 (a
        # server with many connections): select() refuses such numbers, and a worker
        # closes only below its RLIMIT_NOFILE. A copy takes the lowest free number.
        inherited = int(config["control_fd"])
        self.control = socket.socket(fileno=os.dup(inherited))
        os.close(inherited)
        self.control.set_inheritable(False)
        self.workers: set[int] = set()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda number, frame: None)
        signal.set_wakeup_fd(self.wake_w)
        self.prepare()

    @staticmethod
    def prepare() -> None:
        """Do once, before the first fork, what every worker would otherwise redo.

        A worker is a copy-on-write image of the zygote: what the zygote leaves undone,
        each worker pays for again. ``compile`` builds the AST's hundred-odd classes on
        its first call in a process (~1 ms of CPU, and the pages it writes), so the
        zygote makes that first call; and it imports ``ctypes`` for the scrubber
        (:meth:`scrub`, which would import it in each child otherwise, ~2 ms). The
        agent's code may import ``ctypes`` itself in any case: the sandbox's limits
        are the kernel's, not Python's.
        """
        compile("pass", "<zygote>", "exec", dont_inherit=True)
        import ctypes  # noqa: F401  (see the docstring)

    def serve(self) -> None:
        """Answer the parent until it goes away; then kill every process of the agent."""
        control_send(
            self.control,
            {"op": "ready", "pid": os.getpid(), "prefix": sys.base_prefix, "python": sys.version},
        )
        while True:
            control = self.control.fileno()
            readable = select.select([control, self.wake_r], [], [])[0]
            if self.wake_r in readable:
                with contextlib.suppress(OSError):
                    while os.read(self.wake_r, 4096):
                        pass
                self.reap()
            if control not in readable:
                continue
            message, fds = control_receive(self.control)
            if message is None:
                self.kill_all()
                return
            self.handle(message, fds)

    def handle(self, message: dict[str, Any], fds: list[int]) -> None:
        """Carry out one request of the parent (the descriptors are consumed)."""
        op = message["op"]
        if op == "spawn":
            control_send(self.control, {"op": "spawned", "pid": self.spawn(message, fds)})
            return
        if message.get("config") is None:
            for fd in fds:  # descriptors belong to a spawn only
                os.close(fd)
        if op not in ("sweep", "scrub"):
            raise ProtocolViolation(f"unknown control op {op!r}")
        exits, problems = self.kill_all()
        reply: dict[str, Any] = {"op": "swept", "exits": exits, "problems": problems}
        if op == "scrub" and not problems:
            reply["op"] = "scrubbed"
            problems.extend(self.scrub(int(message["uid"])))
        if message.get("config") is not None:
            reply["pid"] = self.spawn(message, fds)
        control_send(self.control, reply)

    def spawn(self, message: dict[str, Any], fds: list[int]) -> int:
        """Fork a worker that serves ``message["config"]`` on the 4 descriptors ``fds``."""
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            raise ProtocolViolation(f"a spawn needs 4 descriptors, got {len(fds)}")
        pid = os.fork()
        if pid == 0:
            self.become_worker(message["config"], int(message["uid"]), fds)
        for fd in fds:
            os.close(fd)
        self.workers.add(pid)
        return pid

    def become_worker(self, config: dict[str, Any], uid: int, fds: list[int]) -> NoReturn:
        """In the forked child: drop every trace of the zygote, become the uid, serve."""
        try:
            request_fd, reply_fd, out_fd, err_fd = fds
            self.control.detach()  # the descriptor is closed below; the object must not
            os.setsid()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            keep = sorted({0, 1, 2, request_fd, reply_fd})
            highest = max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1024)
            ends = [*keep[1:], highest]
            for index, low in enumerate(keep):  # no zip(strict=): this runs on 3.8 too
                os.closerange(low + 1, ends[index])
            for fd in (request_fd, reply_fd):
                os.set_inheritable(fd, False)
            # New stream objects: the zygote's describe what fds 1 and 2 were before.
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            config = {**config, "request_fd": request_fd, "reply_fd": reply_fd}
            apply_limits(config)
            serve_worker(config, uid)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                os.write(2, f"corral worker: {_describe(exc)}\n".encode())
            os._exit(127)
        os._exit(0)

    def reap(self) -> None:
        """Collect exited children; report each worker that ended by itself."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.workers:
                self.workers.discard(pid)
                report = {"op": "exited", "pid": pid, "status": exit_status(status)}
                control_send(self.control, report)

    def kill_all(self) -> tuple[list[Any], list[str]]:
        """Kill every process of the agent; wait until none is left.

        Returns the workers' exit statuses and what could not be done.
        """
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)  # all but pid 1 and ourselves: the agent's
        exits = []
        for pid in sorted(self.workers):
            with contextlib.suppress(ChildProcessError):
                exits.append([pid, exit_status(os.waitpid(pid, 0)[1])])
        self.workers.clear()
        deadline = time.monotonic() + ZYGOTE_SWEEP_SECONDS
        while True:
            strays = self.strays()
            if not strays:
                return exits, []
            if time.monotonic() > deadline:
                return exits, [f"processes {strays} survived SIGKILL"]
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
            self.reap()
            time.sleep(0.0005)

    @staticmethod
    def strays() -> list[int]:
        """Live processes of the sandbox other than pid 1 and the zygote (zombies are dead)."""
        found = []
        me = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in (1, me):
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    state = stat.read().rpartition(b")")[2].split()[0]
            except (OSError, IndexError):
                continue  # gone meanwhile
            if state not in (b"Z", b"X"):
                found.append(int(name))
        return found

    def scrub(self, uid: int) -> list[str]:
        """Remove what ``uid`` left in the kernel beyond processes, as that uid.

        A child becomes ``uid`` (which owns, or created, everything it could leave) and
        removes the sandbox's System V IPC objects and clears the uid's keyrings; POSIX
        message queues cannot be created at all (RLIMIT_MSGQUEUE is 0).
        """
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            problems = ["the scrubber did not finish"]
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                problems = scrub_identity()
            finally:
                with contextlib.suppress(Exception):
                    os.write(write_end, json.dumps(problems).encode())
                os._exit(0)
        os.close(write_end)
        chunks = []
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(read_end)
        os.waitpid(pid, 0)
        try:
            return [str(p) for p in json.loads(b"".join(chunks).decode())]
        except ValueError:
            return ["the scrubber died"]


def scrub_identity() -> list[str]:
    """As the sandbox uid: remove its System V IPC objects, clear its keyrings; say what failed."""
    import ctypes  # imported by the zygote already (Zygote.prepare)

    libc = ctypes.CDLL(None, use_errno=True)
    problems = []
    removers: dict[str, tuple[Any, tuple[Any, ...]]] = {
        "shm": (libc.shmctl, (_IPC_RMID, None)),
        "msg": (libc.msgctl, (_IPC_RMID, None)),
        "sem": (libc.semctl, (0, _IPC_RMID)),
    }
    for kind, (remove, rest) in removers.items():
        for ident in _ipc_ids(kind):
            if remove(ident, *rest) != 0 and ctypes.get_errno() != errno.EINVAL:  # gone already
                problems.append(f"cannot remove {kind} {ident}: {os.strerror(ctypes.get_errno())}")
        left = _ipc_ids(kind)
        if left:
            problems.append(f"{kind} objects {left} remain")
    number = _KEYCTL_SYSCALL.get(os.uname().machine)
    if number is None:
        problems.append(f"keyrings cannot be cleared on {os.uname().machine}")
        return problems
    keyctl = libc.syscall
    keyctl.restype = ctypes.c_long
    persistent = keyctl(number, _KEYCTL_GET_PERSISTENT, -1, _KEY_SPEC_PROCESS_KEYRING)
    keyrings = [_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING]
    if persistent > 0:
        keyrings.append(persistent)
    for keyring in keyrings:
        if keyctl(number, _KEYCTL_CLEAR, keyring) != 0:
            problems.append(f"cannot clear keyring {keyring}: {os.strerror(ctypes.get_errno())}")
    return problems


def _ipc_ids(kind: str) -> list[int]:
    """The ids of the System V IPC objects of ``kind`` in this IPC namespace."""
    with open(f"/proc/sysvipc/{kind}", encoding="ascii") as table:
        return [int(line.split()[1]) for line in table.read().splitlines()[1:] if line.strip()]


def main(argv: list[str]) -> int:
    """Entry point inside the sandbox: ``argv[1]`` is the JSON config."""
    config = json.loads(argv[1])
    if config.get("zygote"):
        Zygote(config).serve()
        return 0
    # Imported by cold workers only: in the zygote, ``threading``'s at-fork hook (it
    # rebuilds its locks and walks its registry of threads in every child) would cost
    # each forked worker a tenth of its CPU.
    import threading

    for key in ("request_fd", "reply_fd", "lifeline_fd"):
        os.set_inheritable(int(config[key]), False)
    threading.Thread(
        target=_watch_lifeline, args=(int(config["lifeline_fd"]),), daemon=True
    ).start()
    apply_limits(config)
    serve_worker(config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
