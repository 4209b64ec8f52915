"""Episode seeds are values derived from the run's seed, the task and the rollout, in eval and in training."""

import asyncio
import re
from types import SimpleNamespace

import gymnasium as gym
import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.engine import AgentExecutionEngine, EpisodeSpec, episode_seed, episode_specs, run_multi_agent_episode
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.spaces import TextSpace

RESETS: list[tuple[str, int | None]] = []  # (task id, seed) of every reset of SeedRecorder


class SeedRecorder(gym.Env):
    """One step; records the seed of every reset."""

    metadata = {"render_modes": []}
    observation_space = TextSpace(max_length=100)
    action_space = TextSpace(max_length=100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        task = (options or {}).get("task")
        RESETS.append((task["id"] if isinstance(task, dict) else f"seed-{seed}", seed))
        return "question", {}

    def step(self, action):
        return "", 0.0, True, False, {}


gym.register(id="test/SeedRecorder-v0", entry_point=SeedRecorder)
TASKS = [{"id": "a"}, {"id": "b"}, 7]


def eval_resets(seed, n_rollouts=3):
    RESETS.clear()
    engine = AgentExecutionEngine(
        env_id=SeedRecorder, agent_cls=MathAgent, policy=ScriptedPolicy(["x"], cycle=True), max_turns=1, seed=seed
    )
    episodes = asyncio.run(engine.run(TASKS, n_rollouts=n_rollouts))
    assert len(episodes) == len(TASKS) * n_rollouts
    return sorted(RESETS, key=str)


def test_episode_seed_is_deterministic_and_keeps_inputs_apart():
    assert episode_seed(0, "a", 1) == episode_seed(0, "a", 1)
    seeds = {episode_seed(s, t, r) for s in range(3) for t in ("a", "b") for r in range(3)}
    assert len(seeds) == 18  # seed + rollout made (run 0, rollout 1) and (run 1, rollout 0) the same
    assert episode_seed(0, "7", 0) != episode_seed(0, 7, 0)
    assert episode_seed(0, "a", (1, 0, 2)) != episode_seed(0, "a", (1, 0, 3))
    assert all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ValueError, match=re.escape("seed must be an int >= 0 (the run's seed) or None")):
        episode_seed(-1, "a", 0)
    with pytest.raises(ValueError, match=re.escape("rollout must be an int >= 0 or a non-empty tuple")):
        episode_seed(0, "a", ())


def test_episode_specs_carry_the_seed_as_a_value():
    specs = episode_specs([{"id": "a"}, 5], n_rollouts=2, seed=3)
    assert [spec.id for spec in specs] == ["a:0", "a:1", "seed-5:0", "seed-5:1"]
    assert specs[0] == EpisodeSpec({"id": "a"}, "a:0", episode_seed(3, "a", 0))
    assert specs[2].seed == specs[3].seed == 5  # an int task is the reset seed: the group resets alike
    assert [spec.seed for spec in episode_specs([{"id": "a"}], seed=None)] == [None]  # unseeded, asked for


def test_eval_resets_are_the_same_for_the_same_seed_and_differ_between_rollouts_and_seeds():
    first = eval_resets(seed=11)
    assert first == eval_resets(seed=11)
    task_seeds = [seed for task, seed in first if task == "a"]
    assert None not in task_seeds and len(set(task_seeds)) == 3  # each rollout its own seed
    assert sorted(task_seeds) == sorted(episode_seed(11, "a", r) for r in range(3))
    assert [seed for task, seed in first if task == "seed-7"] == [7, 7, 7]
    other = eval_resets(seed=12)
    assert {seed for task, seed in other if task == "a"}.isdisjoint(task_seeds)


def test_pairs_without_a_seed_get_one_from_the_engine_seed_not_none():
    # The trainer's ids (``...:p0s1e5``) end in no rollout number: the old engine parsed none and reset with None.
    RESETS.clear()
    engine = AgentExecutionEngine(
        env_id=SeedRecorder, agent_cls=MathAgent, policy=ScriptedPolicy(["x"], cycle=True), max_turns=1
    )
    asyncio.run(engine.run_pairs([({"id": "a"}, "a:p0s1e5"), ({"id": "a"}, "a:p0s1e6")]))
    seeds = [seed for _, seed in RESETS]
    assert None not in seeds and len(set(seeds)) == 2
    asyncio.run(engine.run_pairs([EpisodeSpec({"id": "a"}, "a:x", 99)]))
    assert RESETS[-1] == ("a", 99)


def test_a_workflow_seed_argument_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=re.escape("seed is the engine's, not a workflow argument")):
        from rllm_gym.engine import AgentWorkflowEngine, MultiTurnWorkflow

        AgentWorkflowEngine(MultiTurnWorkflow, ScriptedPolicy(["x"], cycle=True), workflow_args={"seed": 1})


def test_a_multi_agent_episode_outside_the_engine_resets_with_the_derived_seed():
    from rllm_gym.agents.solver_judge import SolverJudgeWorkflow

    seen = []

    class Recorded(SolverJudgeWorkflow):
        async def run(self, task, uid):
            seen.append(self.episode_seed)
            return await super().run(task, uid)

    task = {"id": "t", "question": "1+1?", "ground_truth": "2"}
    policy = ScriptedPolicy(lambda messages: "<verdict>1</verdict>" if "verdict" in messages[-1]["content"] else "2")
    asyncio.run(
        run_multi_agent_episode("rllm/SolverJudge-v0", policy, task, rollout_idx=2, seed=5, workflow_cls=Recorded)
    )
    assert seen == [episode_seed(5, "t", 2)]


def training_resets(run_seed, calls=1):
    from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, encode_prompt

    RESETS.clear()
    rollout = EpisodeRollout(
        [EnvSetup("test/SeedRecorder-v0", agent="rllm_gym.agents.math:MathAgent")],
        max_turns=1,
        policy_factory=lambda trainer: ScriptedPolicy(["x"], cycle=True),
    )
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(process_index=0),
        args=SimpleNamespace(seed=run_seed, temperature=1.0, top_p=1.0, top_k=0, max_completion_length=8),
        processing_class=SimpleNamespace(eos_token_id=0),
        use_vllm=False,
    )
    prompts = [encode_prompt("test/SeedRecorder-v0", {"id": "a"})] * 4  # a GRPO group of 4 rollouts of one task
    try:
        generation = rollout.generation_for(trainer)
        for _ in range(calls):
            rollout.collect(prompts, generation)
    finally:
        rollout.close()
    return list(RESETS)


def test_training_resets_are_seeded_from_the_run_seed_per_rollout():
    first = training_resets(run_seed=3, calls=2)
    seeds = [seed for _, seed in first]
    assert None not in seeds  # the old rollout's ids (a:p0s0e1) gave seed=None
    assert len(set(seeds)) == 8  # 4 rollouts in each of 2 calls, all different
    assert first == training_resets(run_seed=3, calls=2)  # same run seed, same resets
    assert {seed for _, seed in training_resets(run_seed=4)}.isdisjoint(seeds)
