"""EpisodeRollout keeps each env's engine and its workflows (envs, agents) from call to call while the policy stays
the same: the episodes are exactly those that workflows built afresh for every call give."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest
import torch

from rllm_gym.engine import AgentWorkflowEngine
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, encode_prompt


def stand_in_trainer() -> SimpleNamespace:
    return SimpleNamespace(
        use_vllm=False,
        args=SimpleNamespace(seed=0, temperature=1.0, top_p=1.0, top_k=0, max_completion_length=16),
        accelerator=SimpleNamespace(process_index=0, num_processes=1, device=torch.device("cpu")),
        processing_class=SimpleNamespace(eos_token_id=0),
    )


async def reply(messages: list[dict]) -> str:
    # A different answer at every turn, so that an episode's course depends on its env's and agent's state; the
    # episodes take turns on the loop (every one needs a workflow of its own).
    await asyncio.sleep(0)
    return f"\\boxed{{{len(messages) % 5}}}"


def summary(episode) -> tuple:
    steps = [(s.action, s.observation, s.reward, s.done, s.info.get("turn")) for s in episode.trajectories[0].steps]
    return episode.id, episode.termination_reason, episode.is_correct, episode.trajectories[0].reward, steps


def test_kept_workflows_give_the_episodes_fresh_workflows_give(monkeypatch) -> None:
    builds = []
    new_workflow = AgentWorkflowEngine._new_workflow
    monkeypatch.setattr(AgentWorkflowEngine, "_new_workflow", lambda self: builds.append(1) or new_workflow(self))
    # Answered 2, then 4, then 1 (see reply): right at the first, the second, the third try, and never.
    tasks = [{"id": f"t{gold}", "question": f"Q{gold}?", "ground_truth": str(gold)} for gold in (2, 4, 1, 9)]
    prompts = [encode_prompt("rllm/Math-v0", task) for task in tasks for _ in range(3)]  # 3 episodes per task
    setup = [EnvSetup("rllm/Math-v0", env_args={"max_turns": 3})]
    policy = ScriptedPolicy(reply)
    kept = EpisodeRollout(setup, max_turns=3, policy_factory=lambda trainer: policy)
    fresh = EpisodeRollout(setup, max_turns=3, policy_factory=lambda trainer: ScriptedPolicy(reply))
    trainer = stand_in_trainer()
    runs: dict[str, list] = {"kept": [], "fresh": []}
    built: dict[str, list[int]] = {"kept": [], "fresh": []}
    for _ in range(3):
        for name, rollout in (("kept", kept), ("fresh", fresh)):
            before = len(builds)
            runs[name].append([summary(e) for e in rollout.collect(prompts, rollout.generation_for(trainer)).episodes])
            built[name].append(len(builds) - before)
    kept.close()
    fresh.close()
    assert runs["kept"] == runs["fresh"]
    assert {len(steps) for *_, steps in runs["kept"][0]} == {1, 2, 3}
    assert built == {"kept": [12, 0, 0], "fresh": [12, 12, 12]}


def test_the_env_pool_has_the_rollouts_env_workers_and_bad_counts_are_refused():
    rollout = EpisodeRollout([EnvSetup("rllm/FrozenLake-v0")], env_workers=9)
    try:
        rollout._run_sync(asyncio.sleep(0))
        assert rollout._pool.max_workers == 9
    finally:
        rollout.close()
    for bad in (0, -1, True, 2.0):
        expected = f"EpisodeRollout env_workers must be a positive int or None, got {bad!r}"
        with pytest.raises(ValueError, match=re.escape(expected)):
            EpisodeRollout([EnvSetup("rllm/FrozenLake-v0")], env_workers=bad)
