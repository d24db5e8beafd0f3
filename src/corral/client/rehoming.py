"""Re-homing: moving a pool's sessions to another server with their episodes intact.

The fleet (:mod:`corral.client.fleet`) marks a session that must leave its server
(:attr:`~corral.client.fleet.Slot.move`: the server drains, cannot be reached, left the
membership) and the pool finds the ones whose requests failed because their session is
gone (lost, unknown, elsewhere, a connection closed under them). :class:`Rehoming`
applies to each the remedy :func:`corral.protocol.recovery.remedy` decides:

* **re-open** (no episode under way): a fresh session on a healthy server;
* **snapshot**: a ``snapshot`` at the source (which still answers), ``restore`` on the
  target, the old session closed;
* **replay**: a fresh session on the target, reset with the episode's seed, options and
  task, then every recorded action sent again, each observation compared with the
  recorded digest (sessions replaying to one connection go in lockstep, one batch per
  step); a mismatch abandons the replay;
* **stay**: the episode finishes where it is (its server still answers);
* **truncate**: a fresh session; the pool ends the episode visibly (``truncated``, the
  reason in ``info["corral"]``).

Every re-homing is counted with the time it took (:class:`RehomeStats`, the pool's
``stats()``). A step is never applied twice: a failed request's step is re-sent only
to a session restored to the state before it (the log holds only answered steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from corral.client.batch import ResultTable
from corral.client.fleet import Fleet, Link, Slot
from corral.errors import (
    ConnectionLost,
    CorralError,
    SessionElsewhere,
    SessionLost,
    SnapshotUnsupported,
    UnknownSession,
)
from corral.protocol.batch import ResetBatch, StepBatch
from corral.protocol.messages import Close, Restore, Restored, SnapshotReply, TakeSnapshot
from corral.protocol.recovery import Cause, EpisodeLog, Means, Remedy, digest_values, remedy

log = logging.getLogger("corral.client")

Exchange = Callable[[Link, str, list[tuple[Slot, Any]]], Awaitable[ResultTable]]
"""Sends one batch message of ``(slot, payload)`` items on a link; its results (the
pool's own request path, so replayed observations are read as the recorded ones were)."""

MOVABLE = (SessionLost, UnknownSession, SessionElsewhere)
"""Failures of a request that mean its session is gone from where it was: re-home it and
send the request again. (A connection that gave up, ``ConnectionLost``, is the fleet's
to recover: its server may well hold the sessions still, re-attached with their tokens;
one the fleet closes because its server is unreachable fails its requests with
``SessionLost``.)"""


def row_digests(table: ResultTable, positions: Sequence[int] | None = None) -> list[int]:
    """The digests of the observations at ``positions`` of ``table`` (default: all):
    how the pool records steps and a replay checks them.

    Made from the columns (a sparse table's from its rows), each array of a column
    standing as its dtype, shape and bytes: the codec would encode it through its
    Python hook for arrays, which costs more than the rest of the digest.
    """
    if positions is None:
        positions = range(len(table))
    if table.sparse:
        return [digest_values([table.row(k)]) for k in positions]
    columns = [_digestible([values[k] for k in positions]) for values in table.fields.values()]
    return [digest_values(row) for row in zip(*columns, strict=True)]


def row_digest(table: ResultTable, position: int) -> int:
    """The digest of the observation at ``position`` of ``table`` (see :func:`row_digests`)."""
    return row_digests(table, (position,))[0]


def _digestible(values: list[Any]) -> list[Any]:
    """A column's values with each plain ndarray as ``(dtype, shape, bytes)``."""
    if np.ndarray not in set(map(type, values)):
        return values
    return [(v.dtype.str, v.shape, v.tobytes()) if type(v) is np.ndarray else v for v in values]


def cause_of(error: CorralError) -> Cause:
    """Why a session whose request failed with ``error`` must move."""
    if isinstance(error, SessionLost) and error.details.get("unreachable"):
        return Cause.UNREACHABLE
    return Cause.LOST


@dataclass
class RehomeStats:
    """What re-homing did so far: counts, and seconds taken per remedy."""

    reopened: int = 0
    snapshot: int = 0
    replay: int = 0
    stayed: int = 0
    truncated: int = 0
    replay_failed: int = 0
    """Replays abandoned (an observation differed, or the target failed)."""
    snapshot_failed: int = 0
    """Snapshot moves that fell back to the next remedy."""
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def took(self, what: str, seconds: float) -> None:
        self.seconds.setdefault(what, []).append(seconds)

    def as_dict(self) -> dict[str, Any]:
        """Counts and, per remedy, ``{count, total_s, max_s}``."""
        times = {
            what: {"count": len(v), "total_s": sum(v), "max_s": max(v)}
            for what, v in self.seconds.items()
            if v
        }
        return {
            "reopened": self.reopened,
            "restored_by_snapshot": self.snapshot,
            "restored_by_replay": self.replay,
            "stayed": self.stayed,
            "truncated": self.truncated,
            "replay_failed": self.replay_failed,
            "snapshot_failed": self.snapshot_failed,
            "seconds": times,
        }


class Rehoming:
    """Applies the remedies to a pool's sessions (see the module docstring).

    Args:
        fleet: the pool's fleet (placement, links, slots).
        exchange: the pool's batch request on one link.
        timeout: seconds for each request.
    """

    def __init__(self, fleet: Fleet, exchange: Exchange, timeout: float | None) -> None:
        self.fleet = fleet
        self.exchange = exchange
        self.timeout = timeout
        self.stats = RehomeStats()

    # -- deciding -----------------------------------------------------------------------

    def snapshots(self) -> bool:
        """The environment declares a snapshot (as the servers' ``welcome`` says)."""
        for server in self.fleet.servers:
            for link in server.links:
                env = link.connection.welcome.get("env", {})
                return bool(env.get("snapshots"))
        return False

    def means(self, slot: Slot, cause: Cause, fresh: bool) -> Means:
        """What is possible for ``slot`` now (``fresh``: its caller resets it anyway)."""
        link = slot.link
        answers = (
            cause in (Cause.GOING_AWAY, Cause.LEAVING)
            and link is not None
            and link.connection.connected
        )
        return Means(
            episode=slot.log.started and not slot.ended and not fresh,
            snapshot=self.snapshots(),
            source_answers=answers,
            replayable=slot.log.replayable,
        )

    # -- acting -------------------------------------------------------------------------

    def _decide(self, slot: Slot, fresh: bool, snapshot: bool = True) -> Remedy:
        cause = slot.move = slot.move or Cause.LOST
        means = self.means(slot, cause, fresh)
        if not snapshot:
            means = dataclasses.replace(means, snapshot=False)
        return remedy(cause, means)

    async def rehome(
        self, slots: list[Slot], *, fresh: bool = False
    ) -> tuple[dict[int, str], dict[int, CorralError]]:
        """Move every slot of ``slots`` (their :attr:`~Slot.move`, else lost).

        Returns ``{index: reason}`` for the sessions whose episode ended truncated (each
        now a fresh session, needing a reset), and ``{index: error}`` for those no
        server could take now (still marked to move: the next request tries again).
        ``fresh``: the caller is about to reset them, so nothing is restored (re-opened).
        """
        plan: dict[Remedy, list[Slot]] = {r: [] for r in Remedy}
        for slot in slots:
            plan[self._decide(slot, fresh)].append(slot)
        moves = await asyncio.gather(*(self._by_snapshot(slot) for slot in plan[Remedy.SNAPSHOT]))
        for slot, done in moves:
            if done is False:  # the next remedy, snapshots aside
                plan[self._decide(slot, fresh, snapshot=False)].append(slot)
        for slot in plan[Remedy.STAY]:
            slot.move, slot.stays = None, True
            self.stats.stayed += 1
        truncated = {slot.index: self._why_truncated(slot) for slot in plan[Remedy.TRUNCATE]}
        for slot, why in (await self._by_replay(plan[Remedy.REPLAY])).items():
            truncated[slot.index] = f"the episode could not be replayed: {why}"
            plan[Remedy.TRUNCATE].append(slot)
        opened = await asyncio.gather(
            *(self._reopen(slot, False) for slot in plan[Remedy.REOPEN]),
            *(self._reopen(slot, True) for slot in plan[Remedy.TRUNCATE]),
        )
        stuck = {index: error for index, error in opened if error is not None}
        for index in stuck:
            truncated.pop(index, None)
        return truncated, stuck

    def _why_truncated(self, slot: Slot) -> str:
        cause = slot.move or Cause.LOST
        what = {
            Cause.LOST: "its session was lost",
            Cause.UNREACHABLE: "its server could not be reached",
            Cause.GOING_AWAY: "its server went away",
            Cause.LEAVING: "its server left the fleet",
        }[cause]
        return (
            f"{what}, and the episode can be neither snapshotted nor replayed ({slot.log.why_not})"
        )

    async def _target(self, slot: Slot) -> Link:
        source = slot.link.server_id if slot.link is not None else None
        try:
            return await self.fleet.place({source} if source else set())
        except ConnectionLost:
            if source is None:
                raise
            return await self.fleet.place(set())  # nowhere else: its own server again

    def _close_old(self, slot: Slot) -> None:
        """Close the session ``slot`` leaves, if its server still answers (in the
        background: a draining server exits once its last session is gone)."""
        link = slot.link
        if link is None or not link.connection.connected:
            return
        connection, session = link.connection, slot.session

        async def close() -> None:
            with contextlib.suppress(CorralError):
                await connection.request(Close(connection.next_id(), session), timeout=10.0)

        self.fleet.in_background(close())

    async def _reopen(self, slot: Slot, truncated: bool) -> tuple[int, CorralError | None]:
        started = time.perf_counter()
        try:
            link = await self._target(slot)
            session = await self.fleet.open_on(link)
        except CorralError as exc:
            log.warning("session %d could not be re-opened anywhere: %s", slot.index, exc)
            return slot.index, SessionLost(
                f"session {slot.index} must move ({slot.move}) and no server can take it "
                f"now: {exc.message}",
                details={"session": slot.index, "reason": exc.message},
            )
        self._close_old(slot)
        self.fleet.move_to(slot, link, session)
        slot.log.clear("the session was re-opened")
        slot.needs_reset, slot.ended = True, False
        if truncated:
            self.stats.truncated += 1
            self.stats.took("truncate", time.perf_counter() - started)
        else:
            self.stats.reopened += 1
            self.stats.took("reopen", time.perf_counter() - started)
        return slot.index, None

    def _answers(self, slot: Slot) -> bool:
        """The session's server still answers: it can wait there for a place."""
        link = slot.link
        return (
            slot.move in (Cause.GOING_AWAY, Cause.LEAVING)
            and link is not None
            and link.connection.connected
        )

    async def _by_snapshot(self, slot: Slot) -> tuple[Slot, bool | None]:
        """Snapshot at the source, restore on a target; False when that failed, None
        when no server can take it yet (it stays, marked, and moves at a later
        request: its server still answers)."""
        started = time.perf_counter()
        source = slot.link
        assert source is not None
        connection = source.connection
        try:
            target = await self._target(slot)
        except ConnectionLost:
            return slot, None
        try:
            reply = await connection.request(
                TakeSnapshot(connection.next_id(), slot.session), timeout=self.timeout
            )
            assert isinstance(reply, SnapshotReply)
            restored = await target.connection.request(
                Restore(target.connection.next_id(), reply.snapshot), timeout=self.timeout
            )
            assert isinstance(restored, Restored)
        except CorralError as exc:
            log.info("moving session %d by snapshot failed (%s)", slot.index, exc)
            self.stats.snapshot_failed += 1
            return slot, False
        self._close_old(slot)
        self.fleet.move_to(slot, target, restored.session)
        self.stats.snapshot += 1
        self.stats.took("snapshot", time.perf_counter() - started)
        return slot, True

    async def _by_replay(self, slots: list[Slot]) -> dict[Slot, str]:
        """Replay each slot's episode on a target, in lockstep per target link; the
        slots whose replay failed, with why (their logs cleared)."""
        started = time.perf_counter()
        failed: dict[Slot, str] = {}
        groups: dict[int, tuple[Link, list[tuple[Slot, Slot]]]] = {}
        for slot in slots:
            try:
                link = await self._target(slot)
                session = await self.fleet.open_on(link)
            except CorralError as exc:
                if not self._answers(slot):
                    failed[slot] = f"no server could take its replay ({exc.message})"
                continue  # it waits where it is, marked, for a later request
            stand_in = Slot(slot.index, link.server, link, session)
            groups.setdefault(id(link), (link, []))[1].append((slot, stand_in))
        results = await asyncio.gather(
            *(self._replay_on(link, pairs) for link, pairs in groups.values())
        )
        for (link, pairs), outcome in zip(groups.values(), results, strict=True):
            for slot, stand_in in pairs:
                why = outcome.get(slot.index)
                if why is None:
                    self._close_old(slot)
                    self.fleet.move_to(slot, link, stand_in.session)
                    self.stats.replay += 1
                    self.stats.took("replay", time.perf_counter() - started)
                    continue
                failed[slot] = why
                self.stats.replay_failed += 1
                connection = link.connection
                with contextlib.suppress(CorralError):
                    close = Close(connection.next_id(), stand_in.session)
                    await connection.request(close, timeout=self.timeout)
        for slot, why in failed.items():
            slot.log.clear(why)
        return failed

    async def _replay_on(
        self, link: Link, pairs: list[tuple[Slot, Slot]], last: dict[int, Any] | None = None
    ) -> dict[int, str]:
        """Replay ``pairs`` (slot, its new session on ``link``) in lockstep; why each
        failed replay failed, by index (``last``: filled with each one's last
        observation)."""
        failed: dict[int, str] = {}
        logs: dict[int, EpisodeLog] = {slot.index: slot.log for slot, _ in pairs}
        items: list[tuple[Slot, Any]] = [
            (stand_in, (slot.log.seed, slot.log.options)) for slot, stand_in in pairs
        ]
        table = await self._send(link, ResetBatch.type, items)
        self._check(table, logs, failed, None, last)
        longest = max(log.steps for log in logs.values())
        for step in range(longest):
            items = [
                (stand_in, slot.log.actions[step])
                for slot, stand_in in pairs
                if slot.index not in failed and step < slot.log.steps
            ]
            if not items:
                break
            table = await self._send(link, StepBatch.type, items)
            self._check(table, logs, failed, step, last)
        return failed

    async def fork(
        self, source: Slot, n: int, first_index: int
    ) -> list[tuple[Slot, dict[str, Any]]]:
        """``n`` new sessions in ``source``'s current state (indices from
        ``first_index``), by one snapshot restored ``n`` times, else by verified replay;
        each with the wire observation of its first state.

        Raises:
            SnapshotUnsupported: neither is possible (the message says why).
            CorralError: a restore or replay failed (the sessions made are closed).
        """
        made: list[Slot] = []
        seen: dict[int, Any] = {}
        step = source.log.steps
        try:
            if self.snapshots():
                link = source.link
                assert link is not None
                connection = link.connection
                reply = await connection.request(
                    TakeSnapshot(connection.next_id(), source.session), timeout=self.timeout
                )
                assert isinstance(reply, SnapshotReply)
                for k in range(n):
                    target = await self.fleet.place(set())
                    restored = await target.connection.request(
                        Restore(target.connection.next_id(), reply.snapshot), timeout=self.timeout
                    )
                    assert isinstance(restored, Restored)
                    made.append(self._child(source, first_index + k, target, restored.session))
                    seen[made[-1].index] = restored.observation
            elif source.log.replayable and source.log.started:
                pairs = []
                for k in range(n):
                    target = await self.fleet.place(set())
                    session = await self.fleet.open_on(target)
                    child = self._child(source, first_index + k, target, session)
                    made.append(child)
                    pairs.append((child, target))
                for link in {id(t): t for _, t in pairs}.values():
                    group = [(c, c) for c, t in pairs if t is link]
                    failed = await self._replay_on(link, group, seen)
                    if failed:
                        raise SnapshotUnsupported(
                            f"cannot fork session {source.index}: its replay failed "
                            f"({next(iter(failed.values()))})",
                            details={"session": source.index},
                        )
            else:
                why = source.log.why_not if source.log.started else "no episode has started"
                raise SnapshotUnsupported(
                    f"cannot fork session {source.index}: the environment declares no "
                    f"snapshot and its episode cannot be replayed ({why})",
                    details={"session": source.index, "replay": why},
                )
        except BaseException:
            for child in made:
                self._close_old(child)
            raise
        for child in made:
            child.parent = (source.index, step)
        return [(child, seen.get(child.index) or {}) for child in made]

    def _child(self, source: Slot, index: int, link: Link, session: str) -> Slot:
        child = Slot(index, link.server, link, session)
        link.slots.append(child)
        child.log, child.ended = source.log.copy(), source.ended
        return child

    async def _send(self, link: Link, kind: str, items: list[tuple[Slot, Any]]) -> ResultTable:
        chunks = [items[i : i + link.batch_limit] for i in range(0, len(items), link.batch_limit)]
        parts = await asyncio.gather(*(self.exchange(link, kind, chunk) for chunk in chunks))
        return ResultTable.concat(parts, [slot.index for slot, _ in items])

    @staticmethod
    def _check(
        table: ResultTable,
        logs: dict[int, EpisodeLog],
        failed: dict[int, str],
        step: int | None,
        last: dict[int, Any] | None,
    ) -> None:
        for index, error in table.errors.items():
            failed.setdefault(index, f"the replay failed: {error.message}")
        for k, index in enumerate(table.ids):
            if last is not None:
                last[index] = table.row(k)
            episode = logs[index]
            if step is None:
                why = episode.check_reset(table.row(k))
            else:
                why = episode.check_step_digest(step, row_digest(table, k))
            if why is not None:
                failed.setdefault(index, why)


__all__ = ["MOVABLE", "RehomeStats", "Rehoming", "cause_of", "row_digest", "row_digests"]
