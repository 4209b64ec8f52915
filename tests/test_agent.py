import subprocess
import sys

import pytest

from rllm_gym.agent import BaseAgent
from rllm_gym.types import DEFAULT_MAX_TURNS


def test_the_agent_interface_lives_in_the_core_and_the_old_names_are_the_same_class():
    from rllm_gym.agents import BaseAgent as from_agents
    from rllm_gym.agents.base import BaseAgent as from_agents_base
    from rllm_gym.agents.frozenlake import FrozenLakeAgent

    assert from_agents is from_agents_base is BaseAgent
    assert issubclass(FrozenLakeAgent, BaseAgent)


def test_the_engine_imports_nothing_from_the_agents_folder():
    code = "import sys, rllm_gym.engine; print(sorted(m for m in sys.modules if m.startswith('rllm_gym.agents')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_engines_old_solver_judge_name_still_works_with_a_warning():
    import rllm_gym.engine
    from rllm_gym.agents.solver_judge import SolverJudgeWorkflow

    with pytest.warns(DeprecationWarning, match="import it from rllm_gym.agents.solver_judge"):
        assert rllm_gym.engine.SolverJudgeWorkflow is SolverJudgeWorkflow


def test_one_max_turns_default_for_engines_trainer_and_eval():
    from rllm_gym.cli_eval import EVAL_DEFAULTS
    from rllm_gym.engine import AgentExecutionEngine
    from rllm_gym.engine.multi_agent import MultiAgentWorkflow
    from rllm_gym.engine.workflow import MultiTurnWorkflow
    from rllm_gym.policies.scripted import ScriptedPolicy
    from rllm_gym.train.config import TrainConfig
    from rllm_gym.train.rollout import EpisodeRollout

    policy = ScriptedPolicy(lambda messages: "up")
    engine = AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=BaseAgent, policy=policy)
    assert engine.workflow_args["max_turns"] == DEFAULT_MAX_TURNS
    assert MultiTurnWorkflow(policy, env="rllm/FrozenLake-v0", agent_cls=BaseAgent).max_turns == DEFAULT_MAX_TURNS
    assert MultiAgentWorkflow(policy, env="rllm/SolverJudge-v0").max_turns == DEFAULT_MAX_TURNS
    assert EpisodeRollout.__init__.__kwdefaults__["max_turns"] == DEFAULT_MAX_TURNS
    assert TrainConfig.__dataclass_fields__["max_turns"].default == DEFAULT_MAX_TURNS
    assert EVAL_DEFAULTS["max_turns"] == DEFAULT_MAX_TURNS
