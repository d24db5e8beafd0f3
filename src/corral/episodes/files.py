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
from typing import IO, Any, Self, cast

import orjson
from pydantic import ValidationError

from corral.episodes.episode import Episode, EpisodeFormatError, assemble
from corral.episodes.format import EpisodeEnd, Header, StepRecord, dump_line, read_line

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
        follow_symlinks: False refuses a path that is a symbolic link (``OSError``
            ``ELOOP``) instead of writing wherever it points: what a tool that owns a
            directory wants (``corral eval``'s run directory), checked as the file is
            opened, not before.

    Raises:
        ValueError: a new or empty file without a header, or ``append`` to a ``.gz``
            file whose end is damaged.
        OSError: the file cannot be opened (with ``follow_symlinks=False``: it is a link).
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[bytes],
        header: Header | None = None,
        *,
        append: bool = False,
        follow_symlinks: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self._owned = not hasattr(target, "write")
        self.path: Path | None = None
        empty = True
        if self._owned:
            self.path = Path(os.fspath(target))  # type: ignore[arg-type]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            mode = "ab" if append else "wb"
            raw = _open_raw(self.path, mode, follow_symlinks=follow_symlinks)
            try:
                if append:
                    empty = _repair_tail(self.path, raw) == 0
                self._file: IO[bytes] = _decoded(self.path, raw, mode)
            except BaseException:
                raw.close()
                raise
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
        EpisodeFormatError: a malformed line (``strict``), naming its number; a header
            this corral cannot read (a newer format, none named) even when not
            ``strict``; an empty source (no episode file is: it starts with a header).
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
    seen = False
    for number, raw, terminated in _raw_lines(source):
        if not raw.strip():
            continue
        seen = True
        if terminated:
            parsed = _parse(number, raw, strict=strict)
        else:
            # Only the last line can lack its newline: a killed writer's partial line
            # is skipped, a complete one (an export without a final newline) is kept.
            try:
                parsed = read_line(raw)
            except ValueError:  # pydantic's ValidationError included
                log.warning("line %d: skipped a partial last line (writer stopped)", number)
                parsed = None
        if parsed is not None:
            yield number, parsed
    if not seen:
        raise EpisodeFormatError(
            "not an episode file: it is empty (an episode file starts with a header line)"
        )


def _parse(number: int, raw: bytes, *, strict: bool) -> AnyLine | None:
    """One terminated line; a malformed one raises (``strict``) or is skipped, except a
    header: the lines after it cannot be read without it (a newer format, a missing
    one), so a bad header raises either way."""
    try:
        return read_line(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'line'}: {err['msg']}" for err in errors[:3]
        )
        header = any(err["loc"][:1] == ("header",) for err in errors)
    except ValueError as exc:  # a header that does not name its format
        problems, header = str(exc), True
    if strict or header:
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


_FLAGS = {
    "rb": os.O_RDONLY,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    # Read and write: an append first reads the file's end to cut a partial line off;
    # O_APPEND sends every write to the end whatever the read position.
    "ab": os.O_RDWR | os.O_CREAT | os.O_APPEND,
}
_FD_MODES = {"rb": "rb", "wb": "wb", "ab": "r+b"}


def _open_raw(path: Path, mode: str, *, follow_symlinks: bool = True) -> IO[bytes]:
    """``path``'s bytes as stored (``rb``, ``wb`` or ``ab``); the caller closes it.

    One ``open`` decides what the file is: with ``follow_symlinks=False`` a link is
    refused by that very call (``O_NOFOLLOW``), so nothing can swap the path between a
    check and the write.
    """
    flags = _FLAGS[mode] | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    return os.fdopen(os.open(path, flags, 0o666), _FD_MODES[mode])


def _decoded(path: Path, raw: IO[bytes], mode: str) -> IO[bytes]:
    """``raw`` as lines are read and written: gzip-compressed for ``.gz`` files."""
    if path.suffix != ".gz":
        return raw
    return cast(IO[bytes], _GzipFile(raw, mode))


class _GzipFile(gzip.GzipFile):
    """A gzip stream over ``raw`` that closes ``raw`` too (``GzipFile`` leaves a file
    object it was given open)."""

    def __init__(self, raw: IO[bytes], mode: str) -> None:
        super().__init__(mode=mode, fileobj=raw)
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def _open(path: Path, mode: str) -> IO[bytes]:
    """``path`` opened for reading lines (``rb``); the caller closes it."""
    raw = _open_raw(path, mode)
    try:
        return _decoded(path, raw, mode)
    except BaseException:
        raw.close()
        raise


def _gunzip(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _repair_tail(path: Path, file: IO[bytes]) -> int:
    """Cut a partial last line off ``path`` (open as ``file``, read-write); return the
    size left (of its decompressed lines for ``.gz``).

    Raises:
        ValueError: a ``.gz`` file that does not decompress to whole lines.
    """
    if path.suffix == ".gz":
        file.seek(0)
        try:
            with gzip.GzipFile(fileobj=file, mode="rb") as unzipped:  # leaves ``file`` open
                data = unzipped.read()
        except (EOFError, gzip.BadGzipFile) as exc:
            raise ValueError(f"cannot append to {path}: its compressed end is damaged") from exc
        if data and not data.endswith(b"\n"):
            raise ValueError(f"cannot append to {path}: it ends with a partial line")
        return len(data)
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
