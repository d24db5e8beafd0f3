"""The coding environment and its sandbox, run for real in every mode this machine supports.

Security tests are parametrized over the sandbox modes; a mode that does not work here
is skipped with the probe's reason (``.ci/setup-sandbox.sh`` installs what they need).
CPU limits are small (1 CPU second) so that every test stays short; wall clocks are
generous except where a test is about them, so that a loaded machine passes too.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tests.support.servers import running, wait_until

from corral.client import AsyncEnvClient
from corral.envs.coding import (
    TASKS,
    CodeAction,
    CodeObservation,
    CodingEnv,
    Problem,
    SandboxLimits,
    SandboxMode,
    SandboxUnavailable,
    TaskCase,
    available_modes,
)
from corral.envs.coding.env import MAX_CODE_CHARS
from corral.envs.coding.tasks import matches
from corral.errors import InvalidArgument
from corral.sandbox import canonical, processes_of

FAST = SandboxLimits(
    cpu_seconds=1,
    # Wall clocks a loaded machine meets (sandboxes run niced); the tests about the wall
    # clock set a short one themselves.
    wall_seconds=30,
    test_wall_seconds=30,
    memory_bytes=256 * 1024 * 1024,
    max_processes=16,
    start_timeout=30,
)

SOLUTIONS = {
    "fizzbuzz": """
def fizzbuzz(n):
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
""",
    "is_prime": """
def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True
""",
    "fibonacci": """
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
""",
    "reverse_words": "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
    "is_palindrome": """
def is_palindrome(s):
    kept = [c.lower() for c in s if c.isalnum()]
    return kept == kept[::-1]
""",
    "roman_to_int": """
def roman_to_int(s):
    value = dict(I=1, V=5, X=10, L=50, C=100, D=500, M=1000)
    total = 0
    for i, c in enumerate(s):
        if i + 1 < len(s) and value[c] < value[s[i + 1]]:
            total -= value[c]
        else:
            total += value[c]
    return total
""",
    "run_length_encode": """
import itertools
def run_length_encode(s):
    return "".join(f"{k}{len(list(g))}" for k, g in itertools.groupby(s))
""",
    "word_count": """
import collections, re
def word_count(text):
    return dict(collections.Counter(w.lower() for w in re.findall("[A-Za-z]+", text)))
""",
    "flatten": """
def flatten(nested):
    out = []
    for item in nested:
        out.extend(flatten(item) if isinstance(item, list) else [item])
    return out
""",
    "primes_up_to": """
def primes_up_to(n):
    return [p for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))]
""",
}


@functools.cache
def sandbox_options(mode: SandboxMode) -> dict[str, Any] | str:
    """CodingEnv kwargs for ``mode`` on this machine, or why it cannot run here."""
    reason = available_modes()[mode]
    if reason is None:
        return {"sandbox": mode}
    if mode is SandboxMode.RLIMITS:
        # As root the rlimits mode needs an interpreter an unprivileged uid can reach.
        for candidate in ("/usr/bin/python3", shutil.which("python3")):
            if candidate and available_modes(python=os.path.realpath(candidate))[mode] is None:
                return {"sandbox": mode, "python": os.path.realpath(candidate)}
    return reason


ALL_MODES = list(SandboxMode)
ISOLATING_MODES = [SandboxMode.BWRAP, SandboxMode.UNSHARE]


@pytest.fixture
def make_env() -> Iterator[Callable[..., CodingEnv]]:
    """Build CodingEnvs (closed at teardown) for a mode, skipping unsupported ones."""
    envs: list[CodingEnv] = []

    def build(mode: SandboxMode | None = None, **kwargs: Any) -> CodingEnv:
        options: dict[str, Any] = {}
        if mode is not None:
            found = sandbox_options(mode)
            if isinstance(found, str):
                pytest.skip(f"sandbox mode {mode} unavailable here: {found}")
            options = found
        env = CodingEnv(**{"limits": FAST, **options, **kwargs})
        envs.append(env)
        return env

    yield build
    for env in envs:
        env.close()


def run(env: CodingEnv, code: str) -> CodeObservation:
    return env.step(CodeAction(code=code))


def survivors(uid: int | None, marker: str | None = None, wait: float = 30.0) -> list[int]:
    """Processes still running as ``uid`` or with ``marker`` in their command line."""
    deadline = time.monotonic() + wait
    while True:
        found = set(processes_of(uid)) if uid is not None else set()
        if marker is not None:
            found |= _with_marker(marker)
        if not found or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.05)


def _with_marker(marker: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.add(int(entry.name))
    return found


def background_sleepers(marker: str, count: int = 3) -> str:
    """Agent code leaving ``count`` detached processes behind (exec'd where allowed)."""
    return f"""
import os, sys, time
for _ in range({count}):
    if os.fork() == 0:
        os.setsid()
        try:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)",
                                      "{marker}"])
        except OSError:  # the rlimits mode's guards refuse exec: just sleep instead
            while True:
                time.sleep(1)
print("spawned")
"""


def require_cleanup_checkable(env: CodingEnv) -> None:
    if env.state().sandbox_uid is None and env.sandbox_profile.mode is SandboxMode.RLIMITS:
        pytest.skip("rlimits mode without root cannot find setsid() children (documented)")


# --- modes and setup ---------------------------------------------------------------


def test_available_modes_reports_every_mode_with_a_reason() -> None:
    report = available_modes()
    assert set(report) == set(SandboxMode)
    for mode, reason in report.items():
        assert reason is None or (isinstance(reason, str) and str(mode) in reason)


def test_auto_picks_the_strongest_working_mode(make_env: Callable[..., CodingEnv]) -> None:
    report = available_modes()
    working = [m for m in SandboxMode if report[m] is None]
    if not working:
        with pytest.raises(SandboxUnavailable):
            CodingEnv(limits=FAST)
        return
    env = make_env()
    assert env.sandbox_profile.mode is working[0]
    assert env.state().sandbox_mode is working[0]
    obs = env.reset(task="fizzbuzz")
    assert obs.metadata["sandbox_mode"] == str(working[0])


def test_a_missing_interpreter_is_reported_for_each_mode() -> None:
    with pytest.raises(SandboxUnavailable, match="/nonexistent/python") as info:
        CodingEnv(python="/nonexistent/python")
    for mode in SandboxMode:
        assert str(mode) in str(info.value)


# --- rewards and episodes ----------------------------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
def test_correct_solution_gets_reward_one_and_terminates(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode)
    env.reset(task="fizzbuzz")
    obs = run(env, SOLUTIONS["fizzbuzz"] + "print('defined')")
    assert obs.reward == 1.0
    assert obs.done and not obs.truncated
    assert obs.tests_passed == obs.tests_total == len(TASKS[0].cases)
    assert all(r.passed and r.error is None for r in obs.test_results)
    assert obs.stdout == "defined\n"
    assert obs.exit_code == 0 and obs.error is None and obs.killed_reason is None
    state = env.state()
    assert state.solved and state.done and state.best_reward == 1.0
    with pytest.raises(RuntimeError, match="episode is over"):
        run(env, "pass")


def test_every_shipped_task_is_solvable(make_env: Callable[..., CodingEnv]) -> None:
    assert sorted(SOLUTIONS) == sorted(t.name for t in TASKS)
    env = make_env()
    for task in TASKS:
        env.reset(task=task.name)
        obs = run(env, SOLUTIONS[task.name])
        assert obs.reward == 1.0, (task.name, obs.test_results, obs.stderr)
        assert task.entry_point in task.prompt(persistent=False)


def test_partly_right_solution_gets_the_fraction(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env()
    env.reset(task="fizzbuzz")
    # Forgets the FizzBuzz case (checks 3 before 15).
    obs = run(
        env,
        "def fizzbuzz(n):\n    return 'Fizz' if n % 3 == 0 else 'Buzz' if n % 5 == 0 else str(n)\n",
    )
    task = next(t for t in TASKS if t.name == "fizzbuzz")
    right = [c.expected != "FizzBuzz" for c in task.cases]
    assert obs.reward == pytest.approx(sum(right) / len(right))
    assert 0 < obs.reward < 1 and not obs.done
    assert [r.passed for r in obs.test_results] == right
    assert {r.error for r in obs.test_results if not r.passed} == {"wrong answer"}


def test_exceptions_and_missing_functions_are_reported_per_case(
    make_env: Callable[..., CodingEnv],
) -> None:
    env = make_env()
    env.reset(task="is_prime")
    obs = run(
        env, "def is_prime(n):\n    if n > 100:\n        raise ValueError(n)\n    return n == 2"
    )
    errors = {r.error for r in obs.test_results if not r.passed}
    assert "raised ValueError" in errors and "wrong answer" in errors
    obs = run(env, "x = 1")
    assert obs.reward == 0.0
    assert {r.error for r in obs.test_results} == {"is_prime is not defined"}
    obs = run(env, "is_prime = 3")
    assert {r.error for r in obs.test_results} == {"is_prime is a int, not a function"}


def test_the_episode_is_truncated_after_max_steps(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env()
    env.reset(task="fibonacci", max_steps=2)
    assert not run(env, "pass").done
    obs = run(env, "pass")
    assert obs.done and obs.truncated and obs.reward == 0.0
    assert env.state().done and not env.state().solved


def test_code_errors_show_a_traceback_of_the_agents_code(
    make_env: Callable[..., CodingEnv],
) -> None:
    env = make_env()
    env.reset(task="fizzbuzz")
    obs = run(env, "x = 1\ny = x / 0\n")
    assert obs.exit_code == 1
    assert obs.error == "ZeroDivisionError: division by zero"
    assert 'File "<step 1>", line 2' in obs.stderr and "y = x / 0" in obs.stderr
    obs = run(env, "def broken(:\n")
    assert obs.exit_code == 1 and obs.error is not None and "SyntaxError" in obs.error
    obs = run(env, "import sys\nsys.exit(3)")
    assert obs.exit_code == 3 and obs.killed_reason is None


def test_output_printed_by_the_hidden_tests_is_not_shown(
    make_env: Callable[..., CodingEnv],
) -> None:
    env = make_env()
    env.reset(task="fibonacci")
    obs = run(env, "def fibonacci(n):\n    print('ARG', n)\n    return n\nprint('ready')")
    assert obs.stdout == "ready\n"
    assert "ARG" not in obs.stdout + obs.stderr


def test_an_eq_override_cannot_fake_a_pass(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env()
    env.reset(task="fizzbuzz")
    obs = run(
        env,
        "class Anything(str):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = str.__hash__\n"
        "def fizzbuzz(n):\n    return Anything('?')\n",
    )
    assert obs.reward == 0.0


def test_tampering_with_the_reply_channel_kills_the_worker(
    make_env: Callable[..., CodingEnv],
) -> None:
    env = make_env()
    env.reset(task="fizzbuzz")
    # The worker's reply pipe is its one write-only pipe past fd 2 (cold or forked).
    obs = run(
        env,
        "import fcntl, os, stat, time\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        flags, mode = fcntl.fcntl(fd, fcntl.F_GETFL), os.fstat(fd).st_mode\n"
        "    except OSError:\n"
        "        continue\n"
        "    if stat.S_ISFIFO(mode) and flags & os.O_ACCMODE == os.O_WRONLY:\n"
        "        os.write(fd, b'\\x00\\x00\\x00\\x02{]')\n"
        "time.sleep(5)",
    )
    assert obs.killed_reason == "protocol"
    assert obs.reward == 0.0
    assert obs.exit_code is None


def test_hidden_test_timeouts_keep_the_cases_that_passed(
    make_env: Callable[..., CodingEnv],
) -> None:
    # The CPU budget (1 s) ends the tests on any machine; the wall clock is only a backstop.
    env = make_env(limits=FAST.model_copy(update={"test_wall_seconds": 120.0}))
    env.reset(task="is_prime")
    # Correct but O(n): the last case (2**31 - 1) cannot finish in time.
    obs = run(env, "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n")
    assert obs.killed_phase == "tests"
    assert obs.killed_reason in ("wall_clock", "cpu_time") and obs.timed_out
    assert obs.exit_code == 0
    assert obs.test_results[-1].error is not None
    assert obs.test_results[-1].error.startswith("not run: killed")
    assert obs.tests_passed == obs.tests_total - 1
    assert obs.reward == pytest.approx((obs.tests_total - 1) / obs.tests_total)


# --- options and models ------------------------------------------------------------


def test_seed_chooses_the_task_deterministically(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env()
    first = [env.reset(seed=s).task for s in range(12)]
    assert first == [env.reset(seed=s).task for s in range(12)]
    assert len(set(first)) > 3
    assert env.reset(seed=5, task="flatten").task == "flatten"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tsak": "fizzbuzz"}, "tsak"),
        ({"task": "nope"}, "unknown task 'nope'"),
        ({"persistent": "yes"}, "persistent"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_steps": 1.5}, "max_steps"),
    ],
)
def test_bad_reset_options_are_refused_clearly(
    make_env: Callable[..., CodingEnv], options: dict[str, Any], match: str
) -> None:
    env = make_env()
    with pytest.raises(InvalidArgument, match=match):
        env.reset(**options)


def test_actions_have_a_size_limit() -> None:
    CodeAction(code="x" * MAX_CODE_CHARS)
    with pytest.raises(ValidationError, match="at most"):
        CodeAction(code="x" * (MAX_CODE_CHARS + 1))
    with pytest.raises(ValidationError):
        CodeAction.model_validate({"code": "pass", "extra": 1})


def test_step_before_reset_and_after_close_fail(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env()
    with pytest.raises(RuntimeError, match="reset"):
        run(env, "pass")
    assert env.state().task is None
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_custom_tasks_and_their_validation(make_env: Callable[..., CodingEnv]) -> None:
    double = Problem(
        name="double",
        signature="def double(x: int) -> int",
        description="Return 2 * x.",
        examples=("double(2) == 4",),
        cases=(TaskCase(args=(3,), expected=6), TaskCase(args=(-1,), expected=-2)),
    )
    env = make_env(tasks=[double])
    assert env.reset(seed=1).task == "double"
    assert run(env, "def double(x):\n    return x + x").reward == 1.0
    with pytest.raises(ValueError, match="JSON"):
        TaskCase(args=(object(),), expected=1)
    with pytest.raises(ValueError, match="signature"):
        Problem(name="t", signature="lambda: 1", description="", examples=(), cases=double.cases)
    with pytest.raises(ValueError, match="no hidden cases"):
        Problem(name="t", signature="def t()", description="", examples=(), cases=())
    with pytest.raises(ValueError, match="unique"):
        CodingEnv(tasks=[double, double])


def test_comparison_is_type_aware_and_tolerant_for_floats() -> None:
    assert matches([1, (2, 3)], canonical([1, (2, 3)]))
    assert not matches([1, [2, 3]], canonical([1, (2, 3)]))
    assert not matches(True, canonical(1))
    assert not matches(1, canonical(True))
    assert matches(1, canonical(1.0))
    assert matches(0.3, canonical(0.1 + 0.2))
    assert not matches(0.3, canonical(0.31))
    assert not matches(float("nan"), canonical(float("nan")))
    assert matches({"a": 1, "b": [2]}, canonical({"b": [2], "a": 1}))
    assert not matches({"a": 1}, canonical({"a": 1, "b": 2}))
    assert matches({1, 2, 3}, canonical({3, 2, 1}))
    assert matches(None, canonical(None))
    assert not matches("1", canonical(1))
    for malformed in (None, [], ["int"], ["list", 3], ["dict", [[1]]], "int", ["other", "x", "y"]):
        assert not matches([1], malformed)
    deep: list[Any] = []
    deep.append(deep)
    assert canonical(deep)[0] == "list"  # self-reference is cut off, not a crash


# --- isolation and limits ----------------------------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
def test_an_infinite_sleep_is_killed_by_the_wall_clock(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode, limits=FAST.model_copy(update={"wall_seconds": 2.0}))
    env.reset(task="fizzbuzz")
    marker = f"corral-test-{uuid.uuid4()}"
    obs = run(env, background_sleepers(marker) + "import time\nwhile True:\n    time.sleep(1)")
    assert obs.timed_out and obs.killed_reason == "wall_clock" and obs.killed_phase == "code"
    assert obs.exit_code is None
    assert obs.error == "killed: wall-clock limit of 2 s exceeded"
    assert obs.stdout == "spawned\n"
    assert all(r.error is not None and r.error.startswith("not run") for r in obs.test_results)
    require_cleanup_checkable(env)
    assert survivors(env.state().sandbox_uid, marker) == []


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_busy_loop_is_killed_by_the_cpu_limit(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode, limits=FAST.model_copy(update={"wall_seconds": 120.0}))
    env.reset(task="fizzbuzz")
    obs = run(env, "while True:\n    pass")
    assert obs.timed_out and obs.killed_reason == "cpu_time"
    assert obs.error == "killed: CPU time limit of 1 s exceeded"


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_memory_bomb_is_stopped_with_a_clear_observation(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode, persistent=True)
    env.reset(task="fizzbuzz")
    run(env, "kept = 1")
    obs = run(env, "hog = []\nwhile True:\n    hog.append(bytearray(10 * 1024 * 1024))")
    assert obs.killed_reason == "memory" and not obs.timed_out
    assert obs.error == f"killed: memory limit of {FAST.memory_bytes} bytes reached"
    assert "MemoryError" in obs.stderr
    assert not env.state().worker_alive
    obs = run(env, "print(kept)")
    assert obs.worker_restarted and "NameError" in obs.stderr
    assert env.state().worker_restarts == 1


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_fork_bomb_is_contained(make_env: Callable[..., CodingEnv], mode: SandboxMode) -> None:
    env = make_env(mode, persistent=True)
    env.reset(task="fizzbuzz")
    require_cleanup_checkable(env)
    uid = env.state().sandbox_uid
    # Counting forks that sleep: the process limit stops them with EAGAIN.
    obs = run(
        env,
        "import os, time\ncount = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(600)\n        count += 1\n"
        "except OSError as exc:\n    print(count, exc.errno)\n",
    )
    count, code = map(int, obs.stdout.split())
    assert code == 11  # EAGAIN
    assert 0 < count < FAST.max_processes
    # The classic bomb: every process forks forever. The wall clock ends it.
    obs = run(
        env,
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    )
    assert obs.killed_reason in ("wall_clock", "cpu_time")  # the parent spins too
    if uid is not None:
        assert survivors(uid) == []
    # The machine (and the environment) still works: a fresh worker solves the task.
    obs = run(env, SOLUTIONS["fizzbuzz"])
    assert obs.worker_restarted and obs.reward == 1.0


@pytest.mark.parametrize("mode", ALL_MODES)
def test_reading_outside_the_workdir_is_refused(
    make_env: Callable[..., CodingEnv], mode: SandboxMode, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o755)
    tmp_path.chmod(0o755)
    secret = outside / "secret.txt"
    secret.write_text("TOP-SECRET")
    secret.chmod(0o644)
    env = make_env(mode)
    env.reset(task="fizzbuzz")
    for path in (str(secret), "/etc/shadow"):
        obs = run(env, f"print(open({path!r}).read())")
        assert obs.exit_code == 1, obs.stdout
        assert obs.error is not None
        assert obs.error.split(":")[0] in ("PermissionError", "FileNotFoundError")
        assert "TOP-SECRET" not in obs.stdout
    obs = run(env, f"import os\nprint(os.listdir({str(outside)!r}))")
    assert obs.exit_code == 1 and "secret.txt" not in obs.stdout


@pytest.mark.parametrize("mode", ALL_MODES)
def test_writing_outside_the_workdir_is_refused(
    make_env: Callable[..., CodingEnv], mode: SandboxMode, tmp_path: Path
) -> None:
    open_dir = tmp_path / "world-writable"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    tmp_path.chmod(0o755)
    env = make_env(mode)
    env.reset(task="fizzbuzz")
    python_file = os.path.join(os.path.dirname(os.__file__), "this.py")
    for target in (open_dir / "planted.txt", Path("/tmp") / f"corral-{uuid.uuid4()}", python_file):
        obs = run(env, f"open({str(target)!r}, 'a').write('x')")
        assert obs.exit_code == 1, (target, obs.stderr)
        assert obs.error is not None and obs.error.split(":")[0] in (
            "PermissionError",
            "FileNotFoundError",
            "OSError",
        )
    assert not (open_dir / "planted.txt").exists()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_the_workdir_is_writable_private_and_per_episode(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode)
    env.reset(task="fizzbuzz")
    obs = run(env, "import os\nopen('notes.txt', 'w').write('hello')\nprint(os.getcwd())")
    assert obs.exit_code == 0, obs.stderr
    assert obs.stdout.strip() == env.state().workdir
    first = env.host_workdir
    assert first is not None and (first / "notes.txt").read_text() == "hello"
    assert run(env, "print(open('notes.txt').read())").stdout == "hello\n"
    env.reset(task="fizzbuzz")
    assert run(env, "import os\nprint(os.listdir('.'))").stdout == "[]\n"
    # The old directory is deleted (a cold sandbox's) or emptied for another episode (a
    # warm sandbox's, recycled in the background).
    assert wait_until(lambda: not (first / "notes.txt").exists(), timeout=60)


def test_large_files_hit_the_file_size_limit(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env(limits=FAST.model_copy(update={"max_file_bytes": 4096}))
    env.reset(task="fizzbuzz")
    obs = run(env, "open('big', 'wb').write(b'x' * 10000)")
    assert obs.exit_code == 1 and obs.error is not None and "File too large" in obs.error


@pytest.mark.parametrize("mode", ALL_MODES)
def test_connecting_to_the_host_is_refused(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        env = make_env(mode)
        env.reset(task="fizzbuzz")
        obs = run(
            env,
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "print('connected')",
        )
        assert obs.exit_code == 1 and "connected" not in obs.stdout
        assert obs.error is not None
        if mode in ISOLATING_MODES:
            # A separate network namespace: nothing listens there.
            assert obs.error.split(":")[0] in ("ConnectionRefusedError", "OSError")
        else:
            assert "network access is not allowed" in obs.error
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_hidden_paths_are_masked(make_env: Callable[..., CodingEnv], mode: SandboxMode) -> None:
    env = make_env(mode)
    stdlib = next(p for p in env.sandbox_profile.python.path if os.path.isfile(p + "/this.py"))
    hidden = os.path.join(stdlib, "this.py")
    env.reset(task="fizzbuzz")
    assert int(run(env, f"print(len(open({hidden!r}).read()))").stdout) > 100
    masked = make_env(mode, hidden_paths=[hidden])
    masked.reset(task="fizzbuzz")
    obs = run(masked, f"print(len(open({hidden!r}).read()))")
    # The hidden file is empty (bwrap, unshare) or refused (the rlimits mode's guards).
    assert obs.stdout == "0\n" or (obs.error is not None and "PermissionError" in obs.error)


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_isolating_modes_hide_the_host(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode)
    env.reset(task="fizzbuzz")
    obs = run(
        env,
        "import os, socket\nprint(sorted(os.listdir('/')))\nprint(os.getpid())\n"
        "print(socket.gethostname())\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])",
    )
    listing, pid, host, pids, caps = obs.stdout.splitlines()
    python_roots = {Path(p).parts[1] for p in env.sandbox_profile.python.prefixes}
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "usr"}
    assert set(eval(listing)) <= system | python_roots | {"workspace"}
    assert int(pid) < 10  # a fresh pid namespace
    assert host == "sandbox"
    assert len(eval(pids)) < 10  # only the sandbox's own processes are visible
    assert int(caps, 16) == 0


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_isolating_modes_allow_subprocesses(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode)
    env.reset(task="fizzbuzz")
    obs = run(
        env, "import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)"
    )
    assert obs.stdout == "b'hi\\n'\n", obs.stderr


def test_rlimits_mode_guards_refuse_programs_and_ctypes(
    make_env: Callable[..., CodingEnv],
) -> None:
    env = make_env(SandboxMode.RLIMITS)
    env.reset(task="fizzbuzz")
    for code in ("import subprocess", "import ctypes", "import os\nos.system('true')"):
        obs = run(env, code)
        assert obs.exit_code == 1 and obs.error is not None, code
        assert "PermissionError" in obs.error and "rlimits mode" in obs.error, code
    obs = run(env, "import os\nos.kill(os.getppid(), 0)")
    assert obs.error is not None and "signalling processes outside" in obs.error


@pytest.mark.parametrize("mode", ALL_MODES)
def test_output_is_capped(make_env: Callable[..., CodingEnv], mode: SandboxMode) -> None:
    env = make_env(mode, limits=FAST.model_copy(update={"max_output_bytes": 4096}))
    env.reset(task="fizzbuzz")
    obs = run(env, "import sys\nsys.stderr.write('e' * 100)\nwhile True:\n    print('x' * 1000)")
    assert obs.killed_reason == "output_limit"
    assert obs.stdout_truncated and len(obs.stdout) == 4096
    assert not obs.stderr_truncated


# --- persistent mode, restarts and cleanup -----------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
def test_persistent_mode_keeps_variables_across_steps(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode)
    obs = env.reset(task="fizzbuzz", persistent=True)
    assert "persist" in obs.prompt
    assert env.state().worker_alive
    run(env, "x = 41\ndef helper(n):\n    return 'Fizz' if n % 3 == 0 else str(n)")
    assert run(env, "print(x + 1)").stdout == "42\n"
    partial = run(env, "def fizzbuzz(n):\n    return helper(n)")
    assert 0 < partial.reward < 1
    assert run(env, SOLUTIONS["fizzbuzz"]).reward == 1.0


def test_non_persistent_mode_forgets_between_steps(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env()
    obs = env.reset(task="fizzbuzz")
    assert "fresh interpreter" in obs.prompt
    run(env, "x = 1")
    obs = run(env, "print(x)")
    assert obs.error == "NameError: name 'x' is not defined"


def test_a_dead_persistent_worker_is_restarted(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env(persistent=True)
    env.reset(task="fizzbuzz")
    run(env, "x = 1")
    obs = run(env, "import os\nos._exit(7)")
    assert obs.killed_reason == "exited" and obs.exit_code is None
    assert obs.error == "the process ended before finishing (exit status 7)"
    assert not obs.worker_restarted
    obs = run(env, "print('x' in globals())")
    assert obs.worker_restarted and obs.stdout == "False\n"
    # A worker that dies between steps (here: a background thread) is noticed too.
    run(env, "import os, threading, time\nthreading.Timer(0.1, os._exit, (0,)).start()")
    assert wait_until(lambda: not env.state().worker_alive, timeout=60)
    assert run(env, "print('fresh')").worker_restarted
    assert env.state().worker_restarts == 2


@pytest.mark.parametrize("mode", ALL_MODES)
def test_close_removes_the_workdir_and_every_process(
    make_env: Callable[..., CodingEnv], mode: SandboxMode
) -> None:
    env = make_env(mode, persistent=True)
    env.reset(task="fizzbuzz")
    require_cleanup_checkable(env)
    marker = f"corral-test-{uuid.uuid4()}"
    assert run(env, background_sleepers(marker)).stdout == "spawned\n"
    uid, workdir = env.state().sandbox_uid, env.host_workdir
    assert workdir is not None and workdir.exists()
    assert survivors(uid, marker, wait=0) != []
    env.close()
    assert not workdir.exists() and not workdir.parent.exists()
    assert survivors(uid, marker) == []
    env.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        run(env, "pass")


def test_close_from_another_thread_interrupts_a_running_step(
    make_env: Callable[..., CodingEnv],
) -> None:
    env = make_env(limits=FAST.model_copy(update={"wall_seconds": 60.0}))
    env.reset(task="fizzbuzz")
    workdir = env.host_workdir
    assert workdir is not None
    results: list[CodeObservation] = []
    worker = threading.Thread(
        target=lambda: results.append(
            run(env, "open('started', 'w').close()\nimport time\ntime.sleep(60)")
        )
    )
    worker.start()
    assert wait_until(lambda: (workdir / "started").exists(), timeout=60)
    env.close()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert results[0].killed_reason == "closed"


def test_concurrent_sessions_are_independent(make_env: Callable[..., CodingEnv]) -> None:
    names = ["fizzbuzz", "is_prime", "fibonacci", "flatten"]
    envs = [make_env() for _ in names]
    rewards: dict[str, list[float]] = {}
    errors: list[BaseException] = []

    def play(env: CodingEnv, name: str) -> None:
        try:
            env.reset(task=name)
            wrong = run(
                env,
                f"def {next(t for t in TASKS if t.name == name).entry_point}(*a):\n    return None",
            )
            right = run(env, SOLUTIONS[name])
            rewards[name] = [wrong.reward or 0.0, right.reward or 0.0]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=play, args=pair) for pair in zip(envs, names, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert rewards == {name: [0.0, 1.0] for name in names}
    uids = [env.state().sandbox_uid for env in envs]
    if uids[0] is not None:
        assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_a_sandbox_does_not_outlive_a_killed_server(mode: SandboxMode, tmp_path: Path) -> None:
    """The lifeline: when the server is SIGKILLed, its sandboxes end themselves."""
    found = sandbox_options(mode)
    if isinstance(found, str):
        pytest.skip(f"sandbox mode {mode} unavailable here: {found}")
    marker = f"corral-test-{uuid.uuid4()}"
    script = tmp_path / "server.py"
    workdirs = tmp_path / "workdirs"
    workdirs.mkdir()
    script.write_text(
        "from corral.envs.coding import CodeAction, CodingEnv, SandboxLimits\n"
        f"env = CodingEnv(limits=SandboxLimits(wall_seconds=60), sandbox={str(mode)!r},\n"
        f"                workdir_root={str(workdirs)!r})\n"
        "env.reset(task='fizzbuzz', persistent=True)\n"
        f"env.step(CodeAction(code={background_sleepers(marker)!r}))\n"
        "print(env.state().sandbox_uid, flush=True)\n"
        "env.step(CodeAction(code='import time\\ntime.sleep(60)'))\n"
    )
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        printed = server.stdout.readline().strip()
        assert survivors(None, marker, wait=0) != []
    finally:
        server.kill()
        server.wait()
    uid = None if printed == "None" else int(printed)
    # The sleepers escaped with setsid(); the pid namespace takes them down with the worker.
    assert survivors(uid, marker) == []
    # The dead server's workspace (a mounted tmpfs, as root) is swept by the next server's
    # first workspace in that directory.
    # (One per warm sandbox the dead server had started: its episode's and the spares.)
    stale = list(workdirs.iterdir())
    assert stale
    env = CodingEnv(limits=FAST, sandbox=mode, workdir_root=str(workdirs))
    try:
        env.reset(task="fizzbuzz")
        assert not any(path.exists() for path in stale)
    finally:
        env.close()
    assert list(workdirs.iterdir()) == []
    assert str(workdirs) not in Path("/proc/self/mounts").read_text()


# --- through a real server ---------------------------------------------------------


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_served_sessions_each_get_their_own_sandbox(codec: str, tmp_path: Path) -> None:
    factory = functools.partial(CodingEnv, limits=FAST, workdir_root=str(tmp_path))
    with running(factory) as srv:

        async def play(name: str) -> Any:
            async with AsyncEnvClient(srv.url, env=CodingEnv, codec=codec) as env:
                first = await env.reset(task=name, persistent=True)
                assert first.observation.task == name and name in first.observation.prompt
                assert first.info["sandbox_mode"] == str(first.info["sandbox_mode"])
                await env.step(CodeAction(code="import time\ntime.sleep(0.2)\nhelper = 1"))
                wrong = await env.step(CodeAction(code="print(helper)\n1 / 0"))
                assert wrong.observation.stdout == "1\n" and wrong.reward == 0.0
                assert wrong.observation.error == "ZeroDivisionError: division by zero"
                assert not wrong.done
                right = await env.step(CodeAction(code=SOLUTIONS[name]))
                assert right.terminated and right.reward == 1.0
                state = await env.state()
                assert state.solved and state.step_count == 3 and state.task == name
                return state

        states = await asyncio.gather(*(play(n) for n in ("fizzbuzz", "is_prime", "flatten")))
        async with AsyncEnvClient(srv.url, env=CodingEnv, codec=codec) as env:
            with pytest.raises(InvalidArgument, match="unknown task 'nope'"):
                await env.reset(task="nope")
        # Closing a session closes its environment: workspace and processes go away.
        assert wait_until(lambda: not list(tmp_path.iterdir()))
    uids = [state.sandbox_uid for state in states]
    if uids[0] is not None:
        assert len(set(uids)) == 3
        assert all(survivors(uid) == [] for uid in uids)


MIB = 1024 * 1024
DISK_BOMBS = {
    # The audit's submission: 512 MiB into the working directory, as fast as it can.
    "one file": "n = 0\nwith open('big', 'wb') as f:\n"
    "    while n < 512:\n        f.write(b'x' * 2**20)\n        f.flush()\n        n += 1\n"
    "        print(n, flush=True)\n",
    "many files": "n = 0\nwhile n < 512:\n    with open(f'part{n}', 'wb') as f:\n"
    "        f.write(b'x' * 2**20)\n    n += 1\n    print(n, flush=True)\n",
    "empty files": "import os\nn = 0\nwhile n < 100_000:\n"
    "    os.close(os.open(f'e{n}', os.O_CREAT))\n    n += 1\nprint(n)\n",
}


@pytest.fixture
def searchable_tmp() -> Iterator[Path]:
    """A fresh directory any uid may traverse (pytest's own tmp_path is 0700 as root)."""
    path = Path(tempfile.mkdtemp(prefix="corral-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_a_disk_bomb_stops_at_the_workspace_quota(
    mode: SandboxMode, searchable_tmp: Path
) -> None:
    """Issue 11.13: the working directory has a size (and file count) bound, reported as
    the ``disk`` outcome; the directory is emptied and the episode goes on."""
    found = sandbox_options(mode)
    if isinstance(found, str):
        pytest.skip(f"sandbox mode {mode} unavailable here: {found}")
    tmp_path = searchable_tmp
    limit = 8 * MIB
    # Time limits far from reach: on a loaded machine the disk bound must still be what ends
    # each bomb (the polled mode measures between the sandbox's writes).
    limits = SandboxLimits(
        **{**FAST.model_dump(), "max_disk_bytes": limit, "cpu_seconds": 20, "wall_seconds": 60}
    )
    factory = functools.partial(CodingEnv, limits=limits, workdir_root=str(tmp_path), **found)
    with running(factory) as srv:
        async with AsyncEnvClient(srv.url, env=CodingEnv) as env:
            first = await env.reset(task="fizzbuzz", persistent=True)
            quota = first.info["disk_quota"]
            assert quota == ("polled" if mode is SandboxMode.RLIMITS else "tmpfs")
            assert first.info["limits"]["max_disk_bytes"] == limit
            for name, bomb in DISK_BOMBS.items():
                result = await env.step(CodeAction(code=bomb))
                obs = result.observation
                assert obs.killed_reason == "disk", (name, obs.error, obs.stderr[-300:])
                assert obs.error == (
                    "killed: the working directory reached its disk limit "
                    f"({limit} bytes or {limit // 4096} files)"
                )
                assert not obs.timed_out and obs.exit_code is None and result.reward == 0.0
                counts = obs.stdout.split()
                written = int(counts[-1]) if counts else 0
                if name != "empty files":
                    # Stopped long before the 512 MiB; exactly at the bound with a tmpfs.
                    assert written < 512, name
                    if quota == "tmpfs":
                        assert written * MIB <= limit, name
                # Emptied: the next action has the whole quota again. (Every workspace:
                # the session's, and the spare warm sandboxes', which are empty.)
                for workspace in tmp_path.iterdir():
                    assert list((workspace / "work").iterdir()) == [], name
            result = await env.step(CodeAction(code=SOLUTIONS["fizzbuzz"] + "open('a', 'w')"))
            assert result.observation.worker_restarted and result.reward == 1.0
    assert wait_until(lambda: not list(tmp_path.iterdir()))
