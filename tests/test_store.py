import errno
import json
import os
import re

import pytest

from rllm_gym.store import (
    CorruptEpisodeFileError,
    EpisodeStoreError,
    EpisodeWriter,
    ReadReport,
    completed_ids,
    read_episodes,
)
from rllm_gym.types import Episode, Step, Trajectory


def make_episode(task: str, idx: int) -> Episode:
    return Episode(id=f"{task}:{idx}", is_correct=idx % 2 == 0, trajectories=[Trajectory(steps=[Step(reward=idx)])])


def test_write_then_stream_back(tmp_path):
    path = tmp_path / "run" / "episodes.jsonl"
    episodes = [make_episode("task:a", i) for i in range(5)]
    with EpisodeWriter(path) as writer:
        for i, episode in enumerate(episodes):
            writer.write(episode)
            # each episode is on disk, whole, as soon as write returns
            assert path.read_bytes().count(b"\n") == i + 1
    assert list(read_episodes(path)) == episodes
    assert completed_ids(path) == {f"task:a:{i}" for i in range(5)}
    assert completed_ids(tmp_path / "missing.jsonl") == set()


def test_truncated_last_line_is_skipped_reported_and_cut_before_resume(tmp_path):
    path = tmp_path / "episodes.jsonl"
    with EpisodeWriter(path) as writer:
        writer.write(make_episode("t", 0))
        writer.write(make_episode("t", 1))
    whole = path.read_bytes()
    path.write_bytes(whole + make_episode("t", 2).to_json().encode()[:40])  # a crash mid-write
    report = ReadReport()
    assert [e.id for e in read_episodes(path, report)] == ["t:0", "t:1"]
    assert report.truncated_tail and report.truncated_line == 3 and report.episodes == 2
    assert completed_ids(path) == {"t:0", "t:1"}
    with EpisodeWriter(path) as writer:  # resume: the partial line goes, new lines stay whole
        writer.write(make_episode("t", 2))
    assert [e.id for e in read_episodes(path)] == ["t:0", "t:1", "t:2"]


def test_whole_last_episode_missing_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(make_episode("t", 0).to_json())
    assert completed_ids(path) == {"t:0"}
    with EpisodeWriter(path) as writer:
        writer.write(make_episode("t", 1))
    assert [e.id for e in read_episodes(path)] == ["t:0", "t:1"]


def test_corrupt_middle_line_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "episodes.jsonl"
    lines = [make_episode("t", 0).to_json(), json.dumps({"id": "t:1", "bogus": 1}), make_episode("t", 2).to_json()]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptEpisodeFileError, match=re.escape(f"{path}:2 is not a valid Episode")):
        list(read_episodes(path))


def test_failed_write_leaves_no_partial_line(tmp_path, monkeypatch):
    path = tmp_path / "episodes.jsonl"
    writer = EpisodeWriter(path)
    writer.write(make_episode("t", 0))
    real_fsync = os.fsync

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(EpisodeStoreError, match=re.escape("could not write episode 't:1'")) as excinfo:
        writer.write(make_episode("t", 1))
    assert excinfo.value.errno == errno.ENOSPC
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert [e.id for e in read_episodes(path)] == ["t:0"]
    writer.write(make_episode("t", 2))
    writer.close()
    assert [e.id for e in read_episodes(path)] == ["t:0", "t:2"]


def test_write_rejects_non_episodes(tmp_path):
    with EpisodeWriter(tmp_path / "e.jsonl") as writer, pytest.raises(TypeError, match="takes an Episode, got dict"):
        writer.write({"id": "t:0"})
