"""``evaluate``: a policy over N episodes through an ``EnvPool``, recorded and resumable.

Episode ``k`` (0 <= k < N) is reset with seed ``seed + k`` and, with a split, task
``k % num_tasks(split)`` of it; so a run is the same run however often it is resumed.
``concurrency`` sessions play at once; each round, every running episode's agent picks
an action (concurrently, for async agents such as the LLM's), the actions go out as one
batch per connection, and finished sessions start the next episodes.

The output directory holds ``run.json`` (the settings), ``episodes.jsonl`` (every
attempt of every episode, in the episode format, flushed as each ends) and
``summary.json``. Running again with the same directory **resumes**: finished episodes
are kept, the rest (those interrupted, and failed ones with retries left) are played;
settings that would change the episodes (policy, split, seed, options, max_steps) must
match.

An attempt fails, and is retried up to ``retries`` times, when its session is lost or
times out, the environment raises, or the policy does (``POLICY_ERROR``). An invalid
action is not a failure: it is recorded, the agent is told, and the episode goes on.
``max_steps`` truncates episodes the environment does not end.

The module is one thing, the play loop: starting episodes, a round of actions, and what
follows an error or an end all update the same state (the queue, the running episodes,
the counts), so they stay together; the run directory and the progress bar live in
:mod:`~corral.evaluation.rundir` and :mod:`~corral.evaluation.progress`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console

from corral.auth import bearer_header, resolve_token
from corral.client.dialers import Dialer
from corral.client.pool import AutoresetMode, EnvPool, ServerHandle
from corral.contract import Environment, Observation
from corral.contract.tasks import TaskRef
from corral.episodes import (
    SESSION_ENDING_CODES,
    EnvInfo,
    Episode,
    EpisodeRecorder,
    EpisodeWriter,
    ErrorInfo,
    Header,
    read,
)
from corral.episodes.export import to_dataset, to_parquet
from corral.errors import CorralError, InvalidAction, validation_message
from corral.evaluation.llm import llm_policy
from corral.evaluation.policies import Agent, Policy, PolicyError, load_policy
from corral.evaluation.progress import ProgressBar
from corral.evaluation.report import EvalSummary, Throughput, episode_id, summarize
from corral.evaluation.rundir import (
    EPISODES_FILE,
    SUMMARY_FILE,
    EvalError,
    RunSettings,
    check_settings,
    plan,
    previous_settings,
    recorded,
    save_settings,
    write_run_file,
)
from corral.server.target import TargetError, load_target

POLICY_ERROR = "POLICY_ERROR"
"""The code of an attempt the policy failed (it raised, or gave no action)."""

FAILS_ATTEMPT = SESSION_ENDING_CODES | {
    "ENV_ERROR",
    "BAD_OBSERVATION",
    "INTERNAL_ERROR",
    "REQUEST_TIMEOUT",
    "SESSION_BUSY",
    "EPISODE_ENDED",
    "RESET_REQUIRED",
    POLICY_ERROR,
}
"""Error codes that end an attempt as failed (to be retried)."""


@dataclass
class _Running:
    k: int
    attempt: int
    agent: Agent
    observation: Observation
    steps: int = 0


async def evaluate(
    target: str | Sequence[str] | Callable[[], ServerHandle],
    *,
    out: str | Path,
    policy: str | Policy = "random",
    episodes: int | None = None,
    concurrency: int = 8,
    split: str | None = None,
    seed: int = 0,
    retries: int = 2,
    max_steps: int = 100,
    options: Mapping[str, Any] | None = None,
    env: type[Environment[Any, Any, Any]] | None = None,
    servers: int | None = None,
    llm_url: str | None = None,
    model: str | None = None,
    llm_api_key: str | None = None,
    resume: bool = True,
    progress: bool | None = None,
    console: Console | None = None,
    codec: str = "msgpack",
    token: str | None = None,
    parquet: bool = False,
    dataset: bool = False,
    dialer: Dialer | None = None,
) -> EvalSummary:
    """Evaluate a policy (see the module docstring); returns the run's summary.

    Args:
        target: what :class:`~corral.client.pool.EnvPool` takes: ``"module:Class"``
            (local servers), a URL or URLs, or a callable returning a server handle
            (any provider).
        out: the run's directory.
        policy: ``random``, ``scripted``, ``llm`` (with ``llm_url`` and ``model``),
            ``PATH:NAME``, or a :class:`~corral.evaluation.policies.Policy`.
        episodes: how many (default: the split's task count, else 10).
        concurrency: sessions playing at once.
        split: play this split's tasks.
        seed: episode ``k`` gets seed ``seed + k``.
        retries: extra attempts of a failed episode.
        max_steps: steps after which an episode is truncated.
        options: reset options for every episode.
        env: the environment class (typed models; needed by ``scripted`` with URLs).
        servers: local servers to start for a ``module:Class`` target.
        llm_url / model / llm_api_key: the OpenAI-compatible endpoint of ``llm``.
        resume: continue the run in ``out`` (otherwise an existing run is an error).
        progress: show a progress bar (default: when the console is a terminal).
        console: where the progress bar goes.
        codec / token: the pool's codec and bearer token.
        parquet / dataset: also export ``episodes.parquet`` / ``dataset/`` (needs the
            ``datasets`` extra).
        dialer: what reaches the servers, sockets and HTTP (default: the network's;
            :mod:`corral.testing`'s in-process servers give theirs).

    Raises:
        EvalError: bad settings, a run in ``out`` with other settings, an unknown
            split, a policy that cannot be loaded.
        CorralError: the servers could not be started or reached.
    """
    run = _Evaluation(
        target=target,
        out=Path(out),
        policy=policy,
        episodes=episodes,
        concurrency=concurrency,
        split=split,
        seed=seed,
        retries=retries,
        max_steps=max_steps,
        options=dict(options or {}),
        env=env,
        servers=servers,
        llm=(llm_url, model, llm_api_key),
        resume=resume,
        progress=progress,
        console=console or Console(stderr=True),
        codec=codec,
        token=token,
        dialer=dialer,
    )
    summary = await run.run()
    if parquet:
        to_parquet(read(run.episodes_path, strict=False), run.out / "episodes.parquet")
    if dataset:
        to_dataset(read(run.episodes_path, strict=False)).save_to_disk(str(run.out / "dataset"))
    return summary


class _Evaluation:
    def __init__(
        self,
        *,
        target: str | Sequence[str] | Callable[[], ServerHandle],
        out: Path,
        policy: str | Policy,
        episodes: int | None,
        concurrency: int,
        split: str | None,
        seed: int,
        retries: int,
        max_steps: int,
        options: dict[str, Any],
        env: type[Environment[Any, Any, Any]] | None,
        servers: int | None,
        llm: tuple[str | None, str | None, str | None],
        resume: bool,
        progress: bool | None,
        console: Console,
        codec: str,
        token: str | None,
        dialer: Dialer | None = None,
    ) -> None:
        if (
            concurrency < 1
            or max_steps < 1
            or retries < 0
            or (episodes is not None and episodes < 1)
        ):
            raise EvalError("concurrency, max_steps and episodes must be >= 1, retries >= 0")
        self.target = target
        self.out = out
        self.episodes_path = out / EPISODES_FILE
        self.policy_spec = policy
        self.wanted = episodes
        self.concurrency = concurrency
        self.split = split
        self.seed = seed
        self.retries = retries
        self.max_steps = max_steps
        self.options = options
        self.env = env if env is not None else _env_class(target)
        self.servers = servers
        self.llm = llm
        self.resume = resume
        self.show_progress = console.is_terminal if progress is None else progress
        self.console = console
        self.codec = codec
        self.token = resolve_token(token)
        self.dialer = dialer
        self.queue: deque[tuple[int, int]] = deque()
        self.running: dict[int, _Running] = {}
        self.failures: dict[int, int] = {}
        self.stats = Throughput()
        self.successes = 0
        self.finished = 0

    # -- setting up ----------------------------------------------------------------

    async def run(self) -> EvalSummary:
        previous = previous_settings(self.out, resume=self.resume)
        if previous is not None and self.episodes_path.exists():
            size = self.episodes_path.stat().st_size / 1e6
            self.console.print(f"resuming the run in {self.out} ({size:,.1f} MB of episodes)")
        episodes = recorded(self.episodes_path)  # read once: for the plan, and a finished run
        finished = self._finished_run(previous, episodes)
        if finished is not None:
            return finished
        # A policy that needs no schema is loaded before any server starts: a typo in
        # its name fails at once.
        early = None if self._needs_schema() else self._policy(None, EnvInfo())
        pool: EnvPool[Any, Any, Any] = EnvPool(
            self.concurrency,
            self.target,
            env=self.env,
            servers=self.servers,
            codec=self.codec,
            token=self.token,
            autoreset_mode=AutoresetMode.DISABLED,
            on_error="return",
            progress=False,
            max_in_flight=max(4, self.concurrency),
            dialer=self.dialer,
        )
        async with pool:
            info, tasks = await self._describe(pool.server_urls[0], pool.fleet.dialer)
            planned = self.wanted or (tasks if tasks is not None else 10)
            policy, closer = early or self._policy(pool.action_type, info)
            started = time.perf_counter()
            try:
                settings = self._settle(previous, planned, policy, episodes)
                header: Header | None = Header(
                    env=info,
                    source="eval",
                    url=pool.server_urls[0],
                    meta={"eval": settings.model_dump(), "resumed": previous is not None},
                )
                if self.episodes_path.exists() and not self.queue:
                    header = None  # nothing left to play: leave the file as it is
                started = time.perf_counter()
                try:
                    with EpisodeWriter(
                        self.episodes_path, header, append=True, follow_symlinks=False
                    ) as out:
                        recorder = EpisodeRecorder(out)
                        with self._progress(planned, policy.name, info.name) as bar:
                            await self._play(pool, policy, recorder, tasks, bar)
                except (asyncio.CancelledError, KeyboardInterrupt):
                    self._interrupted(planned)
                    raise
            finally:
                self.stats.duration_s = time.perf_counter() - started
                if closer is not None:
                    await closer()
        summary = summarize(
            read(self.episodes_path, strict=False),
            planned=planned,
            policy=policy.name,
            split=self.split,
            throughput=self.stats,
        )
        write_run_file(self.out, SUMMARY_FILE, summary.model_dump_json(indent=2) + "\n")
        return summary

    def _finished_run(
        self, previous: RunSettings | None, episodes: list[Episode]
    ) -> EvalSummary | None:
        """The summary of a resumed run with nothing left to play, made from its file
        without starting a server (None when there is something to play).

        Raises:
            EvalError: settings that would change the run's episodes (said before any
                server starts).
        """
        if previous is None or (self._llm() and None in self.llm[:2]):
            return None  # no run to resume, or an llm policy the full path refuses
        # Not re-planned: the run's episode count is run.json's unless --episodes asks
        # for another.
        planned = self.wanted or previous.episodes
        policy = self._policy_name()
        check_settings(self.out, self._settings(planned, policy), previous)
        todo = plan(episodes, planned, self.retries)
        if todo.queue:
            return None
        self.console.print(
            f"nothing left to play: {todo.finished:,} of {planned:,} episodes are finished "
            "(the summary is made from the episode file; no server was started)"
        )
        summary = summarize(episodes, planned=planned, policy=policy, split=self.split)
        (self.out / SUMMARY_FILE).write_text(summary.model_dump_json(indent=2) + "\n")
        return summary

    def _interrupted(self, planned: int) -> None:
        """Say what an interrupted run kept (every finished episode, flushed as it
        ended) and that running it again resumes it."""
        playing = len(self.running)
        again = f"; the {playing:,} being played start over when resumed" if playing else ""
        self.console.print(
            f"interrupted: {self.finished:,} of {planned:,} episodes are finished and kept in "
            f"{self.episodes_path}{again}. The same evaluation with the same output "
            "directory resumes the run."
        )

    def _settings(self, planned: int, policy: str) -> RunSettings:
        """This run's settings (``run.json``)."""
        return RunSettings(
            target=self.target if isinstance(self.target, str) else repr(self.target),
            policy=policy,
            episodes=planned,
            split=self.split,
            seed=self.seed,
            max_steps=self.max_steps,
            retries=self.retries,
            concurrency=self.concurrency,
            options=self.options,
        )

    def _settle(
        self,
        previous: RunSettings | None,
        planned: int,
        policy: Policy,
        episodes: list[Episode],
    ) -> RunSettings:
        """This run's settings, checked against the previous run's and saved; the
        episodes still to play queued."""
        settings = self._settings(planned, policy.name)
        save_settings(self.out, settings, previous)
        todo = plan(episodes, planned, self.retries)
        self.queue.extend(todo.queue)
        self.failures = todo.failures
        self.finished, self.successes = todo.finished, todo.successes
        return settings

    async def _describe(self, url: str, dialer: Dialer) -> tuple[EnvInfo, int | None]:
        """The served environment (name, contract, schemas) and the split's task count."""
        headers = bearer_header(self.token) if self.token else {}
        async with dialer.http(base_url=url, headers=headers, timeout=30) as http:
            schema = (await http.get("/schema")).json()
            metadata = (await http.get("/metadata")).json()
            info = EnvInfo(
                name=str(metadata.get("name", "")),
                contract_version=schema.get("contract_version"),
                fingerprint=schema.get("fingerprint"),
                schemas={k: schema[k] for k in ("action", "observation", "state") if k in schema},
                description=metadata.get("description") or "",
            )
            if self.split is None:
                return info, None
            reply = await http.post(f"/{info.name}/num_tasks", json={"split": self.split})
            if reply.status_code != 200:
                detail = (
                    reply.json().get("detail")
                    if reply.headers.get("content-type", "").startswith("application/json")
                    else reply.text
                )
                raise EvalError(f"cannot play split {self.split!r}: {detail}")
            count = int(reply.json()["num_tasks"])
            if count < 1:
                raise EvalError(f"split {self.split!r} of {info.name} has no tasks")
            return info, count

    def _count(self, success: bool | None) -> None:
        self.finished += 1
        self.successes += success is True

    def _needs_schema(self) -> bool:
        return self.policy_spec in ("random", "llm")

    def _llm(self) -> bool:
        """The policy is the LLM's (``llm``, or ``random`` with an endpoint and model)."""
        url, model, _ = self.llm
        return self.policy_spec == "llm" or (
            url is not None and self.policy_spec == "random" and model is not None
        )

    def _policy_name(self) -> str:
        """The name the policy will have (what ``run.json`` compares), without loading it."""
        spec = self.policy_spec
        if isinstance(spec, Policy):
            return spec.name
        return f"llm:{self.llm[1]}" if self._llm() else spec

    def _policy(
        self, action_type: type[BaseModel] | None, info: EnvInfo
    ) -> tuple[Policy, Callable[[], Any] | None]:
        spec = self.policy_spec
        if isinstance(spec, Policy):
            return spec, None
        url, model, key = self.llm
        if self._llm():
            if url is None or model is None:
                raise EvalError("--policy llm needs --llm-url and --model")
            assert action_type is not None
            description = str((info.model_extra or {}).get("description", ""))
            policy, client = llm_policy(
                url, model, action_type=action_type, description=description, api_key=key
            )
            return policy, client.aclose
        try:
            return load_policy(spec, action_type=action_type, env=self.env), None
        except PolicyError as exc:
            raise EvalError(str(exc)) from None

    # -- playing -------------------------------------------------------------------

    async def _play(
        self,
        pool: EnvPool[Any, Any, Any],
        policy: Policy,
        recorder: EpisodeRecorder,
        tasks: int | None,
        bar: ProgressBar,
    ) -> None:
        while self.queue or self.running:
            free = [s for s in range(pool.num_envs) if s not in self.running]
            starts = []
            while free and self.queue:
                starts.append((free.pop(0), *self.queue.popleft()))
            if starts:
                await self._start(pool, policy, recorder, tasks, starts, bar)
            if self.running:
                await self._round(pool, recorder, bar)

    async def _start(
        self,
        pool: EnvPool[Any, Any, Any],
        policy: Policy,
        recorder: EpisodeRecorder,
        tasks: int | None,
        starts: list[tuple[int, int, int]],
        bar: ProgressBar,
    ) -> None:
        seeds, options, refs = [], [], []
        for _, k, _ in starts:
            opts = dict(self.options)
            ref = None
            if self.split is not None and tasks is not None:
                ref = TaskRef(split=self.split, index=k % tasks)
                opts.update(split=ref.split, index=ref.index)
            seeds.append(self.seed + k)
            options.append(opts)
            refs.append(ref)
        sent, clock = time.time(), time.perf_counter()
        batch = await pool.reset(seed=seeds, options=options, ids=[s for s, _, _ in starts])
        latency = time.perf_counter() - clock
        observations = dict(zip(batch.ids.tolist(), batch.observations, strict=True))
        for (slot, k, attempt), seed, opts, ref in zip(starts, seeds, options, refs, strict=True):
            session = f"pool-{slot}"
            error = batch.errors.get(slot)
            if error is not None and str(error.code) == "INVALID_ARGUMENT":
                raise EvalError(
                    f"the environment refused the reset options {opts}: {error.message}"
                )
            recorder.reset(
                session,
                seed=seed,
                options=opts,
                task=ref,
                observation=observations.get(slot),
                error=error,
                t=sent,
                latency_s=latency,
                episode=episode_id(k, attempt),
            )
            if error is not None:
                self._fail(
                    recorder,
                    slot,
                    _Running(k, attempt, _idle, Observation()),
                    ErrorInfo.of(error),
                    bar,
                    running=False,
                )
                continue
            try:
                agent = policy.agent(seed, ref)
            except Exception as exc:
                self._fail(
                    recorder,
                    slot,
                    _Running(k, attempt, _idle, Observation()),
                    _policy_error(exc),
                    bar,
                    running=False,
                )
                continue
            self.running[slot] = _Running(k, attempt, agent, observations[slot])
            if observations[slot].done:  # ended at the reset
                self._finish(recorder, slot, observations[slot].metadata.get("success"), bar)

    async def _round(
        self, pool: EnvPool[Any, Any, Any], recorder: EpisodeRecorder, bar: ProgressBar
    ) -> None:
        slots = sorted(self.running)
        chosen = await asyncio.gather(
            *(_act(self.running[s]) for s in slots), return_exceptions=True
        )
        ids: list[int] = []
        actions: list[BaseModel] = []
        sent = time.time()
        for slot, action in zip(slots, chosen, strict=True):
            current = self.running[slot]
            if isinstance(action, BaseException):
                if not isinstance(action, Exception):
                    raise action
                self._fail(recorder, slot, current, _policy_error(action), bar)
                continue
            try:
                actions.append(_validated(pool.action_type, action))
                ids.append(slot)
            except InvalidAction as exc:
                recorder.step(f"pool-{slot}", action=_as_dict(action), error=exc, t=sent)
                self._after_error(recorder, slot, current, exc, bar)
        if not ids:
            return
        clock = time.perf_counter()
        await pool.send(actions, session_ids=ids)
        batch = await pool.recv()
        latency = time.perf_counter() - clock
        observations = dict(zip(batch.ids.tolist(), batch.observations, strict=True))
        for slot, action in zip(ids, actions, strict=True):
            current = self.running[slot]
            session = f"pool-{slot}"
            error = batch.errors.get(slot)
            if error is not None:
                recorder.step(session, action=action, error=error, t=sent, latency_s=latency)
                self._after_error(recorder, slot, current, error, bar)
                continue
            obs = observations[slot]
            recorder.step(session, action=action, observation=obs, t=sent, latency_s=latency)
            self.stats.steps += 1
            current.steps += 1
            current.observation = obs
            if obs.done:
                self._finish(recorder, slot, None, bar)
            elif current.steps >= self.max_steps:
                recorder.end(session, "truncated")
                self._finish(recorder, slot, False, bar)

    def _after_error(
        self,
        recorder: EpisodeRecorder,
        slot: int,
        current: _Running,
        error: CorralError,
        bar: ProgressBar,
    ) -> None:
        if str(error.code) in FAILS_ATTEMPT:
            self._fail(recorder, slot, current, ErrorInfo.of(error), bar)
            return
        current.steps += 1
        feedback = getattr(current.agent, "feedback", None)
        if callable(feedback):
            feedback(f"{error.code}: {error.message}")
        if current.steps >= self.max_steps:
            recorder.end(f"pool-{slot}", "truncated")
            self._finish(recorder, slot, False, bar)

    def _finish(self, recorder: EpisodeRecorder, slot: int, success: Any, bar: ProgressBar) -> None:
        self.running.pop(slot, None)
        self.stats.episodes += 1
        if not isinstance(success, bool):
            end = recorder.last_end
            success = end.success if end is not None else None
        self._count(success)
        bar.advance(self.finished, self.successes)

    def _fail(
        self,
        recorder: EpisodeRecorder,
        slot: int,
        current: _Running,
        error: ErrorInfo,
        bar: ProgressBar,
        *,
        running: bool = True,
    ) -> None:
        recorder.end(f"pool-{slot}", "failed", error)
        if running:
            self.running.pop(slot, None)
        self.failures[current.k] = self.failures.get(current.k, 0) + 1
        if self.failures[current.k] <= self.retries:
            self.queue.appendleft((current.k, current.attempt + 1))
            return
        self._count(False)
        bar.advance(self.finished, self.successes)

    def _progress(self, total: int, policy: str, env: str) -> ProgressBar:
        label = f"{env}: {policy}"
        return ProgressBar(self.show_progress, self.console, total, self.finished, label)


def _idle(observation: Any) -> Any:
    raise PolicyError("no agent")  # the stand-in of attempts that never got one


async def _act(current: _Running) -> Any:
    action = current.agent(current.observation)
    if inspect.isawaitable(action):
        action = await action
    return action


def _validated(model: type[BaseModel] | None, action: Any) -> BaseModel:
    """The action as the contract's model, or the client's ``INVALID_ACTION``."""
    assert model is not None
    if isinstance(action, model):
        return action
    raw = action.model_dump() if isinstance(action, BaseModel) else action
    if not isinstance(raw, Mapping):
        raise InvalidAction(f"the policy returned {type(action).__name__}, not an action")
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        raise InvalidAction(
            validation_message(f"invalid {model.__name__}", exc),
            details={"errors": exc.errors(include_url=False, include_context=False)},
        ) from None


def _as_dict(action: Any) -> dict[str, Any]:
    if isinstance(action, BaseModel):
        return action.model_dump(mode="json")
    if isinstance(action, Mapping):
        plain: dict[str, Any] = json.loads(json.dumps(dict(action), default=repr))
        return plain
    return {"value": repr(action)}


def _policy_error(exc: Exception) -> ErrorInfo:
    return ErrorInfo(code=POLICY_ERROR, message=f"{type(exc).__name__}: {exc}"[:500])


def _env_class(target: Any) -> type[Environment[Any, Any, Any]] | None:
    """The environment class a ``module:Class`` target names (None for URLs, or if it
    cannot be imported here: the models then come from the server's schemas)."""
    if not isinstance(target, str) or "://" in target or ":" not in target:
        return None
    try:
        found = load_target(target)
    except (TargetError, ImportError):
        return None
    return found if isinstance(found, type) and issubclass(found, Environment) else None
