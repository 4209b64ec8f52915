import gc
import re

import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.engine import AgentWorkflowEngine, TerminationEvent, Workflow
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.types import Step, TerminationReason, Trajectory


class SolveThenCheck(Workflow):
    """Two roles: a solver answers, a checker repeats the verdict; plus a committed, hand-built trajectory."""

    async def run(self, task, uid):
        solver, checker = MathAgent(name="solver"), MathAgent(name="checker")
        self.commit(agent=solver)
        self.commit(agent=checker)
        self.commit(trajectory=Trajectory(name="notes", steps=[Step(reward=0.25)]))
        solver.update_from_env(task["question"], 0.0, False, {})
        answer = solver.update_from_model(await self.generate(solver))
        correct = answer.strip() == task["answer"]
        solver.update_from_env("", float(correct), True, {"is_correct": correct})
        checker.update_from_env(f"Is {answer} right?", 0.0, False, {})
        checker.update_from_model(await self.generate(checker))
        checker.update_from_env("", 0.5, True, {})
        if task.get("explode"):
            raise ValueError("checker broke")
        raise TerminationEvent(TerminationReason.ENV_DONE)


async def test_custom_workflow_with_roles_metrics_and_shaping():
    policy = ScriptedPolicy(lambda messages: "4" if "2+2" in messages[-1]["content"] else "yes")
    engine = AgentWorkflowEngine(SolveThenCheck, policy, workflow_args={"gamma": 0.9, "reward_bonus_coeff": 0.0})
    tasks = [{"id": "add", "question": "2+2?", "answer": "4"}, {"id": "bad", "question": "2+2?", "answer": "5"}]
    right, wrong = await engine.run(tasks)
    assert [t.name for t in right.trajectories] == ["solver", "checker", "notes"]
    assert right.is_correct and not wrong.is_correct
    assert right.metrics["solver/reward"] == 1.0 and wrong.metrics["solver/reward"] == 0.0
    assert right.metrics["checker/reward"] == 0.5 and right.metrics["notes/reward"] == 0.25
    assert right.metrics["turns"] == 3.0
    assert right.trajectories[0].steps[0].mc_return == 1.0


async def test_errors_end_the_episode_not_the_batch_and_gc_is_restored():
    before = gc.get_threshold()
    engine = AgentWorkflowEngine(SolveThenCheck, ScriptedPolicy(["x"], cycle=True), retry_limit=3)
    ok, broken = await engine.run(
        [{"id": "a", "question": "q", "answer": "x"}, {"id": "b", "question": "q", "answer": "x", "explode": True}]
    )
    assert ok.termination_reason is TerminationReason.ENV_DONE and ok.metadata["attempts"] == 1
    assert broken.termination_reason is TerminationReason.ERROR and broken.metadata["attempts"] == 3
    assert broken.metadata["error"]["message"] == "checker broke" and not broken.is_correct
    assert gc.get_threshold() == before


def test_reward_shaping_adds_the_improvement_over_the_previous_step():
    workflow = SolveThenCheck(ScriptedPolicy(["x"]), reward_bonus_coeff=0.5)
    from rllm_gym.types import Episode

    episode = Episode(
        id="t:0", trajectories=[Trajectory(steps=[Step(reward=0.0), Step(reward=1.0), Step(reward=1.0)])]
    )
    workflow.postprocess_episode(episode)
    assert [s.reward for s in episode.trajectories[0].steps] == [0.0, 1.5, 1.0]
    assert episode.trajectories[0].reward == 2.5


def test_commit_needs_exactly_one_thing():
    workflow = SolveThenCheck(ScriptedPolicy(["x"]))
    with pytest.raises(ValueError, match=re.escape("commit() takes exactly one of agent= or trajectory=")):
        workflow.commit()
