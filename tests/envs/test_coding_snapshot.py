"""The coding environment's snapshots: its state and its working directory's files,
restored into a fresh sandbox that holds those files and nothing of any other episode.

Runs in every sandbox mode this machine supports (warm and cold where warm sandboxes
work); a mode that does not work here is skipped with the probe's reason.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.envs.test_coding import FAST, SOLUTIONS, make_env, run, sandbox_options
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.envs.coding import (
    CodeAction,
    CodeObservation,
    CodingEnv,
    CodingSnapshot,
    SandboxMode,
    WorkspaceEntry,
)
from corral.envs.coding.files import capture
from corral.errors import BadSnapshot, SnapshotTooLarge, SnapshotUnsupported

__all__ = ["make_env"]  # a fixture, used by name

WRITE = """
import os
open("notes.txt", "w").write("first\\n")
os.makedirs("data/deeper")
open("data/deeper/blob.bin", "wb").write(bytes(range(256)) * 3)
open("run.sh", "w").write("#!/bin/sh\\necho hi\\n")
os.chmod("run.sh", 0o750)
os.mkdir("empty")
os.chmod("data", 0o711)
os.symlink("notes.txt", "link")
os.utime("notes.txt", ns=(1_000_000_000_123, 1_000_000_000_123))
"""

LOOK = """
import hashlib, json, os
seen = {}
for top, dirs, names in os.walk("."):
    dirs.sort()
    for name in sorted(names) + dirs:
        path = os.path.join(top, name)
        info = os.lstat(path)
        digest = None
        if os.path.isfile(path) and not os.path.islink(path):
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        seen[path] = [oct(info.st_mode), info.st_uid, digest]
print(json.dumps(seen, sort_keys=True))
open("notes.txt", "a").write("again\\n")
"""

MODES = [
    pytest.param(SandboxMode.BWRAP, 1, id="bwrap-warm"),
    pytest.param(SandboxMode.BWRAP, 0, id="bwrap-cold"),
    pytest.param(SandboxMode.UNSHARE, 0, id="unshare"),
    pytest.param(SandboxMode.RLIMITS, 0, id="rlimits"),
]


def through_json(snapshot: CodingSnapshot) -> CodingSnapshot:
    """The snapshot as a restore receives it: its JSON form, validated by the model."""
    return CodingSnapshot.model_validate_json(snapshot.model_dump_json())


def timeless(obs: CodeObservation) -> dict[str, Any]:
    """An observation without what differs between two runs of the same code."""
    return obs.model_dump(exclude={"wall_time", "cpu_time"})


def files_of(env: CodingEnv) -> list[WorkspaceEntry]:
    assert env.host_workdir is not None
    return capture(env.host_workdir, 1 << 30, 1 << 20)


@pytest.mark.parametrize(("mode", "warm"), MODES)
def test_a_restored_episode_has_the_same_files_and_goes_on_the_same(
    make_env: Callable[..., CodingEnv], mode: SandboxMode, warm: int
) -> None:
    source = make_env(mode, warm=warm)
    source.reset(task="fizzbuzz", seed=3)
    written = run(source, WRITE)
    assert written.exit_code == 0, written.stderr
    snapshot = source.snapshot()
    assert {e.path for e in snapshot.files} == {
        "notes.txt",
        "data",
        "data/deeper",
        "data/deeper/blob.bin",
        "run.sh",
        "empty",
        "link",
    }

    copy = make_env(mode, warm=warm)
    restored = copy.restore(through_json(snapshot))
    assert restored == written  # the observation of the restored state: the last one
    assert copy.host_workdir != source.host_workdir
    assert files_of(copy) == files_of(source)  # bytes, modes, times, links
    state = copy.state()
    owner = state.sandbox_uid if state.sandbox_uid is not None else os.getuid()
    assert {os.lstat(p).st_uid for p in copy.host_workdir.rglob("*")} == {owner}  # type: ignore[union-attr]
    assert state.step_count == 1 and state.task == "fizzbuzz" and state.seed == 3

    # The same actions give the same observations (the files as the code sees them
    # included), and each episode's later writes stay its own.
    for code in (LOOK, SOLUTIONS["fizzbuzz"]):
        mine, theirs = run(source, code), run(copy, code)
        if code is LOOK:  # the owners differ (each sandbox's uid); nothing else may
            assert theirs.exit_code == 0, theirs.stderr
            seen = {
                path: [mode, digest]
                for path, (mode, _, digest) in json.loads(theirs.stdout).items()
            }
            assert seen == {
                path: [mode, digest] for path, (mode, _, digest) in json.loads(mine.stdout).items()
            }
            assert {uid for _, uid, _ in json.loads(theirs.stdout).values()} == {owner}
            assert (
                seen["./data/deeper/blob.bin"][1] is not None and seen["./run.sh"][0] == "0o100750"
            )
            mine, theirs = (o.model_copy(update={"stdout": ""}) for o in (mine, theirs))
        assert timeless(theirs) == timeless(mine)
    assert theirs.done and theirs.reward == 1.0
    assert (copy.host_workdir / "notes.txt").read_text() == "first\nagain\n"  # type: ignore[operator]
    differs = {"sandbox_uid", "workdir", "worker_alive"}
    assert copy.state().model_dump(exclude=differs) == source.state().model_dump(exclude=differs)


def test_a_restored_session_sees_none_of_another_episodes_files(
    make_env: Callable[..., CodingEnv],
) -> None:
    """Restored into a recycled warm sandbox, the workspace holds the snapshot's files,
    never those the sandbox's earlier episode left; nor does it share later writes."""
    found = sandbox_options(SandboxMode.BWRAP)
    if isinstance(found, str):
        pytest.skip(f"bwrap unavailable here: {found}")
    env = make_env(SandboxMode.BWRAP, warm=1)
    pool = env.sandbox_pool
    if pool is None:
        pytest.skip("warm sandboxes need the namespace modes as root (corral is not root here)")

    donor = make_env(SandboxMode.BWRAP, warm=0)
    donor.reset(task="fizzbuzz")
    run(donor, "open('mine', 'w').write('from the snapshot')")
    snapshot = through_json(donor.snapshot())

    env.reset(task="fizzbuzz")
    planted = run(env, "import os\nopen('planted', 'w').write('x')\nos.mkdir('planted-dir')")
    assert planted.exit_code == 0, planted.stderr
    used = {env.host_workdir}
    recycled_into = 0
    for _ in range(8):  # each restore gives the previous sandbox back to be recycled
        assert pool.wait_ready(1, timeout=60)
        env.restore(snapshot)
        recycled_into += env.host_workdir in used
        used.add(env.host_workdir)
        assert sorted(os.listdir(env.host_workdir)) == ["mine"]  # type: ignore[arg-type]
        looked = run(env, "import os\nprint(sorted(os.listdir('.')))")
        assert looked.stdout == "['mine']\n"
        if recycled_into >= 2:
            break
    assert recycled_into >= 2, "the pool never handed a used sandbox back"
    run(donor, "open('later', 'w').write('after the snapshot')")
    assert sorted(os.listdir(env.host_workdir)) == ["mine"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([{"path": "../escape", "kind": "file"}], "normalised path"),
        ([{"path": "/etc/escape", "kind": "file"}], "normalised path"),
        ([{"path": "a/../b", "kind": "file"}], "normalised path"),
        ([{"path": "./a", "kind": "file"}], "normalised path"),
        ([{"path": "a//b", "kind": "file"}], "normalised path"),
        ([{"path": "a/b", "kind": "file"}], "parent directory"),
        (
            [
                {"path": "out", "kind": "symlink", "target": "{outside}"},
                {"path": "out/f", "kind": "file"},
            ],
            "parent directory",
        ),
        ([{"path": "a", "kind": "file"}, {"path": "a", "kind": "file"}], "given twice"),
        ([{"path": "a", "kind": "symlink"}], "link without one"),
        ([{"path": "a", "kind": "dir", "data": "eA=="}], "no file"),
        ([{"path": "big", "kind": "file", "data": "A" * 4000}], "at most"),
    ],
)
def test_a_forged_workspace_is_refused_before_anything_is_written(
    make_env: Callable[..., CodingEnv], tmp_path: Path, entries: list[dict[str, Any]], why: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    source = make_env(snapshot_bytes=2048)
    source.reset(task="fizzbuzz")
    good = json.loads(source.snapshot().model_dump_json())
    good["files"] = json.loads(json.dumps(entries).replace("{outside}", str(outside)))
    forged = CodingSnapshot.model_validate(good)
    copy = make_env(snapshot_bytes=2048)
    copy.reset(task="is_prime")
    with pytest.raises(BadSnapshot, match=why):
        copy.restore(forged)
    assert list(outside.iterdir()) == []
    assert copy.state().task == "is_prime"  # the episode it had goes on
    assert run(copy, SOLUTIONS["is_prime"]).reward == 1.0


def test_a_snapshot_another_environment_cannot_continue_is_refused(
    make_env: Callable[..., CodingEnv],
) -> None:
    source = make_env()
    source.reset(task="fizzbuzz")
    good = source.snapshot()
    assert good.state is not None
    for state, why in [
        (good.state.model_copy(update={"task": "nope"}), "not one of this environment's"),
        (good.state.model_copy(update={"tests_total": 99}), "another version of the task"),
        (good.state.model_copy(update={"persistent": True}), "never snapshotted"),
        (good.state.model_copy(update={"max_steps": 0}), "max_steps"),
        (good.state.model_copy(update={"step_count": 9}), "max_steps"),
    ]:
        with pytest.raises(BadSnapshot, match=why):
            make_env().restore(good.model_copy(update={"state": state}))


def test_what_cannot_be_snapshotted_says_why(make_env: Callable[..., CodingEnv]) -> None:
    env = make_env(snapshot_bytes=1024)
    env.reset(task="fizzbuzz", persistent=True)
    with pytest.raises(SnapshotUnsupported, match="persistent"):
        env.snapshot()
    env.reset(task="fizzbuzz")
    run(env, "open('big', 'wb').write(b'x' * 2000)")
    with pytest.raises(SnapshotTooLarge, match="1,024 bytes"):
        env.snapshot()
    env.reset(task="fizzbuzz")
    run(env, "import os\nos.mkfifo('pipe')")
    with pytest.raises(SnapshotUnsupported, match="'pipe' is a FIFO"):
        env.snapshot()


def test_a_workspace_of_too_many_entries_is_refused(tmp_path: Path) -> None:
    for name in "abcde":
        (tmp_path / name).write_text(name)
    assert [e.path for e in capture(tmp_path, 1024, 5)] == list("abcde")
    with pytest.raises(SnapshotTooLarge, match="more than 4 entries"):
        capture(tmp_path, 1024, 4)


def test_a_never_reset_environment_restores_to_one_that_needs_a_reset(
    make_env: Callable[..., CodingEnv],
) -> None:
    snapshot = through_json(make_env().snapshot())
    assert snapshot.state is None and snapshot.files == []
    copy = make_env()
    assert copy.restore(snapshot) == CodeObservation()
    with pytest.raises(RuntimeError, match="reset"):
        run(copy, "print(1)")
    assert copy.reset(task="fizzbuzz").task == "fizzbuzz"


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_a_served_coding_session_restores_and_forks_with_its_files(
    codec: str, tmp_path: Path
) -> None:
    factory = functools.partial(CodingEnv, limits=FAST, workdir_root=str(tmp_path))
    with running(factory) as srv:
        async with AsyncEnvClient(srv.url, env=CodingEnv, codec=codec) as env:
            await env.reset(task="fizzbuzz")
            await env.step(CodeAction(code="open('notes', 'w').write('kept')"))
            saved = await env.snapshot()
            forks = await env.fork(2)
            try:
                await env.step(CodeAction(code="open('notes', 'w').write('changed')"))
                read = CodeAction(code="print(open('notes').read())")
                for fork in forks:
                    assert (await fork.step(read)).observation.stdout == "kept\n"
                assert (await env.step(read)).observation.stdout == "changed\n"
            finally:
                for fork in forks:
                    await fork.close()
            restored = await env.restore(saved)
            assert restored.observation.stdout == ""  # the observation of the write
            assert (await env.step(read)).observation.stdout == "kept\n"
