"""The episode store: Episodes in a JSONL file, written one line per finished episode and read back streaming.

Nothing finished is lost on a crash. Each episode is appended as one line and flushed (and, by default, fsynced)
before :meth:`EpisodeWriter.write` returns; a write that fails half-way (disk full) is rolled back so no partial line
is left. A crash *during* a write can still leave a truncated last line: :func:`read_episodes` skips it and reports
it, and :class:`EpisodeWriter` cuts it off before appending, so a run resumes with :func:`completed_ids` telling which
``{task_id}:{rollout_idx}`` are already done.

    >>> with EpisodeWriter("episodes.jsonl") as writer:          # doctest: +SKIP
    ...     writer.write(episode)
    >>> done = completed_ids("episodes.jsonl")                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from pydantic import ValidationError

from rllm_gym.types import Episode

__all__ = [
    "CorruptEpisodeFileError",
    "EpisodeStoreError",
    "EpisodeWriter",
    "ReadReport",
    "completed_ids",
    "read_episodes",
]

logger = logging.getLogger(__name__)


class EpisodeStoreError(OSError):
    """Writing an episode failed (disk full, file gone, ...); the file was left without a partial line."""


class CorruptEpisodeFileError(ValueError):
    """A line other than the last one is not a valid Episode: the file was edited or mixed up, not just cut short."""


@dataclass
class ReadReport:
    """What :func:`read_episodes` saw: how many episodes it read and whether it skipped a truncated last line."""

    episodes: int = 0
    truncated_tail: bool = False
    truncated_line: int | None = None
    truncated_error: str | None = None
    skipped: list[int] = field(default_factory=list)


def _valid_end(path: Path) -> int:
    """Byte offset just past the last complete line (a line that ends with a newline)."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size == 0:
            return 0
        position = size
        block = 1 << 16
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            chunk = handle.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline != -1:
                return start + newline + 1
            position = start
        return 0


def _is_episode(line: bytes) -> bool:
    try:
        Episode.model_validate_json(line)
    except (ValidationError, ValueError):
        return False
    return True


def read_episodes(path: str | os.PathLike[str], report: ReadReport | None = None) -> Iterator[Episode]:
    """Yield the Episodes of a JSONL file one at a time, without loading the whole file.

    A truncated or unparsable *last* line (what a crash mid-write leaves) is skipped with a warning and recorded in
    ``report``; an invalid line anywhere else raises :class:`CorruptEpisodeFileError` naming the line.
    """
    report = report if report is not None else ReadReport()
    path = Path(path)
    with open(path, "rb") as handle:
        line_number, line = 0, handle.readline()
        while line:
            next_line = handle.readline()
            line_number += 1
            is_last = not next_line
            if line.strip():
                try:
                    episode = Episode.model_validate_json(line)
                except (ValidationError, ValueError) as error:
                    if is_last and not line.endswith(b"\n"):
                        report.truncated_tail, report.truncated_line = True, line_number
                        report.truncated_error = str(error).splitlines()[0]
                        report.skipped.append(line_number)
                        logger.warning("%s: skipped a truncated last line (%d): %s", path, line_number, error)
                        return
                    first_line = str(error).splitlines()[0]
                    raise CorruptEpisodeFileError(
                        f"{path}:{line_number} is not a valid Episode ({first_line}); only a truncated last line "
                        "is skipped automatically: fix or remove this line"
                    ) from error
                report.episodes += 1
                yield episode
            line = next_line


def completed_ids(path: str | os.PathLike[str]) -> set[str]:
    """The ``{task_id}:{rollout_idx}`` ids of every complete episode in ``path`` (empty if the file does not exist)."""
    if not Path(path).exists():
        return set()
    return {episode.id for episode in read_episodes(path)}


class EpisodeWriter:
    """Append Episodes to a JSONL file, one flushed line per episode.

    Opening an existing file cuts off a truncated last line left by a crash, so appended lines stay whole. With
    ``fsync=True`` (the default) every line reaches the disk before :meth:`write` returns.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise TypeError(f"EpisodeWriter path must be a file path (str or Path), got {path!r}")
        if Path(path).is_dir():
            raise IsADirectoryError(
                f"EpisodeWriter path {str(path)!r} is a folder: pass a file such as 'episodes.jsonl'"
            )
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tail_is_episode = False
        if self.path.exists():
            end = _valid_end(self.path)
            if end != self.path.stat().st_size:
                with open(self.path, "rb") as handle:
                    handle.seek(end)
                    tail_is_episode = _is_episode(handle.read())
                if not tail_is_episode:
                    logger.warning("%s: removing a truncated last line before appending", self.path)
                    os.truncate(self.path, end)
        self._handle = open(self.path, "ab")  # noqa: SIM115 - closed in close()/__exit__
        if tail_is_episode:  # a whole episode that lost only its newline: keep it, end its line
            self._handle.write(b"\n")
            self._handle.flush()
        self.written = 0

    def write(self, episode: Episode) -> None:
        if not isinstance(episode, Episode):
            raise TypeError(f"EpisodeWriter.write takes an Episode, got {type(episode).__name__}")
        line = episode.model_dump_json().encode() + b"\n"
        start = self._handle.tell()
        try:
            self._handle.write(line)
            self._handle.flush()
            if self.fsync:
                os.fsync(self._handle.fileno())
        except OSError as error:
            self._rollback(start)
            raise EpisodeStoreError(
                error.errno,
                f"could not write episode {episode.id!r} to {self.path}: {error.strerror or error}; "
                "the file was left without a partial line (free disk space, then resume)",
            ) from error
        self.written += 1

    def _rollback(self, start: int) -> None:
        # The buffered bytes may fail to flush again on close: truncating below removes whatever did land.
        with contextlib.suppress(OSError):
            self._handle.close()
        os.truncate(self.path, start)
        self._handle = open(self.path, "ab")  # noqa: SIM115

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
