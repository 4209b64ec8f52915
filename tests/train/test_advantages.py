import math
import re

import pytest

from rllm_gym.train.advantages import AdvantageConfig, compute_advantages, group_advantages
from rllm_gym.types import Episode, Step, TerminationReason, Trajectory


def traj(reward, name="agent", steps=1, returns=None):
    returns = returns or [reward] * steps
    return Trajectory(name=name, reward=reward, steps=[Step(mc_return=r) for r in returns])


def episode(task, idx, *trajectories, reason=TerminationReason.ENV_DONE):
    return Episode(id=f"{task}:{idx}", termination_reason=reason, trajectories=list(trajectories))


def test_group_estimators_by_hand():
    rewards = [1.0, 0.0, 0.0, 1.0]
    # mean 0.5, sample std sqrt(1/3)
    expected = [0.5 / math.sqrt(1 / 3), -0.5 / math.sqrt(1 / 3), -0.5 / math.sqrt(1 / 3), 0.5 / math.sqrt(1 / 3)]
    assert group_advantages(rewards, "grpo", eps=1e-12) == pytest.approx(expected)
    assert group_advantages(rewards, "grpo", norm_by_std=False) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages(rewards, "drgrpo") == [0.5, -0.5, -0.5, 0.5]
    # leave-one-out: 1 - (1/3), 0 - (2/3)
    assert group_advantages(rewards, "rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert group_advantages(rewards, "reinforce", baseline=0.25) == [0.75, -0.25, -0.25, 0.75]
    assert group_advantages([3.0], "grpo") == [0.0] and group_advantages([3.0], "rloo") == [0.0]
    with pytest.raises(ValueError, match=re.escape("the reinforce estimator needs baseline=")):
        group_advantages(rewards, "reinforce")


def test_multi_turn_broadcast_gives_every_step_the_trajectory_advantage():
    episodes = [episode("t", 0, traj(1.0, steps=3)), episode("t", 1, traj(0.0, steps=2))]
    result = compute_advantages(episodes, AdvantageConfig(estimator="drgrpo"))
    first, second = (result.by_uid[e.trajectories[0].uid] for e in episodes)
    assert first.advantages == [0.5, 0.5, 0.5] and first.mask == [True] * 3  # earlier steps are not zero
    assert second.advantages == [-0.5, -0.5]
    assert [s.advantage for s in episodes[0].trajectories[0].steps] == [0.5, 0.5, 0.5]


def test_per_step_groups_by_step_index_on_returns():
    episodes = [
        episode("t", 0, traj(1.0, steps=2, returns=[0.9, 1.0])),
        episode("t", 1, traj(0.0, steps=3, returns=[0.1, 0.0, 0.0])),
    ]
    result = compute_advantages(episodes, AdvantageConfig(estimator="drgrpo", mode="per_step"))
    a, b = (result.by_uid[e.trajectories[0].uid] for e in episodes)
    assert a.advantages == pytest.approx([0.4, 0.5])
    assert b.advantages == pytest.approx([-0.4, -0.5, 0.0])  # step 2 is alone in its group
    assert result.metrics["groups/total"] == 3


def test_solver_and_judge_are_compared_only_with_their_own_role():
    episodes = [
        episode("q", 0, traj(1.0, "solver"), traj(0.0, "solver"), traj(1.0, "judge")),
        episode("q", 1, traj(1.0, "solver"), traj(1.0, "solver"), traj(0.0, "judge")),
    ]
    result = compute_advantages(episodes, AdvantageConfig(estimator="drgrpo"))
    solver_advantages = [result.by_uid[t.uid].advantages[0] for e in episodes for t in e.trajectories[:2]]
    judge_advantages = [result.by_uid[e.trajectories[2].uid].advantages[0] for e in episodes]
    assert solver_advantages == [0.25, -0.75, 0.25, 0.25]  # solver mean 0.75 over 4 solver trajectories
    assert judge_advantages == [0.5, -0.5]  # judge mean 0.5 over 2 judge trajectories
    assert result.metrics["groups/total"] == 2


def test_reinforce_uses_a_batch_baseline_per_role():
    episodes = [episode("a", 0, traj(1.0)), episode("b", 0, traj(0.0)), episode("b", 1, traj(0.5))]
    result = compute_advantages(episodes, AdvantageConfig(estimator="reinforce"))
    assert [result.by_uid[e.trajectories[0].uid].advantages[0] for e in episodes] == pytest.approx([0.5, -0.5, 0.0])


def test_uniform_groups_are_dropped_and_counted():
    episodes = [episode("same", i, traj(1.0)) for i in range(3)] + [
        episode("mixed", i, traj(float(i))) for i in range(2)
    ]
    result = compute_advantages(episodes, AdvantageConfig(drop_uniform_groups=True))
    assert result.metrics["groups/dropped_uniform"] == 1
    assert all(not result.by_uid[e.trajectories[0].uid].mask[0] for e in episodes[:3])
    assert all(result.by_uid[e.trajectories[0].uid].mask[0] for e in episodes[3:])


def test_excluded_terminations_are_masked_and_left_out_of_the_statistics():
    kept = [episode("t", 0, traj(1.0)), episode("t", 1, traj(0.0))]
    truncated = episode("t", 2, traj(5.0), reason=TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED)
    config = AdvantageConfig(estimator="drgrpo", exclude_termination=("max_response_length_exceeded",))
    result = compute_advantages([*kept, truncated], config)
    assert [result.by_uid[e.trajectories[0].uid].advantages[0] for e in kept] == [0.5, -0.5]  # mean 0.5, not 2.0
    masked = result.by_uid[truncated.trajectories[0].uid]
    assert masked.advantages == [0.0] and masked.mask == [False]
    assert result.metrics["trajectories/masked"] == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"estimator": "ppo"}, "estimator must be one of ['grpo', 'drgrpo', 'rloo', 'reinforce'], got 'ppo'"),
        ({"mode": "each"}, "mode must be one of ['broadcast', 'per_step', 'state'], got 'each'"),
        ({"exclude_termination": ("crashed",)}, "exclude_termination has unknown reasons ['crashed']"),
    ],
)
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AdvantageConfig(**kwargs)


def visited(reward, states, returns):
    """A trajectory through the observations ``states`` with the discounted returns ``returns``."""
    steps = [Step(observation=state, mc_return=value) for state, value in zip(states, returns, strict=True)]
    return Trajectory(reward=reward, steps=steps)


def test_state_mode_adds_a_step_advantage_among_steps_from_the_same_observation():
    # Three rollouts of one task from state "a": two reach the goal (via "b", one after a detour through "b" twice),
    # one walks into a hole from "a" at once. Returns discounted by 0.9.
    direct = visited(1.0, ["a", "b"], [0.9, 1.0])
    hole = visited(0.0, ["a"], [0.0])
    detour = visited(1.0, ["a", "b", "b"], [0.81, 0.9, 1.0])
    episodes = [episode("t", i, trajectory) for i, trajectory in enumerate([direct, hole, detour])]
    result = compute_advantages(episodes, AdvantageConfig(estimator="drgrpo", mode="state"))
    episode_level = {1.0: 1 / 3, 0.0: -2 / 3}  # rewards 1, 0, 1: mean 2/3
    mean_a = (0.9 + 0.0 + 0.81) / 3
    mean_b = (1.0 + 0.9 + 1.0) / 3
    assert result.by_uid[direct.uid].advantages == pytest.approx(
        [episode_level[1.0] + 0.9 - mean_a, episode_level[1.0] + 1.0 - mean_b]
    )
    assert result.by_uid[hole.uid].advantages == pytest.approx([episode_level[0.0] + 0.0 - mean_a])
    assert result.by_uid[detour.uid].advantages == pytest.approx(
        [episode_level[1.0] + 0.81 - mean_a, episode_level[1.0] + 0.9 - mean_b, episode_level[1.0] + 1.0 - mean_b]
    )
    assert result.metrics["groups/anchored_steps"] == 6.0
    # The step into the hole is told apart from the moves that reached the goal taken from the same state.
    assert result.by_uid[hole.uid].advantages[0] < min(result.by_uid[direct.uid].advantages)


def test_state_mode_leaves_states_met_once_and_other_tasks_alone():
    one = visited(1.0, ["a", "b"], [0.9, 1.0])
    other_task = visited(0.0, ["a", "c"], [0.0, 0.0])
    episodes = [episode("t", 0, one), episode("u", 0, other_task)]
    result = compute_advantages(episodes, AdvantageConfig(mode="state"))
    # Each task is a group of one trajectory: no episode-level signal, and no state is shared within a task.
    assert result.by_uid[one.uid].advantages == [0.0, 0.0]
    assert result.by_uid[other_task.uid].advantages == [0.0, 0.0]
    assert result.metrics["groups/anchored_steps"] == 0.0


def test_state_mode_leaves_dropped_and_excluded_trajectories_untrained():
    a = visited(1.0, ["a", "b"], [0.9, 1.0])
    b = visited(1.0, ["a", "b"], [0.9, 1.0])
    timed_out = visited(0.0, ["a"], [0.0])
    episodes = [
        episode("t", 0, a),
        episode("t", 1, b),
        episode("t", 2, timed_out, reason=TerminationReason.MAX_TURNS_EXCEEDED),
    ]
    config = AdvantageConfig(mode="state", drop_uniform_groups=True, exclude_termination=("max_turns_exceeded",))
    result = compute_advantages(episodes, config)
    for trajectory in (a, b, timed_out):
        entry = result.by_uid[trajectory.uid]
        assert entry.mask == [False] * len(trajectory.steps) and entry.advantages == [0.0] * len(trajectory.steps)


@pytest.mark.parametrize("reason", [TerminationReason.INFRA_FAILED, TerminationReason.ERROR])
def test_infra_failed_and_errored_episodes_are_left_out_by_default(reason):
    """A reward the infrastructure gave (sandbox or grader failed), or the 0 of an episode an exception ended (a
    policy server unreachable), is no training sample: masked unless asked."""
    kept = [episode("t", 0, traj(1.0)), episode("t", 1, traj(0.0))]
    failed = episode("t", 2, traj(0.0), reason=reason)
    result = compute_advantages([*kept, failed], AdvantageConfig(estimator="drgrpo"))
    assert [result.by_uid[e.trajectories[0].uid].advantages[0] for e in kept] == [0.5, -0.5]
    assert result.by_uid[failed.trajectories[0].uid].mask == [False]
    kept_anyway = compute_advantages([*kept, failed], AdvantageConfig(estimator="drgrpo", exclude_termination=()))
    assert kept_anyway.by_uid[failed.trajectories[0].uid].mask == [True]
