"""Warm sandboxes and their pool, below the coding environment: forked workers, sweeps,
recycling, a dead fork server, and a pool's life (spares, recycling, closing).

Runs where warm sandboxes work (bwrap as root); skipped elsewhere with the reason. The
episode-level proof that nothing leaks between episodes is
``tests/envs/test_coding_warm.py``.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sandbox import (
    SandboxLimits,
    SandboxMode,
    SandboxPool,
    SandboxProfile,
    WarmSandbox,
    available_modes,
    processes_of,
    resolve_profile,
)
from corral.sandbox.command import keeps_capabilities

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=30, test_wall_seconds=30, start_timeout=30)
PACKAGE = str(Path(__file__).resolve().parents[2] / "src" / "corral")


@pytest.fixture(scope="module")
def profile() -> SandboxProfile:
    reason = available_modes()[SandboxMode.BWRAP]
    if reason is not None:
        pytest.skip(f"bwrap unavailable here: {reason}")
    found = resolve_profile(SandboxMode.BWRAP)
    if not keeps_capabilities(found):
        pytest.skip(f"warm sandboxes need the namespace modes as root, not {found.describe()}")
    return found


@pytest.fixture
def sandbox(profile: SandboxProfile) -> Iterator[WarmSandbox]:
    box = WarmSandbox(profile, LIMITS, hidden_paths=[PACKAGE])
    try:
        yield box
    finally:
        box.close()


def test_each_worker_is_a_fresh_fork_that_the_sweep_ends(sandbox: WarmSandbox) -> None:
    first = sandbox.worker(cpu_hard=5)
    outcome = first.execute("import os\nx = 41\nprint(os.getuid(), os.getppid())", "<a>")
    assert outcome.exit_code == 0, outcome.stderr
    uid, parent = map(int, outcome.stdout.split())
    assert uid == sandbox.workspace.uid and parent == 2  # the zygote, after bwrap's init
    sandbox.finish(first, next_cpu_hard=5)  # swept, and the next one forked at once
    assert sandbox.workspace.uid is not None
    assert processes_of(sandbox.workspace.uid) == []  # the next one is not the uid yet
    second = sandbox.worker(cpu_hard=5)
    assert second.execute("print(x)", "<b>").exit_code == 1  # a fresh interpreter
    sandbox.finish(second, next_cpu_hard=None)


def test_a_request_lowers_a_workers_lifetime_cpu_limit(sandbox: WarmSandbox) -> None:
    worker = sandbox.worker(cpu_hard=3)
    code = "import resource\nprint(resource.getrlimit(resource.RLIMIT_CPU)[1])"
    assert worker.execute(code, "<cpu>").stdout.strip() == b"3"
    sandbox.finish(worker, next_cpu_hard=None)


def test_recycling_empties_the_directory_and_keeps_the_sandbox(sandbox: WarmSandbox) -> None:
    worker = sandbox.worker(cpu_hard=5)
    worker.execute("open('left', 'w').write('x')\nimport os\nos.mkdir('dir')", "<plant>")
    sandbox.finish(worker, next_cpu_hard=None)
    assert sorted(os.listdir(sandbox.workspace.host_workdir)) == ["dir", "left"]
    assert sandbox.recycle(cpu_hard=5)
    assert os.listdir(sandbox.workspace.host_workdir) == []
    assert sandbox.episodes == 1
    worker = sandbox.worker(cpu_hard=5)  # the one forked by the recycling
    assert worker.execute("import os\nprint(os.listdir('.'))", "<look>").stdout == b"[]\n"
    sandbox.finish(worker, next_cpu_hard=None)


def test_a_dead_fork_server_is_never_recycled_and_restarts(sandbox: WarmSandbox) -> None:
    sandbox.kill()
    assert not sandbox.alive
    assert not sandbox.recycle(cpu_hard=5)
    worker = sandbox.worker(cpu_hard=5)  # a new fork server on the same workspace
    assert worker.execute("print('back')", "<again>").stdout == b"back\n"
    sandbox.finish(worker, next_cpu_hard=None)


def test_a_pool_keeps_spares_recycles_and_closes_everything(profile: SandboxProfile) -> None:
    made: list[WarmSandbox] = []

    def factory() -> WarmSandbox:
        box = WarmSandbox(profile, LIMITS, hidden_paths=[PACKAGE])
        made.append(box)
        return box

    pool = SandboxPool(factory, spares=1, cpu_hard=5)
    assert pool.attach()
    try:
        assert pool.wait_ready(1, timeout=60)
        first = pool.acquire()
        assert pool.stats.cold == 0  # a spare was ready
        pool.release(first)
        again = {pool.acquire(), pool.acquire()}
        assert first in again  # recycled (in the background or by the acquisition)
        assert pool.stats.recycled == 1 and pool.stats.retired == 0
        for box in again:
            pool.release(box)
        assert pool.wait_ready(2, timeout=60)  # both recycled, ready again
    finally:
        assert pool.detach()  # the last user closes the pool
    assert all(box.workspace.closed for box in made)
    assert not pool.attach()  # closed for good


def test_an_acquisition_recycles_a_returned_sandbox_rather_than_start_one(
    profile: SandboxProfile,
) -> None:
    # Once the first spare is made, the factory blocks: starting a sandbox is then
    # impossible until the end, so the only way to the second episode is the first's
    # sandbox, recycled (by the background or the acquisition itself) rather than replaced.
    made: list[WarmSandbox] = []
    go = threading.Event()

    def factory() -> WarmSandbox:
        if made:
            go.wait(timeout=120)
        box = WarmSandbox(profile, LIMITS, hidden_paths=[PACKAGE])
        made.append(box)
        return box

    pool = SandboxPool(factory, spares=1, cpu_hard=5)
    assert pool.attach()
    try:
        assert pool.wait_ready(1, timeout=60)
        first = pool.acquire()
        pool.release(first)
        assert pool.acquire() is first
        assert pool.stats.cold == 0 and pool.stats.recycled == 1 and len(made) == 1
        pool.release(first)
    finally:
        go.set()
        assert pool.detach()
    assert all(box.workspace.closed for box in made)


def test_a_server_with_descriptors_past_1023_gets_a_working_sandbox(
    profile: SandboxProfile,
) -> None:
    """A busy server's socketpair numbers pass 1023: the zygote still serves (select()
    refuses such numbers) and no worker inherits its control socket."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE's hard limit {hard} is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < 1100:
            filler.append(os.open(os.devnull, os.O_RDONLY))
        box = WarmSandbox(profile, LIMITS, hidden_paths=[PACKAGE])
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        for _ in range(2):  # the zygote answers its second request too
            worker = box.worker(cpu_hard=5)
            outcome = worker.execute("import os\nprint(len(os.listdir('/proc/self/fd')))", "<fds>")
            assert outcome.exit_code == 0, outcome.stderr
            # stdin/out/err, the request and reply pipes, and listdir's own descriptor.
            assert int(outcome.stdout) == 6
            box.finish(worker, next_cpu_hard=5)
    finally:
        box.close()
