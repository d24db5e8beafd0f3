"""Episode files: a streaming JSONL writer and the readers.

    with EpisodeWriter("runs/a/episodes.jsonl", Header(env=EnvInfo(name="wordle"))) as out:
        out.write(record)                   # any line; end lines are flushed at once
    episodes = read("runs/a/episodes.jsonl")

A writer that is killed leaves at most one partial last line: readers skip it, and a
writer opened with ``append=True`` cuts it off before writing. Completed episodes are
on disk as soon as their end line is written (the writer flushes it). Files ending in
``.gz`` are read and written gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import orjson
from pydantic import ValidationError

from corral.episodes.episode import Episode, EpisodeFormatError, assemble
from corral.episodes.format import LINE, EpisodeEnd, Header, StepRecord, dump_line

log = logging.getLogger("corral.episodes")

AnyLine = Header | StepRecord | EpisodeEnd
Source = str | os.PathLike[str] | IO[bytes] | bytes | Iterable[bytes | str]
"""What the readers take: a path, a binary file, the file's bytes, or its lines."""

_TAIL_CHUNK = 64 * 1024


class EpisodeWriter:
    """Appends lines to an episode file; safe to share between threads.

    Args:
        target: a path (parent directories are created) or a binary file object
            (left open on :meth:`close`).
        header: the segment's header, written first; required for a new file.
        append: add to an existing file (a new segment if ``header`` is given) instead
            of replacing it; a partial last line left by a killed writer is removed.

    Raises:
        ValueError: a new or empty file without a header, or ``append`` to a ``.gz``
            file whose end is damaged.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[bytes],
        header: Header | None = None,
        *,
        append: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self._owned = not hasattr(target, "write")
        self.path: Path | None = None
        empty = True
        if self._owned:
            self.path = Path(os.fspath(target))  # type: ignore[arg-type]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if append and self.path.exists():
                empty = _repair_tail(self.path) == 0
            self._file: IO[bytes] = _open(self.path, "ab" if append else "wb")
        else:
            self._file = target  # type: ignore[assignment]
            empty = not append
        if header is None and empty:
            raise ValueError("a new episode file starts with a header: pass header=Header(...)")
        self.lines = 0
        """Lines written by this writer."""
        self.closed = False
        if header is not None:
            self.write(header)

    def write(self, line: AnyLine) -> None:
        """Write one line (flushed at once for headers and end lines).

        Raises:
            ValueError: the writer is closed.
        """
        data = dump_line(line)
        with self._lock:
            if self.closed:
                raise ValueError("write to a closed EpisodeWriter")
            self._file.write(data)
            self.lines += 1
            if not isinstance(line, StepRecord):
                self._file.flush()

    def write_fields(self, fields: dict[str, Any]) -> bool:
        """Write a step line given as its JSON-ready fields (in the model's order, nulls
        left out): what :class:`~corral.episodes.EpisodeRecorder` does to skip building
        a model per step. Returns False, writing nothing, if a value is not JSON.

        Raises:
            ValueError: the writer is closed.
        """
        try:
            data = orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:
            return False
        with self._lock:
            if self.closed:
                raise ValueError("write to a closed EpisodeWriter")
            self._file.write(data)
            self.lines += 1
        return True

    def flush(self) -> None:
        """Push buffered lines to the operating system."""
        with self._lock:
            if not self.closed:
                self._file.flush()

    def close(self) -> None:
        """Flush, and close the file if this writer opened it. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._file.flush()
            if self._owned:
                self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read(source: Source, *, strict: bool = True) -> list[Episode]:
    """Every episode of ``source``, in the order they started.

    Args:
        source: a path, a binary file, the file's bytes, or its lines.
        strict: raise on a malformed line; otherwise skip it with a warning. A partial
            last line (a killed writer's) is skipped either way.

    Raises:
        EpisodeFormatError: a malformed line (``strict``), naming its number.
        OSError: the file cannot be read.
    """
    episodes = list(assemble(iter_lines(source, strict=strict), strict=strict))
    episodes.sort(key=lambda e: e.line)
    return episodes


def iter_episodes(source: Source, *, strict: bool = True) -> Iterator[Episode]:
    """The episodes of ``source`` as each one ends (streaming: memory holds only the
    episodes in progress); those without an end line come last."""
    return assemble(iter_lines(source, strict=strict), strict=strict)


def iter_lines(source: Source, *, strict: bool = True) -> Iterator[tuple[int, AnyLine]]:
    """``(line number, line)`` for each line of ``source`` (see :func:`read`).

    Raises:
        EpisodeFormatError: a malformed line (``strict``).
    """
    for number, raw, terminated in _raw_lines(source):
        if not raw.strip():
            continue
        if terminated:
            parsed = _parse(number, raw, strict=strict)
        else:
            # Only the last line can lack its newline: a killed writer's partial line
            # is skipped, a complete one (an export without a final newline) is kept.
            try:
                parsed = LINE.validate_json(raw)
            except ValidationError:
                log.warning("line %d: skipped a partial last line (writer stopped)", number)
                parsed = None
        if parsed is not None:
            yield number, parsed


def _parse(number: int, raw: bytes, *, strict: bool) -> AnyLine | None:
    try:
        return LINE.validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'line'}: {err['msg']}"
            for err in exc.errors(include_url=False)[:3]
        )
        if strict:
            raise EpisodeFormatError(problems, line=number) from None
        log.warning("line %d: skipped (%s)", number, problems)
        return None


def _raw_lines(source: Source) -> Iterator[tuple[int, bytes, bool]]:
    """``(number, bytes, ended by a newline)`` for each line of ``source``."""
    if isinstance(source, bytes):
        yield from _numbered(io.BytesIO(_gunzip(source)))
    elif isinstance(source, (str, os.PathLike)):
        path = Path(os.fspath(source))
        with _open(path, "rb") as file:
            yield from _numbered(file)
    elif hasattr(source, "read"):
        yield from _numbered(source)  # type: ignore[arg-type]
    else:
        for number, item in enumerate(source, 1):
            data = item.encode() if isinstance(item, str) else item
            yield number, data.rstrip(b"\r\n"), True


def _numbered(file: IO[bytes]) -> Iterator[tuple[int, bytes, bool]]:
    number = 0
    try:
        for number, raw in enumerate(file, 1):
            ended = raw.endswith(b"\n")
            yield number, raw.rstrip(b"\r\n"), ended
    except (EOFError, gzip.BadGzipFile) as exc:
        log.warning("line %d: the compressed file ends early (%s)", number + 1, exc)


def _open(path: Path, mode: str) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, mode)  # type: ignore[return-value]
    return open(path, mode)  # the writer owns and closes it


def _gunzip(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _repair_tail(path: Path) -> int:
    """Cut a partial last line off ``path``; return the size left.

    Raises:
        ValueError: a ``.gz`` file that does not decompress to whole lines.
    """
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as file:
                data = file.read()
        except (EOFError, gzip.BadGzipFile) as exc:
            raise ValueError(f"cannot append to {path}: its compressed end is damaged") from exc
        if data and not data.endswith(b"\n"):
            raise ValueError(f"cannot append to {path}: it ends with a partial line")
        return len(data)
    with open(path, "r+b") as file:
        size = file.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            start = max(0, end - _TAIL_CHUNK)
            file.seek(start)
            chunk = file.read(end - start)
            if end == size and chunk.endswith(b"\n"):
                return size
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                file.truncate(keep)
                log.warning("%s: removed a partial last line (%d bytes)", path, size - keep)
                return keep
            end = start
        file.truncate(0)
        return 0
