"""``CodingEnv``: write a Python function; hidden tests run in a sandbox grade it.

Each episode draws a :class:`~corral.envs.coding.tasks.Problem` (by ``seed``, by name
with the ``task`` reset option, or as task ``index`` of a ``split``). Each action is
Python source code; it runs in a sandboxed process (see :mod:`corral.envs.coding`), then
the task's hidden cases call the function it defined, in the same sandbox. The reward is
the fraction of cases that pass; the episode *terminates* when all pass and is
*truncated* after ``max_steps`` actions.

Reset options: ``task`` (a task name), ``split`` with ``index`` (a task of the task
API), ``persistent`` (bool: one interpreter for the whole episode, so variables survive
between actions), ``max_steps`` (int >= 1) and ``episode_id`` (str). Bad options raise
:class:`~corral.errors.InvalidArgument`.

Tasks: the problems form the splits ``train`` and ``test`` (each problem says which),
in their order; the task API publishes them as :class:`~corral.envs.coding.tasks.CodingTask`
(the statement and the number of hidden tests, never the tests themselves).

Warm sandboxes: where the machine allows it (the namespace modes, corral running as
root), episodes run in warm sandboxes from a pool shared by the process's coding
environments of one configuration (:mod:`corral.sandbox.pool`): ``reset`` takes one that
is ready, with a worker forked ahead of time, and the previous episode's is recycled in
the background (every process killed, its directory emptied, its uid's kernel objects
removed) or retired. Each action runs in a fresh worker forked in the sandbox (in the
persistent mode, one per episode), and everything of the agent is killed when it ends,
as with a sandbox per action. ``warm=0`` starts a sandbox per action instead (what every
other machine does).

Snapshots: an episode that does not keep one interpreter (``persistent`` off) can be
snapshotted between actions (:class:`CodingSnapshot`): its state, its last observation
and its working directory's files (:mod:`corral.envs.coding.files`, at most
``snapshot_bytes`` of them), restored into a fresh sandbox's directory. A persistent
episode's interpreter holds variables no snapshot can carry: it refuses with
``SNAPSHOT_UNSUPPORTED`` (a pool replays such an episode instead).

One module for the environment, its wire models and its episode's life (reset, step,
snapshot, restore, the warm or cold sandbox under each): they share the episode record
and its lock, and the models document the observations the methods build.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.contract import Action, Environment, Observation, Snapshot, State, WireModel
from corral.contract.options import parse_reset_options
from corral.contract.tasks import resolve_task, task_ref
from corral.envs.coding import files
from corral.envs.coding.files import WorkspaceEntry
from corral.envs.coding.tasks import SPLITS, TASKS, CodingTask, Problem, matches
from corral.errors import BadSnapshot, InvalidArgument, SnapshotUnsupported
from corral.sandbox import (
    DEFAULT_UID_RANGE,
    ExecOutcome,
    KilledReason,
    SandboxLimits,
    SandboxMode,
    SandboxProcess,
    SandboxProfile,
    TestsOutcome,
    Workspace,
    resolve_profile,
)
from corral.sandbox.channel import WorkerChannel
from corral.sandbox.command import keeps_capabilities
from corral.sandbox.forkserver import ForkedWorker, WarmSandbox
from corral.sandbox.pool import SandboxPool, shared_pool
from corral.sandbox.probe import modes_in_use

MAX_CODE_CHARS = 100_000
"""Largest accepted action, in characters."""
DEFAULT_MAX_STEPS = 8
MAX_STEPS_LIMIT = 1000
DEFAULT_WARM = 2
"""Spare warm sandboxes kept ready by default (see ``CodingEnv(warm=...)``)."""
DEFAULT_SNAPSHOT_BYTES = 8 * 1024 * 1024
"""The most a snapshot's workspace files hold together by default: in base64 (the
snapshot's JSON form) it stays under the server's default frame limit of 16 MiB."""
_PACKAGE_DIR = str(Path(__file__).resolve().parents[2])
_OPTIONS_HELP = (
    f"task (a task name), split (train or test) with index (int >= 0), persistent (bool), "
    f"max_steps (int 1..{MAX_STEPS_LIMIT}), episode_id (str)"
)


class CodeAction(Action):
    """Python source code to run in the episode's sandbox."""

    code: str = Field(
        max_length=MAX_CODE_CHARS,
        description=(
            "Python source, run as a module in the sandbox (standard library only). Define "
            "the task's function; print() output comes back in stdout."
        ),
        examples=["def fizzbuzz(n):\n    return str(n)\n"],
    )


class CaseResult(WireModel):
    """The outcome of one hidden test case (its arguments stay hidden).

    Attributes:
        index: position of the case in the task's hidden list.
        passed: the function returned the expected value.
        error: why it did not pass: ``"wrong answer"``, ``"raised <Exception>"``, the
            function being missing, or ``"not run: ..."`` when the sandbox was killed first.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    passed: bool
    error: str | None = None


class CodeObservation(Observation):
    """What the agent sees after ``reset`` (the task) or an action (its results).

    Attributes:
        task: the task's name.
        prompt: the task statement (on reset; empty after actions).
        stdout / stderr: the action's output, decoded as UTF-8, each capped at the
            sandbox's ``max_output_bytes``. Output printed by the hidden tests is dropped.
        stdout_truncated / stderr_truncated: the stream went over the cap.
        exit_code: 0 when the code ran to the end, 1 after an uncaught exception, the
            ``SystemExit`` code; None when the process was killed or ended first.
        error: a one-line account of what went wrong (exception, kill, crash), or None.
        timed_out: a time limit (wall clock or CPU) was hit.
        killed_reason: why the sandboxed process ended early: ``wall_clock``,
            ``cpu_time``, ``memory`` (the address-space limit was hit, MemoryError),
            ``output_limit``, ``disk`` (the working directory reached ``max_disk_bytes``;
            it is emptied), ``signal`` (another signal, e.g. a crash), ``exited`` (the
            code ended the process, e.g. ``os._exit``), ``protocol`` (the code tampered
            with the worker's reply channel) or ``closed`` (the environment was closed).
        killed_phase: ``"code"`` (while running the action) or ``"tests"``.
        tests_passed / tests_total: hidden cases passed, out of how many.
        test_results: one :class:`CaseResult` per hidden case.
        worker_restarted: persistent mode only: the interpreter died earlier, so this
            action ran in a fresh one and earlier variables are gone.
        wall_time: seconds the action's code ran.
        cpu_time: CPU seconds the action's code used in the worker (None if killed).
    """

    task: str = ""
    prompt: str = ""
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: int | None = None
    error: str | None = None
    timed_out: bool = False
    killed_reason: KilledReason | None = None
    killed_phase: Literal["code", "tests"] | None = None
    tests_passed: int = 0
    tests_total: int = 0
    test_results: list[CaseResult] = Field(default_factory=list)
    worker_restarted: bool = False
    wall_time: float = 0.0
    cpu_time: float | None = None


class CodeState(State):
    """The episode as a trainer may inspect it.

    Attributes:
        task: the current task's name (None before the first reset).
        seed: the seed of the last reset.
        persistent: the episode keeps one interpreter across actions.
        max_steps: actions allowed before truncation.
        sandbox_mode: the isolation mode in use (see :class:`SandboxMode`).
        sandbox_strategy: how that mode is realised on this machine.
        sandbox_uid: the unprivileged uid the sandbox runs as (None when corral is not
            root and the sandbox runs as corral's own user).
        workdir: the working directory as the agent's code sees it.
        tests_passed / tests_total: the last action's result.
        last_reward / best_reward: the last and the best reward of the episode.
        solved: some action passed every hidden case.
        done: the episode is over.
        worker_alive: the persistent interpreter is running (checked when asked).
        worker_restarts: how often the persistent interpreter had to be restarted.
    """

    task: str | None = None
    seed: int | None = None
    persistent: bool = False
    max_steps: int = DEFAULT_MAX_STEPS
    sandbox_mode: SandboxMode | None = None
    sandbox_strategy: str | None = None
    sandbox_uid: int | None = None
    workdir: str | None = None
    tests_passed: int = 0
    tests_total: int = 0
    last_reward: float | None = None
    best_reward: float = 0.0
    solved: bool = False
    done: bool = False
    worker_alive: bool = False
    worker_restarts: int = 0


class CodingSnapshot(Snapshot):
    """An episode between actions: its state, last observation and working directory.

    Attributes:
        state: the episode's state (None: the environment was never reset); its sandbox
            fields describe the sandbox it was taken in and are replaced on restore.
        files: the working directory's entries, parents first
            (:class:`~corral.envs.coding.files.WorkspaceEntry`).
        last: the observation the last ``reset`` or ``step`` returned.
    """

    state: CodeState | None = None
    files: list[WorkspaceEntry] = Field(default_factory=list)
    last: CodeObservation | None = None


class _ResetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str | None = None
    split: str | None = None
    index: Annotated[int, Field(strict=True)] | None = None
    persistent: Annotated[bool, Field(strict=True)] | None = None
    max_steps: Annotated[int, Field(strict=True, ge=1, le=MAX_STEPS_LIMIT)] | None = None
    episode_id: str | None = None


def _parse_options(values: dict[str, Any]) -> _ResetOptions:
    return parse_reset_options(_ResetOptions, values, env="coding", accepted=_OPTIONS_HELP)


@dataclasses.dataclass
class _Episode:
    task: Problem
    persistent: bool
    workspace: Workspace
    state: CodeState
    sandbox: WarmSandbox | None = None
    """The episode's warm sandbox (None: a cold sandbox per worker)."""
    worker: WorkerChannel | None = None
    worker_lost: bool = False
    last: CodeObservation | None = None
    """What the last reset or step returned (a snapshot's)."""


class CodingEnv(Environment[CodeAction, CodeObservation, CodeState]):
    """Write the task's Python function; reward = fraction of hidden tests passed.

    Args:
        sandbox: ``"auto"`` (the strongest mode that works here) or a
            :class:`SandboxMode` to insist on.
        limits: resource limits of the sandboxed processes.
        python: the interpreter to run in the sandbox (default: the one corral runs on,
            without its virtualenv); it runs with ``-I -S``, so only its standard library
            is importable.
        tasks: the tasks to draw from (default: :data:`~corral.envs.coding.tasks.TASKS`).
        max_steps: default for the ``max_steps`` reset option.
        persistent: default for the ``persistent`` reset option.
        workdir_root: where episode directories are created (default: the system temp
            dir). Their size is bounded by ``limits.max_disk_bytes`` (a tmpfs of that size
            in the namespace modes as root, a polled bound otherwise).
        extra_ro_paths: more host paths to show read-only in the sandbox (for an
            interpreter installed outside its prefix).
        hidden_paths: host paths never to show in the sandbox even when a parent is
            shown (default: corral's own package, which holds the expected answers).
        uid_range: uids leased to sandboxes when corral runs as root.
        warm: spare warm sandboxes kept ready for new episodes (shared by the process's
            coding environments of the same configuration), where the machine allows
            warm sandboxes (:func:`~corral.sandbox.command.keeps_capabilities`); 0: a
            cold sandbox per action, as on other machines.
        snapshot_bytes: the most a snapshot's workspace files may hold together (never
            above ``limits.max_disk_bytes``); a larger workspace refuses the snapshot
            with ``SNAPSHOT_TOO_LARGE``.

    Raises:
        SandboxUnavailable: no (requested) sandbox mode works on this machine.
        ValueError: ``tasks`` is empty or has duplicate names, or a default is out of range.
    """

    name = "coding"
    description = (
        "Write a Python function (fizzbuzz, is_prime, ...). Each action is Python code run "
        "in a sandbox (rlimits, no network, read-only filesystem); reward = fraction of the "
        "task's hidden tests that pass. Reset options: task, persistent, max_steps."
    )
    contract_version = "1.0.0"
    task_type = CodingTask

    def __init__(
        self,
        *,
        sandbox: SandboxMode | Literal["auto"] = "auto",
        limits: SandboxLimits | None = None,
        python: str | None = None,
        tasks: Sequence[Problem] | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        persistent: bool = False,
        workdir_root: str | None = None,
        extra_ro_paths: Sequence[str] = (),
        hidden_paths: Sequence[str] | None = None,
        uid_range: range = DEFAULT_UID_RANGE,
        warm: int = DEFAULT_WARM,
        snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES,
    ) -> None:
        chosen = tuple(TASKS if tasks is None else tasks)
        names = [t.name for t in chosen]
        if not chosen or len(set(names)) != len(names):
            raise ValueError(f"tasks must be a non-empty list with unique names, got {names}")
        if not 1 <= max_steps <= MAX_STEPS_LIMIT:
            raise ValueError(f"max_steps must be in 1..{MAX_STEPS_LIMIT}, got {max_steps}")
        if warm < 0:
            raise ValueError(f"warm must be >= 0, got {warm}")
        if snapshot_bytes < 0:
            raise ValueError(f"snapshot_bytes must be >= 0, got {snapshot_bytes}")
        self._tasks = {t.name: t for t in chosen}
        self._splits = {name: [t for t in chosen if t.split == name] for name in SPLITS}
        self._limits = limits or SandboxLimits()
        self._snapshot_bytes = min(snapshot_bytes, self._limits.max_disk_bytes)
        # The tmpfs's inode bound (one per 4 KiB of the disk limit, at least 1024).
        self._snapshot_entries = max(1024, self._limits.max_disk_bytes // 4096)
        self._max_steps = max_steps
        self._persistent = persistent
        self._workdir_root = workdir_root
        self._extra_ro_paths = tuple(extra_ro_paths)
        self._hidden_paths = tuple(hidden_paths) if hidden_paths is not None else (_PACKAGE_DIR,)
        self._profile: SandboxProfile = resolve_profile(sandbox, python, uid_range)
        self._lock = threading.RLock()
        self._episode: _Episode | None = None
        self._closed = False
        self._idle_state = CodeState(
            sandbox_mode=self._profile.mode, sandbox_strategy=self._profile.strategy
        )
        self._pool: SandboxPool | None = None
        if warm and keeps_capabilities(self._profile):
            self._pool = self._shared_pool(warm)

    def _shared_pool(self, spares: int) -> SandboxPool:
        profile, limits = self._profile, self._limits
        hidden, root, extra = self._hidden_paths, self._workdir_root, self._extra_ro_paths
        key = (profile, limits, hidden, root, extra, spares)
        # A worker forked ahead of its episode gets the largest lifetime CPU any episode
        # may need; the episode lowers it at its first request.
        ceiling = limits.cpu_seconds * 2 * MAX_STEPS_LIMIT + 2
        return shared_pool(
            key, lambda: WarmSandbox(profile, limits, hidden, root, extra), spares, ceiling
        )

    @property
    def sandbox_pool(self) -> SandboxPool | None:
        """The pool of warm sandboxes this environment's episodes come from (None: a cold
        sandbox per action; see the class docstring)."""
        return self._pool

    @classmethod
    def preflight(cls) -> dict[str, str]:
        """The sandbox mode a server of this environment runs: a namespace mode, or
        ``rlimits`` only where allowed (:func:`~corral.sandbox.probe.resolve_profile`);
        otherwise the server refuses to start, with the reason of each mode.

        A mode already resolved in this process (a factory's explicit ``sandbox=``) is
        the one reported.
        """
        used = modes_in_use()
        if used:
            # The weakest one, should two be in use: the one a user must know about.
            weakest = max(used, key=list(SandboxMode).index)
            return {"sandbox": str(weakest), "sandbox_strategy": used[weakest]}
        profile = resolve_profile("auto")
        return {"sandbox": str(profile.mode), "sandbox_strategy": profile.strategy}

    @property
    def sandbox_profile(self) -> SandboxProfile:
        """How this environment's sandboxes are started (mode, strategy, interpreter)."""
        return self._profile

    @property
    def host_workdir(self) -> Path | None:
        """The current episode's working directory on the host (None between episodes)."""
        episode = self._episode
        return episode.workspace.host_workdir if episode else None

    # -- Environment API --------------------------------------------------------------

    def reset(self, seed: int | None = None, **options: Any) -> CodeObservation:
        """Start an episode: pick the task, create its workspace (and interpreter).

        Raises:
            InvalidArgument: an unknown option, a bad value, or an unknown task name.
            SandboxError: the persistent interpreter could not be started.
            RuntimeError: the environment was closed.
        """
        opts = _parse_options(options)
        with self._lock:
            self._check_open()
            task = self._choose(seed, opts)
            self._end_episode()
            persistent = self._persistent if opts.persistent is None else opts.persistent
            sandbox, workspace = self._take_workspace()
            state = CodeState(
                episode_id=opts.episode_id or str(uuid.uuid4()),
                task=task.name,
                seed=seed,
                persistent=persistent,
                max_steps=opts.max_steps or self._max_steps,
                sandbox_mode=self._profile.mode,
                sandbox_strategy=self._profile.strategy,
                sandbox_uid=workspace.uid,
                workdir=workspace.inside_workdir,
                tests_total=len(task.cases),
            )
            episode = _Episode(
                task=task, persistent=persistent, workspace=workspace, state=state, sandbox=sandbox
            )
            try:
                if persistent:
                    episode.worker = self._spawn(episode)
                    state.worker_alive = True
            except BaseException:
                self._release(episode)
                raise
            self._episode = episode
            episode.last = self._first_observation(episode)
            return episode.last

    def step(self, action: CodeAction) -> CodeObservation:
        """Run the action's code, then the hidden tests; score the result.

        Raises:
            RuntimeError: before ``reset``, after the episode ended, or after ``close``.
            SandboxError: a sandbox could not be started (a machine problem).
        """
        with self._lock:
            self._check_open()
            episode = self._episode
            if episode is None:
                raise RuntimeError("call reset() before step()")
            state = episode.state
            if state.done:
                raise RuntimeError("the episode is over; call reset() to start a new one")
            restarted = False
            if episode.worker is None:
                restarted = episode.persistent and episode.worker_lost
                episode.worker = self._spawn(episode)
            elif not episode.worker.alive():
                self._end_worker(episode, episode.worker, ahead=False)
                restarted = True
                episode.worker = self._spawn(episode)
            if restarted:
                state.worker_restarts += 1
                episode.worker_lost = False
            worker = episode.worker
            state.step_count += 1
            task = episode.task
            tests: TestsOutcome | None = None
            try:
                outcome = worker.execute(action.code, f"<step {state.step_count}>")
                if outcome.killed_reason is None:
                    tests = worker.run_tests(task.entry_point, [c.args for c in task.cases])
            finally:
                if not episode.persistent or not worker.alive():
                    episode.worker = None
                    episode.worker_lost = episode.persistent
                    self._end_worker(episode, worker, ahead=not state.done)
            state.worker_alive = episode.worker is not None
            episode.last = self._observe(episode, worker, outcome, tests, restarted)
            return episode.last

    def state(self) -> CodeState:
        """A copy of the current state (``worker_alive`` is checked now, not at the last step)."""
        with self._lock:
            episode = self._episode
            if episode is None:
                return self._idle_state.model_copy(deep=True)
            state = episode.state.model_copy(deep=True)
            state.worker_alive = episode.worker is not None and episode.worker.alive()
            return state

    def snapshot(self) -> CodingSnapshot:
        """The episode between actions: state, last observation, working directory.

        Raises:
            SnapshotUnsupported: the episode keeps one interpreter (``persistent``), or
                its directory holds what a snapshot cannot carry (a FIFO, a socket).
            SnapshotTooLarge: its files hold more than ``snapshot_bytes``.
            RuntimeError: the environment was closed.
        """
        with self._lock:
            self._check_open()
            episode = self._episode
            if episode is None:
                return CodingSnapshot()
            if episode.persistent:
                raise SnapshotUnsupported(
                    "a persistent coding episode keeps its variables in a live interpreter, "
                    "which no snapshot can carry: replay its actions instead, or reset with "
                    "persistent=False",
                    details={"persistent": True},
                )
            state = episode.state.model_copy(deep=True)
            state.worker_alive = False
            entries = files.capture(
                episode.workspace.host_workdir, self._snapshot_bytes, self._snapshot_entries
            )
            return CodingSnapshot(state=state, files=entries, last=episode.last)

    def restore(self, snapshot: CodingSnapshot) -> CodeObservation:
        """Continue the episode ``snapshot`` captured, in a fresh sandbox whose working
        directory holds its files and nothing else; returns its last observation.

        Raises:
            BadSnapshot: its task is not one of this environment's, its state is out of
                this environment's bounds, or its files are malformed, too many or too
                large (nothing is written then).
            SandboxError: no sandbox could be had.
            RuntimeError: the environment was closed.
        """
        with self._lock:
            self._check_open()
            saved = snapshot.state
            if saved is None:
                self._end_episode()
                return CodeObservation()
            task = self._restorable(saved)
            files.check(snapshot.files, self._snapshot_bytes, self._snapshot_entries)
            self._end_episode()
            sandbox, workspace = self._take_workspace()
            state = saved.model_copy(
                deep=True,
                update={
                    "sandbox_mode": self._profile.mode,
                    "sandbox_strategy": self._profile.strategy,
                    "sandbox_uid": workspace.uid,
                    "workdir": workspace.inside_workdir,
                    "worker_alive": False,
                },
            )
            episode = _Episode(
                task=task, persistent=False, workspace=workspace, state=state, sandbox=sandbox
            )
            try:
                files.write(workspace.host_workdir, snapshot.files, workspace.uid)
            except BaseException:
                self._release(episode)
                raise
            self._episode = episode
            last = snapshot.last
            episode.last = last.model_copy(deep=True) if last else self._first_observation(episode)
            return episode.last

    def close(self) -> None:
        """Kill the sandbox's processes (even mid-step, from another thread) and end the
        episode: its workspace is deleted, or a warm sandbox recycled for another
        environment (the last environment of a pool closes every sandbox of it)."""
        self._closed = True
        episode = self._episode
        worker = episode.worker if episode is not None else None
        if worker is not None:
            worker.kill("closed")
        with self._lock:
            self._end_episode()
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.detach()

    # -- the tasks face -----------------------------------------------------------------

    def splits(self) -> list[str]:
        """``["train", "test"]``."""
        return list(SPLITS)

    def num_tasks(self, split: str) -> int:
        """How many problems ``split`` holds."""
        return len(self._splits[split])

    def task(self, split: str, index: int) -> CodingTask:
        """Problem ``index`` of ``split``, as published (no hidden tests)."""
        return CodingTask.of(self._splits[split][index], index)

    # -- internals --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the environment is closed")

    def _choose(self, seed: int | None, opts: _ResetOptions) -> Problem:
        name = opts.task
        ref = task_ref(opts.split, opts.index)
        if ref is not None:
            if name is not None:
                raise InvalidArgument("reset options task and split/index both choose the task")
            resolve_task(self, ref.split, ref.index)
            return self._splits[ref.split][ref.index]
        if name is not None:
            task = self._tasks.get(name)
            if task is None:
                raise InvalidArgument(
                    f"unknown task {name!r}; choose one of {sorted(self._tasks)}",
                    details={"task": name, "tasks": sorted(self._tasks)},
                )
            return task
        return random.Random(seed).choice(list(self._tasks.values()))

    def _take_workspace(self) -> tuple[WarmSandbox | None, Workspace]:
        """A new episode's sandbox: a warm one from the pool, or a workspace for cold ones."""
        sandbox = self._pool.acquire() if self._pool is not None else None
        if sandbox is not None:
            return sandbox, sandbox.workspace
        workspace = Workspace(
            self._profile,
            self._hidden_paths,
            self._workdir_root,
            max_disk_bytes=self._limits.max_disk_bytes,
        )
        return None, workspace

    def _restorable(self, saved: CodeState) -> Problem:
        """The task of a snapshot's state, if this environment can continue it.

        Raises:
            BadSnapshot: why not.
        """
        task = self._tasks.get(saved.task or "")
        if task is None:
            raise BadSnapshot(
                f"the snapshot's task {saved.task!r} is not one of this environment's "
                f"({len(self._tasks)} tasks)",
                details={"task": saved.task},
            )
        if saved.persistent:
            raise BadSnapshot("a persistent coding episode is never snapshotted")
        if saved.tests_total != len(task.cases):
            raise BadSnapshot(
                f"the snapshot's task {task.name!r} has {saved.tests_total} hidden tests; "
                f"this environment's has {len(task.cases)}: another version of the task"
            )
        if not 1 <= saved.max_steps <= MAX_STEPS_LIMIT or saved.step_count > saved.max_steps:
            raise BadSnapshot(
                f"the snapshot's episode has {saved.step_count} of {saved.max_steps} steps "
                f"taken; max_steps must be in 1..{MAX_STEPS_LIMIT} and not below them"
            )
        return task

    def _first_observation(self, episode: _Episode) -> CodeObservation:
        task = episode.task
        return CodeObservation(
            task=task.name,
            prompt=task.prompt(episode.persistent),
            tests_total=len(task.cases),
            metadata=self._metadata(episode) | {"limits": self._limits.model_dump()},
        )

    def _cpu_hard(self, episode: _Episode) -> int:
        # The hard CPU limit is a lifetime cap: one budget for each action and each test
        # run the process may serve, plus slack for the interpreter itself.
        runs = 2 * episode.state.max_steps if episode.persistent else 2
        return self._limits.cpu_seconds * runs + 2

    def _spawn(self, episode: _Episode) -> WorkerChannel:
        if episode.sandbox is not None:
            return episode.sandbox.worker(self._cpu_hard(episode))
        return SandboxProcess(
            self._profile,
            episode.workspace,
            self._limits,
            cpu_hard=self._cpu_hard(episode),
            extra_ro_paths=self._extra_ro_paths,
        )

    def _end_worker(self, episode: _Episode, worker: WorkerChannel, ahead: bool) -> None:
        """End ``worker`` and every process it left; with ``ahead``, a warm sandbox forks
        the episode's next worker at once (ready before the next action asks)."""
        if episode.sandbox is not None and isinstance(worker, ForkedWorker):
            episode.sandbox.finish(worker, self._cpu_hard(episode) if ahead else None)
        else:
            worker.close()

    def _end_episode(self) -> None:
        episode, self._episode = self._episode, None
        if episode is None:
            return
        try:
            if episode.worker is not None:
                self._end_worker(episode, episode.worker, ahead=False)
        finally:
            self._release(episode)

    def _release(self, episode: _Episode) -> None:
        """Give the episode's sandbox back to the pool (recycled), or delete its workspace."""
        if episode.sandbox is not None and self._pool is not None:
            self._pool.release(episode.sandbox)
        elif episode.sandbox is not None:
            episode.sandbox.close()
        else:
            episode.workspace.close()

    def _metadata(self, episode: _Episode) -> dict[str, Any]:
        quota = episode.workspace.quota
        return {
            "sandbox_mode": str(self._profile.mode),
            "sandbox_strategy": self._profile.strategy,
            "persistent": episode.persistent,
            "disk_quota": quota.kind if quota is not None else None,
        }

    def _observe(
        self,
        episode: _Episode,
        worker: WorkerChannel,
        outcome: ExecOutcome,
        tests: TestsOutcome | None,
        restarted: bool,
    ) -> CodeObservation:
        task, state = episode.task, episode.state
        killed_reason: KilledReason | None = outcome.killed_reason
        killed_phase: Literal["code", "tests"] | None = "code" if killed_reason else None
        error = outcome.error
        if killed_reason is None and tests is not None and tests.killed_reason is not None:
            killed_reason, killed_phase = tests.killed_reason, "tests"
            error = "while running the hidden tests: " + worker.explain(
                tests.killed_reason, phase="tests"
            )
        not_run = "not run: " + (
            worker.explain(killed_reason, phase=killed_phase or "code")
            if killed_reason
            else "the tests did not run"
        )
        reports = tests.cases if tests is not None else []
        results = []
        for index, case in enumerate(task.cases):
            if index >= len(reports):
                results.append(CaseResult(index=index, passed=False, error=not_run))
                continue
            report = reports[index]
            passed = report.ok and matches(case.expected, report.value)
            reason = None if passed else ("wrong answer" if report.ok else report.error)
            results.append(CaseResult(index=index, passed=passed, error=reason))
        passed_count = sum(r.passed for r in results)
        reward = passed_count / len(results)
        solved = passed_count == len(results)
        truncated = not solved and state.step_count >= state.max_steps
        state.tests_passed = passed_count
        state.last_reward = reward
        state.best_reward = max(state.best_reward, reward)
        state.solved = state.solved or solved
        state.done = solved or truncated
        return CodeObservation(
            task=task.name,
            stdout=outcome.stdout.decode("utf-8", "replace"),
            stderr=outcome.stderr.decode("utf-8", "replace"),
            stdout_truncated=outcome.stdout_truncated,
            stderr_truncated=outcome.stderr_truncated,
            exit_code=outcome.exit_code,
            error=error,
            timed_out=killed_reason in ("wall_clock", "cpu_time"),
            killed_reason=killed_reason,
            killed_phase=killed_phase,
            tests_passed=passed_count,
            tests_total=len(results),
            test_results=results,
            worker_restarted=restarted,
            wall_time=round(outcome.wall_time, 6),
            cpu_time=outcome.cpu_time,
            reward=reward,
            done=solved or truncated,
            truncated=truncated,
            metadata=self._metadata(episode),
        )
