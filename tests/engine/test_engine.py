import asyncio
import re
import threading

import gymnasium as gym
import pytest

from rllm_gym.agents.base import BaseAgent
from rllm_gym.agents.frozenlake import FrozenLakeAgent
from rllm_gym.engine import AgentExecutionEngine, AgentWorkflowEngine, MultiTurnWorkflow, task_id_of
from rllm_gym.policies.base import PolicyError, SamplingParams
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.spaces import TextSpace
from rllm_gym.store import read_episodes
from rllm_gym.types import TerminationReason

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]
SOLUTION = ["down", "down", "right", "right", "down", "right"]


def solver_policy() -> ScriptedPolicy:
    """Plays the solution of MAP: the move index is the number of grids the agent has seen."""

    def reply(messages):
        turn = sum(1 for m in messages if m["role"] == "user") - 1
        return f"Action: {SOLUTION[turn]}" if turn < len(SOLUTION) else "Action: up"

    return ScriptedPolicy(reply)


def frozen_engine(policy, **kwargs) -> AgentExecutionEngine:
    return AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=FrozenLakeAgent, policy=policy, **kwargs)


async def test_episodes_solve_and_carry_token_fields_and_returns():
    engine = frozen_engine(solver_policy(), n_parallel=4, gamma=0.5)
    episodes = await engine.run([{"id": "classic", "map": MAP}], n_rollouts=3)
    assert [e.id for e in episodes] == ["classic:0", "classic:1", "classic:2"]
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.ENV_DONE and episode.is_correct
        (trajectory,) = episode.trajectories
        assert trajectory.reward == 1.0 and len(trajectory.steps) == 6
        assert [s.mc_return for s in trajectory.steps] == [0.5**5, 0.5**4, 0.5**3, 0.25, 0.5, 1.0]
        for step in trajectory.steps:
            output = step.model_output
            assert step.response_ids == output.completion_ids == list(output.text.encode())
            assert step.logprobs == output.logprobs and len(step.logprobs) == len(step.response_ids)
            assert step.prompt_ids == output.prompt_ids
        assert episode.metrics["agent/turns"] == 6.0 and episode.metrics["turns"] == 6.0


async def test_limits_become_termination_reasons():
    wander = ScriptedPolicy(["Action: left"], cycle=True)
    (episode,) = await frozen_engine(wander, max_turns=3).run([{"map": MAP}])
    assert episode.termination_reason is TerminationReason.MAX_TURNS_EXCEEDED
    assert len(episode.trajectories[0].steps) == 3 and not episode.is_correct

    long_replies = ScriptedPolicy(["Action: " + "left " * 50], cycle=True)
    engine = frozen_engine(long_replies, max_response_length=8)
    (episode,) = await engine.run([{"map": MAP}])
    assert episode.termination_reason is TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
    assert len(episode.trajectories[0].steps[0].response_ids) == 8

    (episode,) = await frozen_engine(wander, max_prompt_length=3).run([{"map": MAP}])
    assert episode.termination_reason is TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED

    async def slow(messages):
        await asyncio.sleep(10)
        return "Action: up"

    (episode,) = await frozen_engine(ScriptedPolicy(slow), timeout_s=0.2).run([{"map": MAP}])
    assert episode.termination_reason is TerminationReason.TIMEOUT


async def test_policy_failing_on_10_percent_of_calls_is_retried_and_the_rest_unaffected():
    clean = await frozen_engine(solver_policy(), n_parallel=8).run(list(range(20)), n_rollouts=2)
    calls = 0
    inner = solver_policy()

    async def flaky(messages):
        nonlocal calls
        calls += 1
        if calls % 10 == 3:
            raise PolicyError("server hiccup")
        return await inner._next_reply(messages)

    episodes = await frozen_engine(ScriptedPolicy(flaky), n_parallel=8).run(list(range(20)), n_rollouts=2)
    assert len(episodes) == 40
    retried = [e for e in episodes if e.metadata["attempts"] > 1]
    assert retried, "some episodes should have needed a retry"
    assert all(e.termination_reason is not TerminationReason.ERROR for e in episodes)
    for before, after in zip(clean, episodes, strict=True):
        assert before.id == after.id
        assert before.termination_reason == after.termination_reason
        assert [s.action for s in before.trajectories[0].steps] == [s.action for s in after.trajectories[0].steps]


class ExplodingEnv(gym.Env):
    metadata = {"rllm_gym.inline_step": False}

    def __init__(self):
        self.observation_space = TextSpace(100)
        self.action_space = TextSpace(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "go", {}

    def step(self, action):
        raise RuntimeError("env exploded")


async def test_env_error_ends_only_that_episode_with_a_recorded_error():
    engine = AgentExecutionEngine(
        env_id=ExplodingEnv,
        agent_cls=FrozenLakeAgent,
        retry_limit=2,
        policy=ScriptedPolicy(["Action: up"], cycle=True),
    )
    episodes = await engine.run([{"id": "x"}, {"id": "y"}])
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.ERROR
        assert episode.metadata["error"]["type"] == "RuntimeError"
        assert episode.metadata["error"]["message"] == "env exploded"
        assert episode.metadata["attempts"] == 2
        assert len(episode.trajectories[0].steps) == 1  # the partial trajectory is kept


class ThreadRecordingEnv(ExplodingEnv):
    threads: list[int] = []

    def step(self, action):
        self.threads.append(threading.get_ident())
        return "done", 1.0, True, False, {"is_correct": True}


async def test_slow_envs_run_off_the_loop_fast_envs_inline():
    policy = ScriptedPolicy(["Action: up"], cycle=True)
    engine = AgentExecutionEngine(env_id=ThreadRecordingEnv, agent_cls=FrozenLakeAgent, policy=policy)
    episodes = await engine.run(list(range(4)))
    loop_thread = threading.get_ident()
    assert all(e.is_correct for e in episodes)
    assert ThreadRecordingEnv.threads and loop_thread not in ThreadRecordingEnv.threads

    seen = []
    original = MultiTurnWorkflow.call_env

    async def spy(self, env, method, *args, **kwargs):
        seen.append(threading.get_ident())
        return await original(self, env, method, *args, **kwargs)

    MultiTurnWorkflow.call_env = spy
    try:
        await frozen_engine(solver_policy()).run([{"map": MAP}])
    finally:
        MultiTurnWorkflow.call_env = original
    assert set(seen) == {loop_thread}


async def test_out_file_streams_and_resumes_without_redoing(tmp_path):
    out = tmp_path / "episodes.jsonl"
    policy = solver_policy()
    first = await frozen_engine(policy, out=out).run(list(range(3)), n_rollouts=2)
    assert {e.id for e in read_episodes(out)} == {e.id for e in first}
    n_calls = len(policy.calls)
    again = await frozen_engine(policy, out=out).run(list(range(5)), n_rollouts=2)
    assert len(again) == 10 and len({e.id for e in again}) == 10
    assert [e.id for e in read_episodes(out)].count("seed-0:0") == 1
    new_calls = len(policy.calls) - n_calls
    assert 0 < new_calls <= 4 * 20  # only the 4 new episodes ran


async def test_stream_yields_as_episodes_finish():
    engine = frozen_engine(solver_policy(), n_parallel=2)
    seen = [episode.id async for episode in engine.stream([{"id": "t", "map": MAP}], n_rollouts=3)]
    assert sorted(seen) == ["t:0", "t:1", "t:2"]


def test_task_ids_and_bad_arguments():
    assert task_id_of({"id": "gsm8k:7"}, 0) == "gsm8k:7"
    assert task_id_of({"question": "?"}, 3) == "task-3"
    assert task_id_of(5, 0) == "seed-5"
    with pytest.raises(TypeError, match=re.escape("tasks[2] must be a task dict or an int seed, got str")):
        task_id_of("oops", 2)
    with pytest.raises(ValueError, match=re.escape("n_parallel must be >= 1, got 0")):
        AgentWorkflowEngine(MultiTurnWorkflow, ScriptedPolicy(["x"]), n_parallel=0)
    with pytest.raises(ValueError, match=re.escape("gamma must lie in [0, 1]")):
        asyncio.run(frozen_engine(ScriptedPolicy(["x"]), gamma=2.0).run([0]))
    with pytest.raises(ValueError, match=re.escape("max_turns must be >= 1, got 0")):
        asyncio.run(frozen_engine(ScriptedPolicy(["x"]), max_turns=0).run([0]))


async def test_sampling_params_reach_the_policy():
    seen = []

    class Recorder(ScriptedPolicy):
        async def generate(self, messages=None, sampling_params=None, **kwargs):
            seen.append(sampling_params)
            return await super().generate(messages, sampling_params, **kwargs)

    engine = frozen_engine(
        Recorder(["Action: up"], cycle=True),
        max_turns=1,
        max_response_length=7,
        sampling_params=SamplingParams(temperature=0.3),
    )
    await engine.run([0])
    assert seen[0].temperature == 0.3 and seen[0].max_tokens == 7


async def test_engine_for_plays_single_and_multi_agent_ids():
    from rllm_gym.agents.solver_judge import SolverJudgeWorkflow
    from rllm_gym.engine import engine_for

    policy = ScriptedPolicy(lambda messages: "<verdict>1</verdict> \\boxed{2} up")
    single = engine_for("rllm/FrozenLake-v0", policy, max_turns=2)
    assert isinstance(single, AgentExecutionEngine)
    custom = engine_for("rllm/FrozenLake-v0", policy, agent="rllm_gym.agents.frozenlake:FrozenLakeAgent")
    assert custom.workflow_args["agent_cls"] is FrozenLakeAgent
    multi = engine_for("rllm/SolverJudge-v0", policy, env_args={"n_solvers": 2}, max_turns=3)
    assert multi.workflow_cls is SolverJudgeWorkflow  # the id's registered runner
    (episode,) = await multi.run([{"id": "q", "question": "What is 1 + 1?", "ground_truth": "2"}])
    assert [t.name for t in episode.trajectories] == ["solver", "solver", "judge"]
    with pytest.raises(ValueError, match=re.escape("agent='my.module:Agent' is for single-agent envs")):
        engine_for("rllm/SolverJudge-v0", policy, agent="my.module:Agent")
    with pytest.raises(ValueError, match=re.escape("keyed by role (['judge', 'solver']), e.g. {'judge': {...}}")):
        engine_for("rllm/SolverJudge-v0", policy, agent_args={"system_prompt": "hi"})


async def test_a_kept_env_pool_serves_several_runs_and_stays_open():
    from rllm_gym.agents.math import MathAgent
    from rllm_gym.engine import EnvThreadPool
    from rllm_gym.rewards.math import math_reward_fn

    pool = EnvThreadPool(max_workers=3, thread_name_prefix="kept")
    policy = ScriptedPolicy(lambda messages: "\\boxed{2}")
    # A grader of its own: Math-v0 then steps in the pool (its own grader's exact answers step on the loop).
    env_args = {"reward_fn": lambda task, action: math_reward_fn(task, action)}
    for _ in range(2):
        engine = AgentExecutionEngine(
            env_id="rllm/Math-v0", agent_cls=MathAgent, policy=policy, max_turns=1, executor=pool, env_args=env_args
        )
        episodes = await engine.run(list(range(6)))
        assert all(e.termination_reason.value != "error" for e in episodes)
    assert pool.busy == 0 and 1 <= len(pool._threads) <= 3  # the same threads, not new ones per run
    assert pool.submit(lambda: 7).result(timeout=10) == 7  # the engine did not shut the caller's pool
    pool.shutdown()


def test_max_steps_is_a_deprecated_alias_of_max_turns():
    from rllm_gym.engine import MultiAgentWorkflow

    with pytest.warns(
        FutureWarning, match=re.escape("AgentExecutionEngine(max_steps=...) is deprecated: pass max_turns=")
    ):
        engine = frozen_engine(ScriptedPolicy(["x"]), max_steps=3)
    assert engine.workflow_args["max_turns"] == 3 and "max_steps" not in engine.workflow_args
    with pytest.warns(FutureWarning, match=re.escape("MultiTurnWorkflow(max_steps=...) is deprecated")):
        workflow = MultiTurnWorkflow(ScriptedPolicy(["x"]), env="rllm/FrozenLake-v0", agent_cls=BaseAgent, max_steps=2)
    assert workflow.max_turns == 2
    with pytest.warns(FutureWarning, match=re.escape("MultiAgentWorkflow(max_steps=...) is deprecated")):
        workflow = MultiAgentWorkflow(ScriptedPolicy(["x"]), env="rllm/SolverJudge-v0", max_steps=4)
    assert workflow.max_turns == 4
    with pytest.raises(ValueError, match=re.escape("got max_turns=2 and max_steps=3: pass only max_turns")):
        frozen_engine(ScriptedPolicy(["x"]), max_turns=2, max_steps=3)


@pytest.mark.parametrize("build_s, on_loop", [(0.0, True), (0.01, False)])
def test_workflows_that_build_fast_are_built_on_the_loop_and_slow_ones_in_threads(build_s, on_loop):
    # A workflow whose env steps are not inline (cheap_to_build False) but that builds in microseconds is built on
    # the event loop: a thread hop per build cost more than the build. A slow one still goes to the env threads.
    import time

    from rllm_gym.engine import Workflow
    from rllm_gym.types import Episode

    built: list[int] = []

    class Timed(Workflow):
        def __init__(self, policy, **kwargs):
            super().__init__(policy, **kwargs)
            if build_s:
                time.sleep(build_s)
            built.append(threading.get_ident())

        async def run(self, task, uid):
            await asyncio.sleep(0)
            return Episode(id=uid, task=task)

    async def run():
        engine = AgentWorkflowEngine(Timed, ScriptedPolicy(["x"], cycle=True), n_parallel=8, env_workers=4)
        episodes = await engine.run(list(range(8)))
        return episodes, threading.get_ident()

    episodes, loop_thread = asyncio.run(run())
    assert len(episodes) == 8 and len(built) == 8
    assert all((ident == loop_thread) == on_loop for ident in built[1:])


@pytest.mark.parametrize("keeps_executor", [True, False])
async def test_workflows_serve_the_next_run_only_with_an_executor_the_caller_keeps(keeps_executor, monkeypatch):
    from rllm_gym.engine import EnvThreadPool

    built = []
    new_workflow = AgentWorkflowEngine._new_workflow
    monkeypatch.setattr(AgentWorkflowEngine, "_new_workflow", lambda self: built.append(1) or new_workflow(self))
    executor = EnvThreadPool(max_workers=4, thread_name_prefix="test-env") if keeps_executor else None
    engine = frozen_engine(solver_policy(), n_parallel=3, executor=executor)
    counts, runs = [], []
    for _ in range(2):
        before = len(built)
        runs.append([(e.id, e.is_correct, len(e.trajectories[0].steps)) for e in await engine.run([{"map": MAP}] * 3)])
        counts.append(len(built) - before)
    assert runs[0] == runs[1] and all(correct and turns == 6 for _, correct, turns in runs[0])
    # Without one, each run's env pool is shut down at its end: workflows holding it are not kept.
    assert counts[0] >= 1 and counts[1] == (0 if keeps_executor else counts[0])
    if executor is not None:
        executor.shutdown()


class InfraFlakyEnv(ExplodingEnv):
    """Its grader fails (``info["infra_failed"]``) on the first ``failures`` steps of the process, then pays 1.0."""

    failures = 0
    steps = 0

    def step(self, action):
        type(self).steps += 1
        if type(self).steps <= type(self).failures:
            return "", 0.0, True, False, {"infra_failed": True, "error": "sandbox_error: zygote cannot start"}
        return "", 1.0, True, False, {"infra_failed": False, "is_correct": True}


@pytest.mark.parametrize("failures", [1, 5])
async def test_an_infrastructure_failure_is_retried_and_kept_apart_if_it_persists(failures):
    InfraFlakyEnv.failures, InfraFlakyEnv.steps = failures, 0
    engine = AgentExecutionEngine(
        env_id=InfraFlakyEnv,
        agent_cls=FrozenLakeAgent,
        retry_limit=2,
        policy=ScriptedPolicy(["Action: up"], cycle=True),
    )
    (episode,) = await engine.run([{"id": "x"}])
    assert episode.metadata["attempts"] == 2
    if failures == 1:  # the retry got a real verdict
        assert episode.termination_reason is TerminationReason.ENV_DONE and episode.is_correct
        assert episode.trajectories[0].reward == 1.0
    else:  # still failed: kept in the records with its reason, never a wrong answer
        assert episode.termination_reason is TerminationReason.INFRA_FAILED and not episode.is_correct
        assert episode.metadata["infra_failure"] == {
            "trajectory": "agent",
            "step": 0,
            "error": "sandbox_error: zygote cannot start",
        }
