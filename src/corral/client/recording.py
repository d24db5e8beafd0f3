"""Recording a client's or a pool's episodes (``record="dir/"``) into an episode file.

One :class:`Recording` per client or pool: the file is created in the directory at the
first reset (once the handshake has said which environment it is), named
``<source>-<UTC time>-<random>.jsonl``, and every reset and step goes through the same
:class:`~corral.episodes.EpisodeRecorder` the eval runner uses, so the lines are the
format :func:`corral.episodes.read` and ``corral replay`` read. Closing ends the open
episodes as ``abandoned`` and closes the file.

The pool records from the reply's columns (:meth:`Recording.pool_rows`): a row is the
observation's wire map, so no typed model is built to record a step.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from corral.contract.tasks import TaskRef
from corral.episodes import EnvInfo, EpisodeRecorder, EpisodeWriter, Header
from corral.errors import CorralError

if TYPE_CHECKING:
    from corral.client.batch import ResultTable

RecordTarget = str | os.PathLike[str]
"""Where ``record=`` puts episode files: a directory (created if missing)."""


class Recording:
    """The episode file of one client or pool (see module docstring).

    Args:
        directory: the directory the file goes in.
        source: who records (``client``, ``pool``): the file's prefix and header source.
    """

    def __init__(self, directory: RecordTarget, source: str) -> None:
        self.directory = Path(os.fspath(directory))
        self.source = source
        self.path: Path | None = None
        """The file, once the first reset created it."""
        self._writer: EpisodeWriter | None = None
        self._recorder: EpisodeRecorder | None = None

    def recorder(
        self,
        env: Mapping[str, Any],
        url: str | None,
        models: Sequence[type[BaseModel] | None] = (),
    ) -> EpisodeRecorder:
        """The recorder, creating the file on first use with ``env`` (the handshake's
        ``env`` map) in its header, and the schemas of the action/observation/state
        ``models`` when all are known (a reader can then rebuild them without a server)."""
        if self._recorder is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            self.path = self.directory / f"{self.source}-{stamp}-{uuid.uuid4().hex[:8]}.jsonl"
            info = EnvInfo(
                name=str(env.get("name", "")),
                contract_version=env.get("contract_version"),
                fingerprint=env.get("fingerprint"),
                schemas=model_schemas(models),
            )
            self._writer = EpisodeWriter(self.path, Header(env=info, source=self.source, url=url))
            self._recorder = EpisodeRecorder(self._writer)
        return self._recorder

    def pool_rows(
        self,
        recorder: EpisodeRecorder,
        table: ResultTable,
        op: str,
        inputs: Mapping[int, Any],
        sent: float,
        latency: float,
    ) -> None:
        """Record a pool exchange: ``table``'s rows and errors, ``op`` ``"reset"`` (with
        ``inputs`` session id → ``(seed, options)``) or ``"step"`` (id → action)."""
        for k, index in enumerate(table.ids):
            self._one(recorder, index, op, inputs.get(index), table.row(k), None, sent, latency)
        for index, error in table.errors.items():
            if index in inputs:
                self._one(recorder, index, op, inputs[index], None, error, sent, latency)

    @staticmethod
    def _one(
        recorder: EpisodeRecorder,
        index: int,
        op: str,
        given: Any,
        row: dict[str, Any] | None,
        error: CorralError | None,
        sent: float,
        latency: float,
    ) -> None:
        session = f"pool-{index}"
        if op == "reset":
            seed, options = given if given is not None else (None, {})
            recorder.reset(
                session,
                seed=seed,
                options=options,
                observation=row,
                error=error,
                t=sent,
                latency_s=latency,
            )
        else:
            recorder.step(
                session,
                action=_action(given),
                observation=row,
                error=error,
                t=sent,
                latency_s=latency,
            )

    def close(self) -> None:
        """End the open episodes (``abandoned``) and close the file. Idempotent."""
        if self._recorder is not None:
            self._recorder.close()
        if self._writer is not None:
            self._writer.close()


def _action(value: Any) -> BaseModel | Mapping[str, Any]:
    """An action as the recorder takes it: a model, a map, or a non-map wire value
    wrapped so the line still holds it."""
    if isinstance(value, (BaseModel, Mapping)):
        return value
    return {"value": value}


def model_schemas(models: Sequence[type[BaseModel] | None]) -> dict[str, Any] | None:
    """The action/observation/state JSON Schemas of ``models``, None unless all are known."""
    if len(models) != 3 or any(m is None for m in models):
        return None
    names = ("action", "observation", "state")
    return {n: m.model_json_schema() for n, m in zip(names, models, strict=True) if m}


def as_task(task: TaskRef | tuple[str, int] | None) -> TaskRef | None:
    """``task`` as a :class:`TaskRef` (a ``(split, index)`` pair is accepted)."""
    if task is None or isinstance(task, TaskRef):
        return task
    split, index = task
    return TaskRef(split=split, index=index)


def now() -> tuple[float, float]:
    """``(wall-clock time, monotonic clock)``: a line's ``t`` and the start of its latency."""
    return time.time(), time.perf_counter()
