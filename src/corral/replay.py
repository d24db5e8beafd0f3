"""Replay: re-run recorded episodes against a server and find where they diverge.

    report = await replay("runs/a/episodes.jsonl", "http://127.0.0.1:8000")
    for result in report.diverged:
        print(result.divergence)    # episode 9c1e: step 3 differs at observation.pattern: ...

Each episode is started again with its recorded seed and reset options (its task
included) and fed its recorded actions, failed ones too; every reply is compared with
the recorded one (:func:`corral.episodes.compare_records`: the same error code, or the
same observation as JSON). The first difference is the episode's
:class:`~corral.episodes.Divergence`. A deterministic environment replays every episode
identically; ``corral validate`` uses the same comparison for its determinism check.

Not replayed: what the recording cannot reproduce. An episode whose recording starts
mid-episode is skipped; replay stops (without a verdict on the rest) at a recorded
error that says nothing about the environment (``SESSION_LOST``, ``REQUEST_TIMEOUT``,
``CONNECTION_LOST``, ...), and at an auto-reset.

A file is streamed: episodes are read as they end in it
(:func:`~corral.episodes.iter_episodes`), replayed, written to ``out`` and let go, so
memory holds the episodes being replayed (and those finished ahead of an earlier one, up
to a few per worker), not the file: a report keeps each episode's outline
(:meth:`~corral.episodes.Episode.outline`), not its lines (issue 30.14: a 40 MB file of
200k lines took 1.6 GB).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from corral.client import AsyncEnvClient
from corral.client.dialers import Dialer
from corral.contract import Environment
from corral.episodes import (
    SESSION_ENDING_CODES,
    Divergence,
    EnvInfo,
    Episode,
    EpisodeRecorder,
    EpisodeWriter,
    Header,
    StepRecord,
    compare_records,
    iter_episodes,
)
from corral.episodes.files import AnyLine, Source
from corral.errors import CorralError, InvalidAction, validation_message

NOT_REPLAYABLE = SESSION_ENDING_CODES | {"REQUEST_TIMEOUT", "SESSION_BUSY", "INTERNAL_ERROR"}
"""Recorded error codes that say nothing about the environment: replay stops there."""

Status = Literal["identical", "diverged", "skipped", "failed"]


@dataclass
class EpisodeReplay:
    """The replay of one recorded episode.

    Attributes:
        episode: the recorded episode (in a :class:`ReplayReport`, its outline: id,
            header, first line and end line, see :meth:`Episode.outline`).
        status: ``identical`` (every compared reply matched), ``diverged`` (see
            ``divergence``), ``skipped`` (nothing could be replayed) or ``failed`` (the
            replay itself broke: the server went away, a session was lost).
        compared: how many replies were compared (the reset included).
        divergence: where it first differed, for ``diverged``.
        note: why it was skipped, stopped early, or failed.
        lines: the replay's own lines (a recording of the new run); :func:`replay`
            writes them to its ``out`` file and keeps none.
        recorded: how many step lines the recorded episode has.
    """

    episode: Episode
    status: Status
    compared: int = 0
    divergence: Divergence | None = None
    note: str = ""
    lines: list[AnyLine] = field(default_factory=list)
    recorded: int = -1

    def __post_init__(self) -> None:
        if self.recorded < 0:
            self.recorded = len(self.episode.records)

    def describe(self) -> str:
        """One line for people."""
        if self.status == "diverged":
            assert self.divergence is not None
            return str(self.divergence)
        text = f"episode {self.episode.id}: {self.status}, {self.compared}/{self.recorded} "
        text += "replies compared"
        return f"{text} ({self.note})" if self.note else text

    def outline(self) -> EpisodeReplay:
        """This result as a report keeps it: the episode's outline, no lines."""
        return replace(self, episode=self.episode.outline(), lines=[])


@dataclass
class ReplayReport:
    """Every episode's replay, and the contracts compared.

    Attributes:
        url: the server replayed against.
        results: one per episode, in the file's order.
        recorded_fingerprint / served_fingerprint: the contract fingerprints of the
            recording's (first) header and of the server (they should be equal).
    """

    url: str
    results: list[EpisodeReplay]
    recorded_fingerprint: str | None = None
    served_fingerprint: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing diverged or failed."""
        return all(r.status in ("identical", "skipped") for r in self.results)

    @property
    def diverged(self) -> list[EpisodeReplay]:
        """The episodes that diverged."""
        return [r for r in self.results if r.status == "diverged"]

    @property
    def contract_changed(self) -> bool:
        """True when the server's contract fingerprint is not the recording's."""
        return (
            self.recorded_fingerprint is not None
            and self.served_fingerprint is not None
            and self.recorded_fingerprint != self.served_fingerprint
        )

    def counts(self) -> dict[str, int]:
        """How many episodes ended in each status."""
        out = {status: 0 for status in ("identical", "diverged", "skipped", "failed")}
        for result in self.results:
            out[result.status] += 1
        return out


async def replay(
    source: Source | Sequence[Episode],
    url: str,
    *,
    env: type[Environment[Any, Any, Any]] | None = None,
    ignore: Sequence[str] = (),
    episodes: Sequence[str] | None = None,
    concurrency: int = 4,
    codec: str = "msgpack",
    token: str | None = None,
    timeout: float | None = 60.0,
    out: str | Path | None = None,
    dialer: Dialer | None = None,
) -> ReplayReport:
    """Replay recorded episodes against the server at ``url`` (see the module docstring).

    Args:
        source: an episode file (anything :func:`corral.episodes.read` takes) or episodes.
        url: the server.
        env: the environment class, for typed models and a contract check at connect
            (default: models from the server's schemas).
        ignore: observation paths to leave out of the comparison (``metadata.elapsed``).
        episodes: replay only these episode ids.
        concurrency: episodes replayed at once, each on its own session.
        codec: ``msgpack`` or ``json``.
        token: bearer token for the server.
        timeout: seconds to wait for each reply.
        out: also write the replayed episodes to this episode file.
        dialer: what reaches the server (default: the network's; :mod:`corral.testing`'s
            in-process servers give theirs).

    Raises:
        EpisodeFormatError: the file is malformed.
        CorralError: the server cannot be reached or refuses the contract.
        ValueError: ``concurrency`` is below 1.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    recorded = _episodes(source)
    if episodes is not None:
        wanted = set(episodes)
        recorded = (e for e in recorded if e.id in wanted)
    numbered = enumerate(recorded)
    served: dict[str, Any] = {}
    results: list[EpisodeReplay] = []
    writer: _Ordered | None = None
    if out is not None:
        writer = _Ordered(out, concurrency)

    def take() -> tuple[int, Episode] | None:
        return next(numbered, None)  # read on demand: the file is never all held

    async def worker(number: int) -> None:
        # A worker connects (and opens its session) once it has an episode to replay;
        # the first one connects anyway, for the server's identity.
        item = take()
        if item is None and number > 0:
            return
        client: AsyncEnvClient[Any, Any, Any] = AsyncEnvClient(
            url, env=env, codec=codec, token=token, timeout=timeout, dialer=dialer
        )
        async with client:
            served.update(client.server_info.get("env") or {})
            if writer is not None:
                writer.open(report_url=url, served=served)
            while item is not None:
                index, episode = item
                result = await replay_episode(client, episode, ignore=ignore)
                if writer is not None:
                    writer.put(index, result.lines)
                results.append(result.outline())
                if writer is not None:
                    await writer.room()
                item = take()

    tasks = [asyncio.ensure_future(worker(number)) for number in range(concurrency)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:  # a malformed line, a lost server: stop the other workers too
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if writer is not None:
            writer.close()
    results.sort(key=lambda r: r.episode.line)
    return ReplayReport(
        url=url,
        results=results,
        recorded_fingerprint=results[0].episode.header.env.fingerprint if results else None,
        served_fingerprint=served.get("fingerprint"),
    )


async def replay_episode(
    client: AsyncEnvClient[Any, Any, Any], episode: Episode, *, ignore: Sequence[str] = ()
) -> EpisodeReplay:
    """Replay one episode on ``client``'s session (connected or not)."""
    first = episode.first
    if first is None or first.op != "reset":
        return EpisodeReplay(episode, "skipped", note="the recording starts mid-episode")
    await client.connect()
    result = EpisodeReplay(episode, "identical")
    recorder = EpisodeRecorder(result.lines.append, new_id=lambda: episode.id)
    session = client.session_id or "replay"
    for record in episode.records:
        if record.op == "reset" and record.index > 0:
            result.note = f"stopped at line {record.index}: an auto-reset"
            break
        if record.error is not None and record.error.code in NOT_REPLAYABLE:
            result.note = f"stopped at line {record.index}: recorded {record.error.code}"
            break
        await _send(client, recorder, session, record)
        new = next(line for line in reversed(result.lines) if isinstance(line, StepRecord))
        if new.error is not None and new.error.code in NOT_REPLAYABLE:
            result.status = "failed"
            result.note = f"line {record.index}: {new.error.code}: {new.error.message}"
            break
        found = compare_records(record, new, ignore=ignore)
        if found is not None:
            result.status = "diverged"
            result.divergence = Divergence(episode.id, record.index, record.op, *found)
            break
        result.compared += 1
    recorder.close()
    return result


async def _send(
    client: AsyncEnvClient[Any, Any, Any],
    recorder: EpisodeRecorder,
    session: str,
    record: StepRecord,
) -> None:
    """Send ``record``'s request again and record the reply."""
    started, clock = time.time(), time.perf_counter()
    if record.op == "reset":
        options = dict(record.options or {})
        task = record.task
        try:
            first = await client.reset(seed=record.seed, task=task, **options)
        except CorralError as exc:
            recorder.reset(
                session, seed=record.seed, options=options, task=task, error=exc, t=started
            )
            return
        recorder.reset(
            session,
            seed=record.seed,
            options=options,
            task=task,
            observation=first.observation,
            t=started,
            latency_s=time.perf_counter() - clock,
        )
        return
    assert client.action_type is not None
    try:
        action = record.action_as(client.action_type)
    except ValidationError as exc:
        misfit = InvalidAction(
            validation_message(
                f"the recorded action does not fit the served {client.action_type.__name__}",
                exc,
            ),
            details={"errors": exc.errors(include_url=False, include_context=False)},
        )
        recorder.step(session, action=record.action or {}, error=misfit, t=started)
        return
    try:
        result = await client.step(action)
    except CorralError as exc:
        recorder.step(session, action=action, error=exc, t=started)
        return
    recorder.step(
        session,
        action=action,
        observation=result.observation,
        t=started,
        latency_s=time.perf_counter() - clock,
    )


def _episodes(source: Source | Sequence[Episode]) -> Iterator[Episode]:
    if isinstance(source, (list, tuple)) and all(isinstance(e, Episode) for e in source):
        return (e for e in source if isinstance(e, Episode))
    return iter_episodes(source)  # type: ignore[arg-type]


class _Ordered:
    """The replay's own recording: each episode's lines written once it and every
    episode before it (in reading order) finished, so the file is in the source's order
    whatever finishes first; finished episodes wait at most ``4 x concurrency`` deep
    (:meth:`room` holds the workers back), so memory stays bounded."""

    def __init__(self, path: str | Path, concurrency: int) -> None:
        self.path = path
        self.window = 4 * concurrency
        self.out: EpisodeWriter | None = None
        self.waiting: dict[int, list[AnyLine]] = {}
        self.next = 0
        self.changed = asyncio.Event()

    def open(self, *, report_url: str, served: dict[str, Any]) -> None:
        """Start the file (once the server said which environment it serves)."""
        if self.out is None:
            header = Header(env=EnvInfo.model_validate(served), source="replay", url=report_url)
            self.out = EpisodeWriter(self.path, header)

    async def room(self) -> None:
        """Wait while too many finished episodes wait for an earlier one."""
        while len(self.waiting) >= self.window:
            self.changed.clear()
            await self.changed.wait()

    def put(self, index: int, lines: list[AnyLine]) -> None:
        """Episode ``index`` finished with ``lines``: write what is now in order."""
        assert self.out is not None
        self.waiting[index] = lines
        while self.next in self.waiting:
            for line in self.waiting.pop(self.next):
                self.out.write(line)
            self.next += 1
        self.changed.set()

    def close(self) -> None:
        """Write what is left (after a failure, episodes past a gap) and close."""
        if self.out is None:
            return
        for index in sorted(self.waiting):
            for line in self.waiting.pop(index):
                self.out.write(line)
        self.out.close()
