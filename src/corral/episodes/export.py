"""Episodes as tables: one row per step line, to Parquet or a Hugging Face Dataset.

    rows = step_rows(read("episodes.jsonl"))
    to_parquet(read("episodes.jsonl"), "episodes.parquet")     # needs pyarrow
    dataset = to_dataset(read("episodes.jsonl"))                 # needs datasets

Columns: ``episode``, ``session``, ``index``, ``op``, ``seed``, ``split``, ``task_index``,
``reward``, ``terminated``, ``truncated``, ``error_code``, ``t``, ``latency_s``, and the
JSON text of ``action``, ``observation``, ``reward_components`` and ``options``
(observations differ between environments; as JSON text every environment fits one
schema), plus the episode's ``outcome``, ``total_reward`` and ``success`` on each row.
Both extras come with ``pip install 'corral[datasets]'``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from corral.episodes.episode import Episode

if TYPE_CHECKING:
    import datasets

EXTRA = "pip install 'corral[datasets]'"


def step_rows(episodes: Iterable[Episode]) -> list[dict[str, Any]]:
    """One flat row per step line of ``episodes``."""
    rows: list[dict[str, Any]] = []
    for episode in episodes:
        summary = episode.summary
        for record in episode.records:
            rows.append(
                {
                    "episode": episode.id,
                    "session": record.session,
                    "index": record.index,
                    "op": record.op,
                    "seed": record.seed,
                    "split": record.task.split if record.task else None,
                    "task_index": record.task.index if record.task else None,
                    "reward": record.reward,
                    "terminated": record.terminated,
                    "truncated": record.truncated,
                    "error_code": record.error.code if record.error else None,
                    "t": record.t,
                    "latency_s": record.latency_s,
                    "action": _text(record.action),
                    "observation": _text(record.observation),
                    "reward_components": _text(record.reward_components or None),
                    "options": _text(record.options),
                    "outcome": summary.outcome,
                    "total_reward": summary.total_reward,
                    "success": summary.success,
                }
            )
    return rows


def to_parquet(episodes: Iterable[Episode], path: str | Path) -> int:
    """Write :func:`step_rows` to a Parquet file; returns the number of rows.

    Raises:
        ImportError: pyarrow is not installed (the message says how to get it).
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(f"Parquet export needs pyarrow: {EXTRA}") from exc
    rows = step_rows(episodes)
    pq.write_table(pa.Table.from_pylist(rows, schema=_arrow_schema(pa)), str(path))
    return len(rows)


def to_dataset(episodes: Iterable[Episode]) -> datasets.Dataset:
    """:func:`step_rows` as a Hugging Face ``datasets.Dataset``.

    Raises:
        ImportError: datasets is not installed (the message says how to get it).
    """
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"Dataset export needs the datasets package: {EXTRA}") from exc
    import pyarrow as pa

    table = pa.Table.from_pylist(step_rows(episodes), schema=_arrow_schema(pa))
    return datasets.Dataset(table)


def _arrow_schema(pa: Any) -> Any:
    text, integer, number, flag = pa.string(), pa.int64(), pa.float64(), pa.bool_()
    return pa.schema(
        [
            ("episode", text),
            ("session", text),
            ("index", integer),
            ("op", text),
            ("seed", integer),
            ("split", text),
            ("task_index", integer),
            ("reward", number),
            ("terminated", flag),
            ("truncated", flag),
            ("error_code", text),
            ("t", number),
            ("latency_s", number),
            ("action", text),
            ("observation", text),
            ("reward_components", text),
            ("options", text),
            ("outcome", text),
            ("total_reward", number),
            ("success", flag),
        ]
    )


def _text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()
