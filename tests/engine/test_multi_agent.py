import re

import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.agents.solver_judge import JudgeAgent, SolverAgent, SolverJudgeWorkflow
from rllm_gym.engine import (
    AgentWorkflowEngine,
    MultiAgentWorkflow,
    RolePolicies,
    run_multi_agent_episode,
)
from rllm_gym.engine.multi_agent import role_of
from rllm_gym.engine.workflow import episode_metrics
from rllm_gym.envs import solver_judge
from rllm_gym.policies.base import PolicyError
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.registry import default_agent
from rllm_gym.types import Episode, Step, TerminationReason, Trajectory, TrajectoryGroup

TASKS = [
    {"id": "a", "question": "What is 40 + 2?", "ground_truth": "42"},
    {"id": "b", "question": "What is 7 * 6?", "ground_truth": "42"},
    {"id": "c", "question": "What is 50 - 8?", "ground_truth": "42"},
]


def is_judge(messages):
    return "judge" in messages[0]["content"]


def solver_then_judge(verdict="<verdict>1</verdict>"):
    """Solvers alternate right and wrong (by prompt count); the judge gives ``verdict``."""
    count = {"solver": 0}

    def reply(messages):
        if is_judge(messages):
            return verdict
        count["solver"] += 1
        return "\\boxed{42}" if count["solver"] % 2 else "\\boxed{41}"

    return ScriptedPolicy(reply)


def first_right_policy(verdict):
    """solver_0 is right and solver_1 wrong in every episode (tells them apart by a tag in their system prompt)."""

    def reply(messages):
        if is_judge(messages):
            return verdict
        return "\\boxed{42}" if messages[0]["content"].endswith("[0]") else "\\boxed{41}"

    return ScriptedPolicy(reply)


class TaggedSolver(SolverAgent):
    """A SolverAgent whose system prompt ends with its index, so a scripted policy can tell solvers apart.

    The index counts constructions: run it with n_parallel=1 so that one workflow builds solver_0 then solver_1.
    """

    count = 0

    def __init__(self, **kwargs):
        super().__init__(system_prompt=f"{SolverAgent.system_prompt} [{TaggedSolver.count % 2}]", **kwargs)
        TaggedSolver.count += 1


@pytest.mark.parametrize("parallel", [False, True])
async def test_engine_runs_solver_judge_episodes_that_group_per_role(parallel):
    TaggedSolver.count = 0
    engine = AgentWorkflowEngine(
        SolverJudgeWorkflow,
        first_right_policy("<verdict>1</verdict>"),
        workflow_args={"parallel": parallel, "agent_classes": {"solver": TaggedSolver, "judge": JudgeAgent}},
        n_parallel=1,
    )
    episodes = await engine.run(TASKS, n_rollouts=4)
    assert [e.id for e in episodes] == [f"{t['id']}:{k}" for t in TASKS for k in range(4)]
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.ENV_DONE and episode.is_correct
        assert [t.name for t in episode.trajectories] == ["solver", "solver", "judge"]
        assert [t.metadata["agent_id"] for t in episode.trajectories] == ["solver_0", "solver_1", "judge_0"]
        assert [t.reward for t in episode.trajectories] == [1.0, 0.0, 1.0]
        assert episode.metrics["solver/reward"] == 0.5 and episode.metrics["solver/accuracy"] == 0.5
        assert episode.metrics["solver/turns"] == 2.0 and episode.metrics["judge/reward"] == 1.0
        assert episode.metrics["turns"] == 3.0 and episode.metrics["judge/invalid_verdict"] == 0.0
        judge_chat = episode.trajectories[2].steps[0].chat_completions
        assert [m["role"] for m in judge_chat] == ["system", "user", "assistant"]  # no empty message while waiting
        assert judge_chat[1]["content"] == solver_judge.judge_observation(
            episode.task["question"], ["\\boxed{42}", "\\boxed{41}"]
        )
    groups = TrajectoryGroup.from_episodes(episodes)
    assert [(g.group_id, len(g.trajectories)) for g in groups] == [
        (f"{t['id']}:{role}", size) for t in TASKS for role, size in (("solver", 8), ("judge", 4))
    ]
    assert groups[0].episode_ids[:2] == ["a:0", "a:0"]


async def test_wrong_pick_and_malformed_verdict_through_the_engine():
    wrong = await AgentWorkflowEngine(SolverJudgeWorkflow, solver_then_judge("<verdict>2</verdict>")).run(TASKS[:1])
    assert [t.reward for t in wrong[0].trajectories] == [1.0, 0.0, 0.0] and not wrong[0].is_correct
    engine = AgentWorkflowEngine(
        SolverJudgeWorkflow,
        solver_then_judge("<verdict>7</verdict>"),
        workflow_args={"env_args": {"invalid_verdict_reward": -0.5, "n_solvers": 3}, "parallel": True},
    )
    (episode,) = await engine.run(TASKS[:1])
    assert [t.reward for t in episode.trajectories] == [1.0, 0.0, 1.0, -0.5]
    assert episode.metrics["judge/invalid_verdict"] == 1.0 and episode.metrics["solver/count"] == 3.0
    assert episode.trajectories[-1].steps[0].info["verdict_error"] == (
        "verdict 7 is out of range: the solutions are numbered 1 to 3"
    )


async def test_one_policy_per_role():
    solver_policy = ScriptedPolicy(["\\boxed{42}"], cycle=True)
    judge_policy = ScriptedPolicy(["<verdict>2</verdict>"], cycle=True)
    engine = AgentWorkflowEngine(
        SolverJudgeWorkflow, {"solver": solver_policy, "judge": judge_policy}, workflow_args={"parallel": True}
    )
    episodes = await engine.run(TASKS, n_rollouts=2)
    assert all(e.is_correct for e in episodes)
    assert [len(g.trajectories) for g in TrajectoryGroup.from_episodes(episodes)] == [4, 2] * 3
    assert len(solver_policy.calls) == 12 and len(judge_policy.calls) == 6
    assert all(is_judge(messages) for messages in judge_policy.calls)
    assert not any(is_judge(messages) for messages in solver_policy.calls)
    with pytest.raises(ValueError, match=re.escape("no policy for role 'judge'")):
        SolverJudgeWorkflow({"solver": solver_policy})


async def test_errors_are_retried_and_limits_end_episodes():
    failures = {"left": 1}

    def flaky(messages):
        if is_judge(messages) and failures["left"]:
            failures["left"] -= 1
            raise PolicyError("server hiccup")
        return "<verdict>1</verdict>" if is_judge(messages) else "\\boxed{42}"

    (episode,) = await AgentWorkflowEngine(SolverJudgeWorkflow, ScriptedPolicy(flaky), retry_limit=2).run(TASKS[:1])
    assert episode.termination_reason is TerminationReason.ENV_DONE and episode.metadata["attempts"] == 2
    assert [len(t.steps) for t in episode.trajectories] == [1, 1, 1]  # the failed attempt left nothing behind

    def broken(messages):
        raise PolicyError("down")

    (episode,) = await AgentWorkflowEngine(SolverJudgeWorkflow, ScriptedPolicy(broken), retry_limit=2).run(TASKS[:1])
    assert episode.termination_reason is TerminationReason.ERROR and episode.metadata["attempts"] == 2
    assert episode.metadata["error"]["message"] == "down" and not episode.is_correct

    for parallel in (False, True):
        engine = AgentWorkflowEngine(
            SolverJudgeWorkflow, solver_then_judge(), workflow_args={"max_turns": 2, "parallel": parallel}
        )
        (episode,) = await engine.run(TASKS[:1])
        assert episode.termination_reason is TerminationReason.MAX_TURNS_EXCEEDED
        assert [len(t.steps) for t in episode.trajectories] == [1, 1, 0]


async def test_run_one_episode_with_a_seed_or_an_env_instance():
    episode = await run_multi_agent_episode(
        "rllm/SolverJudge-v0", solver_then_judge(), 3, workflow_cls=SolverJudgeWorkflow, rollout_idx=2
    )
    assert episode.id == "seed-3:2" and episode.termination_reason is TerminationReason.ENV_DONE
    env = solver_judge.parallel_env(tasks=TASKS[1:2], n_solvers=1)
    episode = await run_multi_agent_episode(
        env,
        ScriptedPolicy(lambda m: "<verdict>1</verdict>" if is_judge(m) else "\\boxed{42}"),
        TASKS[1],
        agent_classes={"solver": MathAgent, "judge": JudgeAgent},
    )
    assert episode.id == "b:0" and episode.is_correct is True  # MultiAgentWorkflow: every graded role is correct
    assert [t.name for t in episode.trajectories] == ["solver", "judge"]  # agents are named after their role


def test_roles_and_defaults():
    assert role_of("solver_12") == "solver" and role_of("judge_0") == "judge" and role_of("referee") == "referee"
    assert role_of("red_team_3") == "red_team"
    assert default_agent("rllm/SolverJudge-v0") == {"solver": SolverAgent, "judge": JudgeAgent}
    workflow = MultiAgentWorkflow(ScriptedPolicy(["x"]), env="rllm/SolverJudge-v0", parallel=True)
    assert workflow.parallel and [type(a) for a in workflow.agents.values()] == [SolverAgent, SolverAgent, JudgeAgent]
    with pytest.raises(ValueError, match=re.escape("no agent class for role 'judge' (PettingZoo agent 'judge_0')")):
        MultiAgentWorkflow(ScriptedPolicy(["x"]), env=solver_judge.env, agent_classes={"solver": SolverAgent})
    with pytest.raises(TypeError, match=re.escape("not a PettingZoo AECEnv or ParallelEnv")):
        MultiAgentWorkflow(ScriptedPolicy(["x"]), env="rllm/Math-v0", agent_classes={})


async def test_role_policies_route_by_role():
    policies = RolePolicies({"judge": ScriptedPolicy(["J"])}, default=ScriptedPolicy(["D"]))
    messages = [{"role": "user", "content": "hi"}]
    assert (await policies.generate(messages, role="judge")).text == "J"
    assert (await policies.generate(messages, role="solver")).text == "D"
    assert RolePolicies.of(policies) is policies


def test_episode_metrics_average_rewards_per_role_and_total_tokens():
    episode = Episode(
        id="t:0",
        trajectories=[
            Trajectory(name="solver", reward=1.0, steps=[Step(response_ids=[1, 2], info={"is_correct": True})]),
            Trajectory(name="solver", reward=0.0, steps=[Step(response_ids=[3], info={"is_correct": False})]),
            Trajectory(name="judge", reward=1.0, steps=[Step(response_ids=[4])]),
        ],
    )
    metrics = episode_metrics(episode)
    assert metrics["solver/reward"] == 0.5 and metrics["solver/accuracy"] == 0.5 and metrics["solver/count"] == 2.0
    assert metrics["solver/response_tokens"] == 3.0 and metrics["response_tokens"] == 4.0 and metrics["turns"] == 3.0
    assert "judge/accuracy" not in metrics
