"""The episode file's disk fills up: a real ``ENOSPC`` from a tiny tmpfs, not a patched function.

The write fails with an :class:`~rllm_gym.store.EpisodeStoreError` that says the disk is full, the file keeps only
whole lines (the bytes of the episode that did not fit are rolled back), the engine's run stops, and the same run
resumes once there is space, redoing nothing that was stored.
"""

from __future__ import annotations

import errno
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.envs.base import SingleTurnEnv
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.store import EpisodeStoreError, EpisodeWriter, read_episodes
from rllm_gym.types import Episode, RewardOutput, TerminationReason


@dataclass
class SmallDisk:
    path: Path

    def grow(self) -> None:
        """Remount with 4 MiB, as freeing space would."""
        subprocess.run(["mount", "-o", "remount,size=4m", str(self.path)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 64 KiB tmpfs, unmounted at teardown."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no mount command here to make a small tmpfs")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield SmallDisk(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def assert_whole_lines(path: Path) -> list[str]:
    """Every line ends with a newline and is an Episode; returns the ids in file order."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), "the file ends in a partial line"
    return [Episode.model_validate_json(line).id for line in data.splitlines()]


def reward(task: dict, action: str) -> RewardOutput:
    return RewardOutput(reward=1.0, is_correct=True)


def episode_engine(out: Path) -> AgentExecutionEngine:
    # Long questions make each line a few KiB, so the 64 KiB disk fills after a dozen or so episodes.
    return AgentExecutionEngine(
        env_id=SingleTurnEnv,
        env_args={"reward_fn": reward},
        agent_cls=MathAgent,
        policy=ScriptedPolicy(["The answer is \\boxed{42}."], cycle=True),
        n_parallel=4,
        out=out,
    )


TASKS = [{"id": f"t{i}", "question": f"question {i}: " + "lorem ipsum " * 150} for i in range(60)]


def test_writer_on_a_full_disk_says_so_and_leaves_no_partial_line(small_disk):
    path = small_disk.path / "episodes.jsonl"
    episode = Episode(id="t:0", task={"question": "x" * 3000})
    written = []
    with EpisodeWriter(path, fsync=True) as writer:
        with pytest.raises(EpisodeStoreError, match=re.escape("could not write episode")) as info:
            for i in range(100):
                episode.id = f"t:{i}"
                writer.write(episode)
                written.append(episode.id)
        assert 5 < len(written) < 100
        assert info.value.errno == errno.ENOSPC
        message = str(info.value)
        assert f"could not write episode 't:{len(written)}' to {path}: No space left on device" in message
        assert "left without a partial line (free disk space, then resume)" in message
        assert assert_whole_lines(path) == written

        # Space comes back: the same writer goes on where it stopped.
        small_disk.grow()
        episode.id = f"t:{len(written)}"
        writer.write(episode)
    assert assert_whole_lines(path) == [*written, episode.id]


async def test_engine_run_stops_on_a_full_disk_and_resumes_with_space(small_disk, tmp_path):
    clean = await episode_engine(tmp_path / "clean.jsonl").run(TASKS)
    out = small_disk.path / "episodes.jsonl"
    with pytest.raises(EpisodeStoreError, match=re.escape("No space left on device")) as info:
        await episode_engine(out).run(TASKS)
    assert info.value.errno == errno.ENOSPC
    assert re.search(r"could not write episode 't\d+:0' to .*episodes\.jsonl", str(info.value))
    stored = assert_whole_lines(out)
    assert 0 < len(stored) < len(TASKS)
    before = out.read_bytes()

    small_disk.grow()
    episodes = await episode_engine(out).run(TASKS)
    assert [e.id for e in episodes] == [e.id for e in clean]
    assert all(e.termination_reason is TerminationReason.ENV_DONE and e.is_correct for e in episodes)
    ids = assert_whole_lines(out)
    assert len(ids) == len(set(ids)) == len(TASKS)
    assert out.read_bytes().startswith(before), "the episodes stored before the disk filled were rewritten"
    assert [e.trajectories[0].steps[0].model_response for e in read_episodes(out)] == [
        "The answer is \\boxed{42}."
    ] * len(TASKS)
