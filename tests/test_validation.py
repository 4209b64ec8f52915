"""Constructors reject bad arguments with a message naming the argument and what is allowed (issue 10, part 4).

One table per area; each row is (constructor call, exception type, the exact message). Messages already covered by
the per-module tests are not repeated here.
"""

from __future__ import annotations

import re

import pytest

from rllm_gym.agents.base import BaseAgent
from rllm_gym.agents.frozenlake import FrozenLakeAgent
from rllm_gym.agents.tool import ToolAgent
from rllm_gym.data import Dataset, DatasetRegistry
from rllm_gym.engine import AgentExecutionEngine, AgentWorkflowEngine
from rllm_gym.engine.workflow import MultiTurnWorkflow, Workflow
from rllm_gym.envs.code import CodeEnv
from rllm_gym.envs.frozenlake import FrozenLakeEnv
from rllm_gym.envs.tool import ToolEnv
from rllm_gym.policies import SamplingParams, ScriptedPolicy
from rllm_gym.policies.openai import OpenAIPolicy
from rllm_gym.registry import UnknownEnvError
from rllm_gym.rewards.code import CodeReward
from rllm_gym.rewards.math import MathGrader
from rllm_gym.sandbox import run_python
from rllm_gym.spaces import TextSpace
from rllm_gym.store import EpisodeWriter
from rllm_gym.tools import MultiTool, get_parser
from rllm_gym.tools.base import Tool
from rllm_gym.train.advantages import AdvantageConfig

POLICY = ScriptedPolicy(["x"])
BUILTINS = "calculator, finish, python, search"


class _Echo(Tool):
    def forward(self, **kwargs):
        return ""


class _Noop(Workflow):
    async def run(self, task, uid):
        return None


def _check(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


ENVS = [
    (lambda: TextSpace(sample_max_length=True), ValueError, "TextSpace sample_max_length must be an int >="),
    (lambda: FrozenLakeEnv(p=True), ValueError, "FrozenLake p (the probability of a frozen tile) must lie in (0, 1]"),
    (lambda: FrozenLakeEnv(is_slippery="no"), ValueError, "FrozenLakeEnv is_slippery must be True or False, got 'no'"),
    (
        lambda: FrozenLakeEnv(invalid_action_reward="a"),
        ValueError,
        "FrozenLakeEnv invalid_action_reward must be a finite number, got 'a'",
    ),
    (
        lambda: FrozenLakeEnv(invalid_action_reward=float("nan")),
        ValueError,
        "FrozenLakeEnv invalid_action_reward must be a finite number, got nan",
    ),
    (
        lambda: CodeEnv(memory_mb=0),
        ValueError,
        "CodeReward memory_mb must be an int > 16 (megabytes per run), got 0",
    ),
    (
        lambda: CodeEnv(sandbox="x"),
        ValueError,
        "CodeReward sandbox must be a rllm_gym.sandbox.Sandbox or None (shared), got 'x'",
    ),
    (
        lambda: ToolEnv(tools="calculator"),
        ValueError,
        f"ToolEnv tools must be a list of tool names or Tool objects (built-ins: {BUILTINS}) or a MultiTool, "
        "got 'calculator'",
    ),
    (lambda: ToolEnv(tools=5), ValueError, "ToolEnv tools must be a list of tool names or Tool objects"),
    (lambda: ToolEnv(tasks="abc"), ValueError, "ToolEnv tasks must be a list of task dicts or None (built-in tasks)"),
    (
        lambda: ToolEnv(tool_timeout=True),
        ValueError,
        "ToolEnv timeout for 'tool_timeout' must be a positive number of seconds, got True",
    ),
    (
        lambda: ToolEnv(tool_timeouts=[1]),
        ValueError,
        "ToolEnv tool_timeouts must be a dict of tool name -> seconds, got [1]",
    ),
    (
        lambda: ToolEnv(malformed_call_penalty=float("nan")),
        ValueError,
        "ToolEnv malformed_call_penalty must be a number >= 0, got nan",
    ),
]

REWARDS_DATA_SANDBOX = [
    (lambda: CodeReward(timeout=float("inf")), ValueError, "CodeReward timeout must be a positive number of seconds"),
    (lambda: CodeReward(memory_mb=-5), ValueError, "CodeReward memory_mb must be an int > 16 (megabytes per run)"),
    (lambda: MathGrader(max_answer_chars=True), ValueError, "MathGrader max_answer_chars must be a positive int"),
    (lambda: MathGrader(use_math_verify="no"), ValueError, "MathGrader use_math_verify must be True or False"),
    (lambda: MathGrader(pool=3), ValueError, "MathGrader pool must be a MathVerifyPool or None (shared), got 3"),
    (lambda: Dataset(5), TypeError, "Dataset data must be an iterable of task dicts (e.g. a list), got int"),
    (lambda: Dataset("abc"), TypeError, "Dataset data must be an iterable of task dicts (e.g. a list), got str"),
    (lambda: Dataset([], name=3), TypeError, "Dataset name must be a str, got 3"),
    (lambda: DatasetRegistry(root=3), TypeError, "DatasetRegistry root must be a folder path (str or Path) or None"),
    (lambda: run_python("1", files=["a"]), TypeError, "sandbox files must be a dict of str -> str, got ['a']"),
    (lambda: run_python("1", env={"A": 1}), TypeError, "sandbox env must be a dict of str -> str, got {'A': 1}"),
    (lambda: run_python("1", argv="abc"), TypeError, "sandbox argv must be a list of arguments such as ['--n', '3']"),
    (lambda: EpisodeWriter(3), TypeError, "EpisodeWriter path must be a file path (str or Path), got 3"),
]

TOOLS = [
    (lambda: _Echo("echo", 3), ValueError, "tool 'echo' description must be a str, got 3"),
    (lambda: _Echo("echo", "d", max_output_chars=True), ValueError, "tool 'echo' max_output_chars must be a positive"),
    (lambda: _Echo("echo", "d", timeout=True), ValueError, "tool 'echo' timeout must be a positive number of seconds"),
    (lambda: MultiTool(5), TypeError, "MultiTool tools must be a list of built-in names or Tool objects, got 5"),
    (lambda: MultiTool(tool_map=[1]), TypeError, "MultiTool tool_map must be a dict of name -> Tool"),
    (lambda: get_parser([]), ValueError, "unknown tool parser []. Known parsers: hermes, qwen, json, openai"),
    (lambda: ToolAgent(tools=5), TypeError, "MultiTool tools must be a list of built-in names or Tool objects, got 5"),
]

POLICIES = [
    (lambda: SamplingParams(temperature="a"), ValueError, "SamplingParams.temperature must be a finite number, got"),
    (lambda: SamplingParams(temperature=True), ValueError, "SamplingParams.temperature must be a finite number"),
    (lambda: SamplingParams(temperature=float("nan")), ValueError, "SamplingParams.temperature must be a finite"),
    (lambda: SamplingParams(top_p=None), ValueError, "SamplingParams.top_p must be a finite number, got None"),
    (lambda: SamplingParams(top_k=1.5), ValueError, "SamplingParams.top_k must be an int or None, got 1.5"),
    (lambda: SamplingParams(max_tokens=None), ValueError, "SamplingParams.max_tokens must be an int, got None"),
    (lambda: SamplingParams(seed="a"), ValueError, "SamplingParams.seed must be an int or None, got 'a'"),
    (lambda: SamplingParams(stop=[1]), ValueError, "SamplingParams.stop must be a string or a list of strings"),
    (lambda: SamplingParams(stop=None), ValueError, "SamplingParams.stop must be a string or a list of strings"),
    (lambda: ScriptedPolicy(5), TypeError, "ScriptedPolicy(replies=...) takes a list of replies or a function, got 5"),
    (lambda: OpenAIPolicy(None), ValueError, "OpenAIPolicy(model=...) must be the served model's name"),
    (lambda: OpenAIPolicy(""), ValueError, "OpenAIPolicy(model=...) must be the served model's name"),
    (lambda: OpenAIPolicy("m", 3), ValueError, "OpenAIPolicy(base_url=...) must be a URL or a list of URLs, got 3"),
    (lambda: OpenAIPolicy("m", [3]), ValueError, "OpenAIPolicy(base_url=...) must be an http(s) URL like"),
    (lambda: OpenAIPolicy("m", max_concurrency=0), ValueError, "OpenAIPolicy(max_concurrency=...) must be an int >="),
    (lambda: OpenAIPolicy("m", max_concurrency="4"), ValueError, "OpenAIPolicy(max_concurrency=...) must be an int"),
    (lambda: OpenAIPolicy("m", max_retries=-1), ValueError, "OpenAIPolicy(max_retries=...) must be an int >= 0"),
    (lambda: OpenAIPolicy("m", timeout_s=0), ValueError, "OpenAIPolicy(timeout_s=...) must be a finite number of"),
    (lambda: OpenAIPolicy("m", backoff_s=-1), ValueError, "OpenAIPolicy(backoff_s=...) must be a finite number of"),
    (lambda: OpenAIPolicy("m", cooldown_s=-1), ValueError, "OpenAIPolicy(cooldown_s=...) must be a finite number"),
]

AGENTS_ENGINE_TRAIN = [
    (lambda: BaseAgent(max_history_turns="3"), ValueError, "max_history_turns must be an int >= 1 or None"),
    (lambda: BaseAgent(max_history_turns=1.5), ValueError, "max_history_turns must be an int >= 1 or None"),
    (lambda: BaseAgent(system_prompt=3), ValueError, "system_prompt must be a str or None (no system message), got 3"),
    (lambda: BaseAgent(name=""), ValueError, "name must be a non-empty str (the trajectory's name), got ''"),
    (lambda: BaseAgent(name=3), ValueError, "name must be a non-empty str (the trajectory's name), got 3"),
    (lambda: BaseAgent(enable_thinking="yes"), ValueError, "enable_thinking must be True, False or None"),
    (lambda: FrozenLakeAgent(observation_template=3), ValueError, "observation_template must contain '{observation}'"),
    (lambda: AgentWorkflowEngine(3, POLICY), TypeError, "workflow_cls must be a Workflow subclass (the class, not"),
    (lambda: AgentWorkflowEngine(_Noop(POLICY), POLICY), TypeError, "workflow_cls must be a Workflow subclass"),
    (lambda: AgentWorkflowEngine(_Noop, POLICY, n_parallel="4"), ValueError, "n_parallel must be an int >= 1, got"),
    (lambda: AgentWorkflowEngine(_Noop, POLICY, workflow_args=[1]), TypeError, "workflow_args must be a dict"),
    (
        lambda: AgentExecutionEngine(env_id="rllm/FrozenLake-v9", agent_cls=BaseAgent, policy=POLICY),
        UnknownEnvError,
        "Environment 'rllm/FrozenLake-v9' doesn't exist. Did you mean 'rllm/FrozenLake-v0'?",
    ),
    (
        lambda: AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=3, policy=POLICY),
        TypeError,
        "agent_cls must be a BaseAgent subclass (or a factory of agents), got 3",
    ),
    (
        lambda: AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=BaseAgent, policy=POLICY, max_turns=0),
        ValueError,
        "max_turns must be >= 1, got 0 (an int: LLM calls per episode)",
    ),
    (
        lambda: MultiTurnWorkflow(POLICY, env="rllm/FrozenLake-v0", agent_cls=3),
        TypeError,
        "agent_cls must be a BaseAgent subclass (or a factory of agents), got 3",
    ),
    (lambda: _Noop(3), TypeError, "policy must be a Policy (an object with an async generate() method), got 3"),
    (lambda: _Noop(POLICY, sampling_params={"temperature": 0}), TypeError, "sampling_params must be a SamplingParams"),
    (lambda: _Noop(POLICY, gamma="a"), ValueError, "gamma must be a finite number, got 'a'"),
    (lambda: _Noop(POLICY, reward_bonus_coeff="a"), ValueError, "reward_bonus_coeff must be a finite number, got 'a'"),
    (lambda: _Noop(POLICY, max_prompt_length="5"), ValueError, "max_prompt_length must be >= 1 or None (no limit)"),
    (lambda: _Noop(POLICY, timeout_s="1"), ValueError, "timeout_s must be > 0 or None (no limit), got '1'"),
    (lambda: AdvantageConfig(eps="a"), ValueError, "eps must be > 0, got a"),
    (lambda: AdvantageConfig(eps=float("nan")), ValueError, "eps must be > 0, got nan"),
    (
        lambda: AdvantageConfig(exclude_termination="timeout"),
        ValueError,
        "exclude_termination must be a tuple of reasons, got the string 'timeout': write ('timeout',)",
    ),
]


GROUPS = {
    "env": ENVS,
    "reward-data-sandbox-store": REWARDS_DATA_SANDBOX,
    "tool": TOOLS,
    "policy-sampling": POLICIES,
    "agent-engine-workflow-advantage": AGENTS_ENGINE_TRAIN,
}


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [pytest.param(*case, id=f"{group}-{i}") for group, cases in GROUPS.items() for i, case in enumerate(cases)],
)
def test_constructors_name_the_bad_argument(make, error, message):
    _check(make, error, message)


def test_episode_writer_refuses_a_folder(tmp_path):
    _check(lambda: EpisodeWriter(tmp_path), IsADirectoryError, f"EpisodeWriter path {str(tmp_path)!r} is a folder")


def test_valid_numpy_and_default_values_are_still_accepted():
    import numpy as np

    assert SamplingParams(max_tokens=np.int64(4), seed=np.int64(1), temperature=np.float32(0.5)).max_tokens == 4
    assert FrozenLakeEnv(p=1, invalid_action_reward=-1).invalid_action_reward == -1.0
    assert CodeReward(memory_mb=64, timeout=1).memory_mb == 64
    assert Dataset(iter([{"a": 1}]))[0] == {"a": 1}
