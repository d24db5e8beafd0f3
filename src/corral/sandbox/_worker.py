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
import signal
import struct
import sys
import threading
import traceback
import types
from typing import Any

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


class Worker:
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

    def serve(self) -> None:
        """Answer requests until the parent closes the request pipe."""
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


def main(argv: list[str]) -> int:
    """Entry point inside the sandbox: ``argv[1]`` is the JSON config."""
    config = json.loads(argv[1])
    for key in ("request_fd", "reply_fd", "lifeline_fd"):
        os.set_inheritable(int(config[key]), False)
    threading.Thread(
        target=_watch_lifeline, args=(int(config["lifeline_fd"]),), daemon=True
    ).start()
    apply_limits(config)
    if config.get("no_new_privs"):
        set_no_new_privs()
    for stream in (sys.stdout, sys.stderr):
        # Line buffering, as on a terminal: what was printed before a kill is not lost.
        stream.reconfigure(errors="backslashreplace", line_buffering=True)  # type: ignore[union-attr]
    workdir = str(config["workdir"])
    os.chdir(workdir)
    sys.path.insert(0, workdir)
    worker = Worker(config)
    guards = config.get("guards")
    if guards:
        install_guards(guards["read"], guards["write"], guards["deny"])
    worker.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
