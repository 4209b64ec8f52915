import subprocess
import sys

import numpy as np
import pytest

from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.batch import (
    PaddingFacts,
    RowCounts,
    Staleness,
    build_training_batch,
    episode_metrics,
    row_counts,
    training_view,
)
from rllm_gym.train.sequences import placeholder_sequence, trajectory_to_sequences
from rllm_gym.types import Episode, ModelOutput, Step, TerminationReason, Trajectory

PAD = 0


def step(prompt: list[int], reply: list[int], reward: float = 0.0, version: int = 0, observation: str = "s") -> Step:
    output = ModelOutput(prompt_ids=prompt, completion_ids=reply, policy_version=version)
    logprobs = [-0.5] * len(reply)
    return Step(
        prompt_ids=prompt,
        response_ids=reply,
        logprobs=logprobs,
        reward=reward,
        mc_return=reward,
        model_output=output,
        observation=observation,
    )


def episode(task: str, k: int, reward: float, steps: list[Step], reason=TerminationReason.ENV_DONE) -> Episode:
    trajectory = Trajectory(name="solver", steps=steps, reward=reward)
    return Episode(
        id=f"{task}:{k}",
        trajectories=[trajectory],
        termination_reason=reason,
        is_correct=reward > 0,
        metadata={"env": "rllm/Test-v0"},
    )


def build(episodes: list[Episode], config: AdvantageConfig, padding: PaddingFacts | None = None, extra_rows: int = 0):
    """One process's batch of ``episodes`` (every episode a prompt slot), as the trainer builds it."""
    rows = [r for i, e in enumerate(episodes) for r in trajectory_to_sequences(e.trajectories[0], PAD, i)]
    rows += [placeholder_sequence(PAD) for _ in range(extra_rows)]
    local = [training_view(e, 0) for e in episodes]
    rewards = [e.trajectories[0].reward for e in episodes]
    counts = [row_counts(rows, episodes)]
    padding = padding or PaddingFacts(PAD)
    return build_training_batch(rows, local, local, config, padding, rewards=rewards, counts=counts, seconds=2.0)


def two_turn_group() -> list[Episode]:
    # Task "a": two episodes, rewards 1 and 0; each two turns in one row (the second prompt extends the first).
    win = [step([5, 6], [7, 8], version=0), step([5, 6, 7, 8, 9], [10], reward=1.0, version=0, observation="t")]
    lose = [step([5, 6], [7], version=0), step([5, 6, 7, 9, 9], [11, 12], version=0, observation="t")]
    return [episode("a", 0, 1.0, win), episode("a", 1, 0.0, lose)]


def test_rows_are_padded_as_trl_pads_them_with_masks_and_behaviour_logprobs():
    batch = build(two_turn_group(), AdvantageConfig(), extra_rows=1)
    assert batch.prompt_ids.tolist() == [[5, 6], [5, 6], [PAD, PAD]]  # the padding row's one token is PAD too
    assert batch.prompt_mask.tolist() == [[1, 1], [1, 1], [0, 1]]
    # row 0: reply [7, 8], the env's [9], reply [10]; row 1: reply [7], the env's [9, 9], reply [11, 12]
    assert batch.completion_ids.tolist() == [[7, 8, 9, 10, 0], [7, 9, 9, 11, 12], [0, 0, 0, 0, 0]]
    assert batch.completion_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert batch.env_mask.tolist() == [[1, 1, 0, 1, 0], [1, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    assert batch.behaviour_logprobs[0].tolist() == [-0.5, -0.5, 0.0, -0.5, 0.0]
    assert batch.task_ids == ["a", "a", None]
    assert batch.group_keys == [("a", "solver"), ("a", "solver"), None]
    assert batch.rewards == [1.0, 0.0, 0.0]
    assert batch.trl_output()["env_mask"] == [r.env_mask for r in batch.rows]


def test_padding_rounds_widths_up_to_the_multiple():
    batch = build(two_turn_group(), AdvantageConfig(), padding=PaddingFacts(3, pad_to_multiple_of=4))
    assert batch.prompt_ids.tolist() == [[3, 3, 5, 6], [3, 3, 5, 6]]
    assert batch.completion_ids.shape == (2, 8) and batch.advantages.shape == (2, 8)
    assert batch.completion_ids[0, 4:].tolist() == [3, 3, 3, 3]


def test_grpo_advantages_land_on_the_reply_tokens_only():
    batch = build(two_turn_group(), AdvantageConfig(estimator="grpo", mode="broadcast"))
    high = 0.5 / (np.sqrt(0.5) + 1e-6)  # (1 - mean 0.5) / (sample std 0.7071 + eps)
    assert batch.row_advantages.tolist() == pytest.approx([high, -high], rel=1e-6)
    assert batch.loss_advantages is batch.row_advantages
    assert batch.advantages[0].tolist() == pytest.approx([high, high, 0, high, 0], rel=1e-6)
    assert batch.loss_mask.tolist() == batch.env_mask.tolist()
    assert batch.advantages.dtype == np.float32 and batch.loss_mask.dtype == np.int64


def test_per_step_mode_trains_per_token_advantages_and_each_step_its_own():
    batch = build(two_turn_group(), AdvantageConfig(estimator="drgrpo", mode="per_step"))
    # step 0: both mc_return 0 -> 0; step 1: returns 1 and 0 -> +0.5 / -0.5
    assert batch.advantages.tolist() == [[0, 0, 0, 0.5, 0], [0, 0, 0, -0.5, -0.5]]
    assert batch.loss_advantages is batch.advantages


def test_excluded_episodes_and_padding_rows_train_nothing():
    episodes = two_turn_group()
    episodes.append(episode("a", 2, 0.0, [step([5], [7])], reason=TerminationReason.ERROR))
    batch = build(episodes, AdvantageConfig(exclude_termination=("error",)), extra_rows=2)
    assert batch.loss_mask[2].sum() == 0 and batch.env_mask[2].sum() == 1  # sampled, but masked
    assert batch.loss_mask[3:].sum() == 0 and batch.row_advantages[3:].tolist() == [0, 0]
    assert batch.metrics["trajectories/masked"] == 1.0
    assert batch.metrics["rollout/padding_rows"] == pytest.approx(2 / 5)
    assert batch.metrics["rollout/termination/error"] == pytest.approx(1 / 3)


def test_a_split_trajectory_keeps_its_step_advantages_in_each_row():
    # The second prompt does not extend the first row: two rows, the second starting at step 1.
    steps = [step([5, 6], [7]), step([1, 2, 3], [8, 9], reward=1.0, observation="t")]
    other = [step([5, 6], [7]), step([5, 6, 7, 4], [9], observation="t")]
    episodes = [episode("b", 0, 1.0, steps), episode("b", 1, 0.0, other)]
    batch = build(episodes, AdvantageConfig(estimator="drgrpo", mode="per_step"))
    assert [(r.source, r.first_step) for r in batch.rows] == [(0, 0), (0, 1), (1, 0)]
    assert batch.advantages[1, :2].tolist() == [0.5, 0.5]
    assert batch.row_advantages.tolist() == [0.0, 0.5, 0.0]
    assert batch.metrics["rollout/prefix_mismatch"] == 0.5
    assert batch.metrics["rollout/rows_per_trajectory"] == 1.5


def test_each_row_records_the_oldest_policy_version_that_sampled_it():
    steps = [step([5, 6], [7], version=3), step([5, 6, 7, 9], [8], version=2)]
    batch = build([episode("c", 0, 1.0, steps), episode("c", 1, 0.0, [step([5], [7], version=4)])], AdvantageConfig())
    assert batch.policy_versions.tolist() == [2, 4]
    assert ModelOutput().policy_version == 0  # the synchronous trainer's


def test_a_row_sampled_more_than_max_staleness_versions_ago_is_dropped_and_counted():
    # Trained at version 5 with max_staleness 2: a row whose oldest reply is version 2 is 3 behind (dropped), one of
    # version 3 is exactly 2 behind (trained); the multi-turn row keeps its oldest step's version.
    stale = episode("d", 0, 1.0, [step([5, 6], [7], version=2), step([5, 6, 7, 9], [8], version=4)])
    fresh = episode("d", 1, 0.0, [step([5], [7, 8], version=3)])
    rows = [r for i, e in enumerate([stale, fresh]) for r in trajectory_to_sequences(e.trajectories[0], PAD, i)]
    rows.append(placeholder_sequence(PAD))
    local = [training_view(e, 0) for e in (stale, fresh)]
    batch = build_training_batch(
        rows, local, local, AdvantageConfig(), PaddingFacts(PAD), rewards=[1.0, 0.0], staleness=Staleness(5, 2)
    )
    assert batch.loss_mask[0].sum() == 0 and batch.env_mask[0].sum() == 2  # dropped: sampled, not trained
    assert batch.loss_mask[1].tolist()[:2] == [1, 1]
    assert batch.metrics["async/dropped_rows"] == 0.5  # of the two trained rows (padding is not counted)
    assert batch.metrics["async/staleness_max"] == 3 and batch.metrics["async/staleness_mean"] == 2.5
    synchronous = build([stale, fresh], AdvantageConfig())
    assert not any(name.startswith("async/") for name in synchronous.metrics)  # K = 0 logs what it logged before


def test_metrics_sum_every_processes_counts():
    episodes = two_turn_group()
    batch = build(episodes, AdvantageConfig())
    rows = batch.rows
    other = RowCounts(split_trajectories=0, trained_rows=2, rows=4, model_tokens=10, text_rendered=1, calls=4)
    both = build_training_batch(
        rows,
        [training_view(e, 0) for e in episodes],
        [training_view(e, 0) for e in episodes * 2],
        AdvantageConfig(),
        PaddingFacts(PAD),
        rewards=[1.0, 0.0],
        counts=[row_counts(rows, episodes), other],
        seconds=2.0,
        backend_metrics={"vllm/rounds": 3.0},
    )
    assert both.metrics["rollout/padding_rows"] == pytest.approx(2 / 6)
    assert both.metrics["rollout/model_tokens_per_s"] == pytest.approx((6 + 10) / 2.0)
    assert both.metrics["rollout/text_rendered"] == pytest.approx(1 / 8)
    assert both.metrics["vllm/rounds"] == 3.0
    assert both.metrics["groups/total"] == 1.0 and both.metrics["trajectories/total"] == 4.0


def test_episode_metrics_by_role_env_and_termination():
    metrics = episode_metrics(two_turn_group())
    assert metrics["rollout/pass_rate"] == 0.5
    assert metrics["rollout/turns"] == 2.0
    assert metrics["train/reward/role/solver"] == 0.5
    assert metrics["train/reward/env/rllm/Test-v0"] == 0.5
    assert metrics["rollout/termination/env_done"] == 1.0


def test_the_batch_module_imports_neither_trl_nor_transformers():
    code = "import sys, rllm_gym.train.batch; print(sorted(m for m in ('trl', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
