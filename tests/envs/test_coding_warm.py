"""Warm sandboxes through the coding environment: reused only where nothing leaks.

An episode's code tries to leave everything it can behind for the next episode — files
and what it sets on its directory, processes (detached, exec'd, plain forks), its
environment, ``sys.modules``, open descriptors, System V IPC objects, a keyring entry, a
POSIX message queue — and every later episode, some of them in the very sandbox that
episode ran in (recycled), looks for each of them and finds none. Runs where warm
sandboxes work (the namespace modes as root); skipped elsewhere with the reason.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from tests.envs.test_coding import FAST, SOLUTIONS, run, sandbox_options, survivors

from corral.envs.coding import CodingEnv, SandboxMode
from corral.sandbox import processes_of

KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}
"""``add_key`` and ``keyctl`` system call numbers, where the test knows them."""

PLANT = """
import ctypes, json, os, sys, time, types
token = {token!r}
libc = ctypes.CDLL(None, use_errno=True)
planted = {{}}
# Files, and what can be set on the directory itself.
open("planted-" + token, "w").write(token)
os.makedirs("sub/deeper", exist_ok=True)
open("sub/deeper/file", "w").write(token)
os.symlink("/etc/passwd", "link-" + token)
try:
    os.setxattr(".", "user.planted", token.encode())
    planted["xattr"] = True
except OSError as exc:
    planted["xattr"] = str(exc)
os.utime(".", (1234567, 1234567))
os.chmod(".", 0o755)
# Processes: detached and exec'd, detached and plain, and a plain fork.
for detach, execute in ((True, True), (True, False), (False, False)):
    if os.fork() == 0:
        if detach:
            os.setsid()
            if os.fork():
                os._exit(0)
        if execute:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", token])
        sys.argv[:] = ["planted", token]
        while True:
            time.sleep(1)
# The interpreter's own state.
os.environ["PLANTED"] = token
sys.modules["planted_module"] = types.ModuleType(token)
json.planted = token
keep = [open("held-" + token, "w"), os.pipe(), os.dup(1)]
# System V IPC (keys the probe knows), a keyring entry, a POSIX message queue.
planted["shm"] = libc.shmget(0xC0FFEE, 4096, 0o1666)
planted["msg"] = libc.msgget(0xC0FFEF, 0o1666)
planted["sem"] = libc.semget(0xC0FFF0, 1, 0o1666)
numbers = {keyctl!r}
if numbers:
    add_key = numbers[0]
    planted["key"] = libc.syscall(add_key, b"user", b"planted", token.encode(), len(token), -4)
mq_open = getattr(libc, "mq_open", None) or ctypes.CDLL("librt.so.1").mq_open
planted["mq"] = mq_open(b"/planted", os.O_CREAT | os.O_RDWR, 0o600, None)
print(json.dumps(planted))
"""

PROBE = """
import ctypes, json, os, sys
token_prefix = "corral-leak-"
libc = ctypes.CDLL(None, use_errno=True)
seen = {{}}
seen["files"] = sorted(os.listdir("."))
seen["xattrs"] = os.listxattr(".")
info = os.stat(".")
seen["mtime"], seen["mode"] = int(info.st_mtime), oct(info.st_mode & 0o777)
processes = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdline = open(f"/proc/{{pid}}/cmdline", "rb").read()
        except OSError:
            continue
        if token_prefix.encode() in cmdline:
            processes.append(pid)
seen["processes"] = processes
seen["env"] = {{k: v for k, v in os.environ.items() if token_prefix in v or k == "PLANTED"}}
seen["modules"] = [name for name in sys.modules if name == "planted_module"]
seen["json_planted"] = getattr(__import__("json"), "planted", None)
seen["fds"] = {{}}
for fd in os.listdir("/proc/self/fd"):
    try:
        seen["fds"][fd] = os.readlink(f"/proc/self/fd/{{fd}}")
    except OSError:
        pass  # the directory listing's own descriptor

seen["shm"] = libc.shmget(0xC0FFEE, 0, 0)
seen["msg"] = libc.msgget(0xC0FFEF, 0)
seen["sem"] = libc.semget(0xC0FFF0, 0, 0)
seen["sysvipc"] = {{
    kind: open(f"/proc/sysvipc/{{kind}}").read().splitlines()[1:] for kind in ("shm", "msg", "sem")
}}
numbers = {keyctl!r}
if numbers:
    keyctl = numbers[1]
    seen["key"] = libc.syscall(keyctl, 10, -4, b"user", b"planted", 0)  # KEYCTL_SEARCH
mq_open = getattr(libc, "mq_open", None) or ctypes.CDLL("librt.so.1").mq_open
seen["mq"] = mq_open(b"/planted", os.O_RDONLY, 0, None)
print(json.dumps(seen))
"""


def report(env: CodingEnv, code: str) -> dict[str, Any]:
    """Run ``code`` (which prints one JSON object) and read what it printed."""
    obs = run(env, code)
    assert obs.exit_code == 0, obs.error or obs.stderr
    found: dict[str, Any] = json.loads(obs.stdout)
    return found


@pytest.fixture
def warm_env() -> Iterator[CodingEnv]:
    """A coding environment on warm sandboxes (one spare), or a skip saying why not."""
    found = sandbox_options(SandboxMode.BWRAP)
    if isinstance(found, str):
        pytest.skip(f"bwrap unavailable here: {found}")
    env = CodingEnv(limits=FAST, warm=1, **found)
    if env.sandbox_pool is None:
        env.close()
        pytest.skip("warm sandboxes need the namespace modes as root (corral is not root here)")
    try:
        yield env
    finally:
        env.close()


def test_nothing_an_episode_leaves_reaches_the_next(warm_env: CodingEnv) -> None:
    env = warm_env
    pool = env.sandbox_pool
    assert pool is not None
    numbers = KEYCTL.get(os.uname().machine)
    uids: list[int] = []
    baseline: dict[str, object] | None = None
    for episode in range(6):
        # Give the pool time to recycle the previous episode's sandbox, so that later
        # episodes run in sandboxes that held an earlier one.
        assert pool.wait_ready(1, timeout=60)
        env.reset(task="fizzbuzz")
        uid = env.state().sandbox_uid
        assert uid is not None
        uids.append(uid)
        seen = report(env, PROBE.format(keyctl=numbers))
        fds = seen.pop("fds")
        assert all("planted" not in target and "held-" not in target for target in fds.values())
        if baseline is None:
            baseline = {"fds": sorted(fds), **seen}
            assert seen["files"] == [] and seen["xattrs"] == [] and seen["mode"] == "0o700"
        else:
            assert sorted(fds) == baseline["fds"], fds
            assert seen["mtime"] != 1234567
            for key in ("files", "xattrs", "mode", "processes", "env", "modules"):
                assert seen[key] == baseline[key], (episode, key, seen[key])
        assert seen["processes"] == [] and seen["env"] == {} and seen["modules"] == []
        assert seen["json_planted"] is None
        assert seen["shm"] == seen["msg"] == seen["sem"] == -1  # ENOENT: not there
        assert seen["sysvipc"] == {"shm": [], "msg": [], "sem": []}
        assert seen["mq"] == -1
        if numbers:
            assert seen["key"] == -1  # ENOKEY
        token = f"corral-leak-{uuid.uuid4()}"
        planted = report(env, PLANT.format(token=token, keyctl=numbers))
        # The plants took (where the sandbox allows them at all).
        assert planted["shm"] >= 0 and planted["msg"] >= 0 and planted["sem"] >= 0
        if numbers:
            assert planted["key"] > 0
        assert planted["mq"] == -1  # no POSIX queue can be made: it would outlive its processes
        # In the episode itself, a later action still finds its files (one workspace per
        # episode) but none of the processes of the action before.
        after = report(env, PROBE.format(keyctl=numbers))
        assert f"planted-{token}" in after["files"] and after["processes"] == []
    # Some episodes ran in a sandbox an earlier episode had used: the test saw reuse.
    assert len(set(uids)) < len(uids), uids
    assert pool.stats.recycled >= 1


def test_a_warm_episode_solves_like_a_cold_one(warm_env: CodingEnv) -> None:
    for persistent in (False, True):
        obs = warm_env.reset(task="fizzbuzz", persistent=persistent)
        assert obs.metadata["persistent"] is persistent
        wrong = run(warm_env, "def fizzbuzz(n):\n    return str(n)\nx = 41")
        assert 0 < (wrong.reward or 0) < 1 and not wrong.done
        carried = run(warm_env, "print(x + 1)")
        assert carried.stdout == ("42\n" if persistent else "")
        right = run(warm_env, SOLUTIONS["fizzbuzz"])
        assert right.reward == 1.0 and right.done


def test_between_actions_nothing_runs_as_the_sandbox_uid(warm_env: CodingEnv) -> None:
    """The worker forked ahead of the next action is not the agent's until it gets one."""
    warm_env.reset(task="fizzbuzz")
    uid = warm_env.state().sandbox_uid
    assert uid is not None
    marker = f"corral-test-{uuid.uuid4()}"
    run(
        warm_env,
        "import os\nif os.fork() == 0:\n    os.setsid()\n"
        f"    os.execv('/bin/sleep', ['sleep', '600', {marker!r}])",
    )
    assert survivors(uid, marker) == []
    assert processes_of(uid) == []


def test_the_zygote_is_out_of_the_agents_reach(warm_env: CodingEnv) -> None:
    warm_env.reset(task="fizzbuzz")
    obs = run(
        warm_env,
        "import os, signal\n"
        "zygote = os.getppid()\n"
        "print(zygote, open(f'/proc/{zygote}/status').read().split('Uid:')[1].split()[0])\n"
        "for what in ('mem', 'environ', 'fd'):\n"
        "    path = f'/proc/{zygote}/{what}'\n"
        "    try:\n"
        "        os.listdir(path) if what == 'fd' else open(path, 'rb').read(1)\n"
        "        print(what, 'readable')\n"
        "    except PermissionError:\n"
        "        print(what, 'refused')\n"
        "for sig in (signal.SIGKILL, signal.SIGSTOP):\n"
        "    try:\n"
        "        os.kill(zygote, sig)\n"
        "        print('signalled')\n"
        "    except PermissionError:\n"
        "        print('signal refused')\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n",
    )
    lines = obs.stdout.splitlines()
    assert lines[0].split()[1] == "0"  # the zygote is root (with three capabilities)
    assert lines[1:4] == ["mem refused", "environ refused", "fd refused"]
    assert lines[4:6] == ["signal refused", "signal refused"]
    assert lines[6] == "0000000000000000"  # the agent has no capability at all
    assert run(warm_env, SOLUTIONS["fizzbuzz"]).reward == 1.0  # the zygote carried on
