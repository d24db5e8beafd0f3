"""A watchdog process that cleans up what a killed process started.

A process killed with SIGKILL runs no ``atexit`` handler, no ``finally`` and no
finalizer, so the servers and containers it started would outlive it. The first provider
in a process therefore starts a small *guardian*: a separate process, in its own session,
that holds the read end of a pipe whose write end only the parent has. The parent tells
it, one line at a time, what to clean up (process groups of local servers, the labels of
its Docker containers). When the parent dies, however it dies, the kernel closes the
pipe; the guardian reads end-of-file, stops the process groups still registered
(SIGTERM, then SIGKILL), removes the parent's containers, runs the cleanup commands
still registered (the Kubernetes provider's sweep of its Pods), and exits.

Processes are identified by pid *and* start time, so a recycled pid is never killed.
A forked child closes its inherited copy of the pipe (it is the parent's lifeline, not
the child's). The guardian runs from this file's source with the standard library only;
it imports the Docker SDK only to remove containers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_KILL_GRACE = 3.0
_COMMAND_TIMEOUT = 60.0


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), None if it is gone.

    A zombie counts as gone: it runs nothing and its parent will reap it.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


class Guardian:
    """This process's handle on its guardian (see the module docstring).

    Use :func:`guardian` for the process-wide instance. Registration is thread-safe; a
    guardian that died is restarted on the next registration with everything registered.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._pids: dict[int, tuple[int, bool]] = {}
        self._labels: dict[str, None] = {}
        self._commands: dict[str, None] = {}

    @property
    def pid(self) -> int | None:
        """The guardian's pid, once started."""
        return self._process.pid if self._process is not None else None

    def watch(self, pid: int, *, graceful: bool = True) -> None:
        """Stop the process group led by ``pid`` if this process dies first.

        Args:
            pid: the group's leader.
            graceful: SIGTERM first and SIGKILL after a grace period; False kills at once
                (for a group that cannot shut down gracefully, such as a sandbox launcher).
        """
        started = start_time(pid)
        if started is None:
            return
        with self._lock:
            self._pids[pid] = (started, graceful)
            self._send(f"+ {pid} {started} {int(graceful)}\n")

    def release(self, pid: int) -> None:
        """Forget ``pid`` (it was stopped normally)."""
        with self._lock:
            if self._pids.pop(pid, None) is not None:
                self._send(f"- {pid}\n")

    def watch_containers(self, labels: Mapping[str, str]) -> None:
        """Remove the Docker containers carrying all of ``labels`` if this process dies."""
        line = "docker " + " ".join(f"{k}={v}" for k, v in sorted(labels.items())) + "\n"
        with self._lock:
            if line not in self._labels:
                self._labels[line] = None
                self._send(line)

    def run_at_death(self, argv: Sequence[str]) -> None:
        """Run ``argv`` (a cleanup command) if this process dies before :meth:`forget_command`."""
        line = "run " + json.dumps(list(argv)) + "\n"
        with self._lock:
            if line not in self._commands:
                self._commands[line] = None
                self._send(line)

    def forget_command(self, argv: Sequence[str]) -> None:
        """Drop a command of :meth:`run_at_death` (its cleanup was done normally)."""
        encoded = json.dumps(list(argv))
        with self._lock:
            if self._commands.pop(f"run {encoded}\n", 0) is None:
                self._send(f"norun {encoded}\n")

    def _send(self, line: str) -> None:
        """Write ``line`` to the guardian, (re)starting it first if needed (lock held)."""
        process = self._process
        if process is None or process.poll() is not None:
            self._start()
            return  # _start replays every registration, this one included
        assert process.stdin is not None
        try:
            process.stdin.write(line.encode())
            process.stdin.flush()
        except OSError:
            self._start()

    def _start(self) -> None:
        if self._process is not None:
            self._process.poll()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        process = subprocess.Popen(
            [sys.executable, "-c", Path(__file__).read_text(encoding="utf-8"), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        assert process.stdin is not None
        lines = [f"+ {pid} {started} {int(soft)}\n" for pid, (started, soft) in self._pids.items()]
        process.stdin.write("".join([*lines, *self._labels, *self._commands]).encode())
        process.stdin.flush()
        self._process = process

    def _forget_in_child(self) -> None:
        """After ``fork``: drop the parent's lifeline without telling the guardian anything."""
        process = self._process
        if process is not None and process.stdin is not None:
            # Point the descriptor at /dev/null: that closes this copy of the pipe, and
            # whatever the file object flushes or closes later cannot reach the guardian
            # or a descriptor reused for something else.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, process.stdin.fileno())
            os.close(devnull)
            # Not this process's child: never wait for it.
            process.returncode = 0
        self._lock = threading.Lock()
        self._process = None
        self._pids = {}
        self._labels = {}
        self._commands = {}


_guardian: Guardian | None = None
_guardian_lock = threading.Lock()


def guardian() -> Guardian:
    """This process's guardian handle (the process itself starts on first registration)."""
    global _guardian
    with _guardian_lock:
        if _guardian is None:
            _guardian = Guardian()
        return _guardian


def _after_fork_in_child() -> None:
    global _guardian, _guardian_lock
    _guardian_lock = threading.Lock()
    if _guardian is not None:
        _guardian._forget_in_child()
        _guardian = None


if hasattr(os, "register_at_fork") and __name__ != "__main__":
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------- the process


def _alive(pid: int, started: int) -> bool:
    return start_time(pid) == started


def _stop_groups(pids: dict[int, tuple[int, bool]]) -> None:
    """SIGTERM each registered process group, then SIGKILL what is left after a grace.

    Groups registered as not graceful are killed at once.
    """
    live = {pid: started for pid, (started, _) in pids.items() if _alive(pid, started)}
    graceful = {pid for pid, (_, soft) in pids.items() if soft and pid in live}
    if len(graceful) < len(live):
        _kill_all({pid: started for pid, started in live.items() if pid not in graceful})
        live = {pid: started for pid, started in live.items() if pid in graceful}
    for pid in live:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGTERM)
                break
            except (ProcessLookupError, PermissionError):
                continue
    deadline = time.monotonic() + _KILL_GRACE
    while live and time.monotonic() < deadline:
        live = {pid: started for pid, started in live.items() if _alive(pid, started)}
        time.sleep(0.05)
    _kill_all(live)


def _kill_all(live: dict[int, int]) -> None:
    """SIGKILL the process groups (or lone processes) in ``live`` that still run."""
    for pid, started in live.items():
        if not _alive(pid, started):
            continue
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue


def _remove_containers(label_sets: list[dict[str, str]]) -> None:
    try:
        import docker
    except ImportError:
        return
    try:
        client = docker.from_env(version="auto", timeout=20)
    except Exception:
        return
    for labels in label_sets:
        try:
            found = client.containers.list(
                all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]}
            )
        except Exception:
            continue
        for container in found:
            try:
                container.remove(force=True)
            except Exception:
                continue


def _run_commands(commands: list[list[str]]) -> None:
    """Run each cleanup command, bounded in time; a failing one does not stop the others."""
    for argv in commands:
        try:
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=_COMMAND_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue


def _main() -> int:
    """The guardian: read registrations until end-of-file, then clean up.

    Its one argument, the parent's pid, is there for ``ps`` readers.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pids: dict[int, tuple[int, bool]] = {}
    label_sets: list[dict[str, str]] = []
    commands: dict[str, None] = {}
    for raw in sys.stdin.buffer:
        text = raw.decode("utf-8", "replace")
        if text.startswith(("run ", "norun ")):
            verb, encoded = text.split(" ", 1)
            if verb == "run":
                commands[encoded.strip()] = None
            else:
                commands.pop(encoded.strip(), None)
            continue
        parts = text.split()
        if len(parts) == 4 and parts[0] == "+":
            pids[int(parts[1])] = (int(parts[2]), parts[3] == "1")
        elif len(parts) == 2 and parts[0] == "-":
            pids.pop(int(parts[1]), None)
        elif len(parts) > 1 and parts[0] == "docker":
            label_sets.append(dict(item.split("=", 1) for item in parts[1:] if "=" in item))
    _stop_groups(pids)
    if label_sets:
        _remove_containers(label_sets)
    _run_commands([json.loads(c) for c in commands])
    return 0


if __name__ == "__main__":
    sys.exit(_main())
