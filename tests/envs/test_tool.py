"""Tests for envs/tool.py: the rllm/Tool-v0 environment, its built-in tasks and scripted tool-using policies."""

from __future__ import annotations

import re
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rllm_gym
from rllm_gym.envs.tool import ToolEnv, builtin_tasks
from rllm_gym.tools import HermesToolParser, JsonBlockToolParser, MultiTool, tool
from rllm_gym.tools.search import tokenize
from rllm_gym.types import ModelOutput, RewardOutput, ToolCall

HERMES = HermesToolParser()
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def call(name: str, **arguments) -> str:
    return HERMES.render_calls([ToolCall(name=name, arguments=arguments)])


def exact(task_info: dict, action: str) -> RewardOutput:
    ok = action.strip() == str(task_info["ground_truth"])
    return RewardOutput(reward=float(ok), is_correct=ok)


def read_number(observation: str, question: str) -> str:
    """A tiny extractive reader: the number in the retrieved sentence sharing most words with the question."""
    words = set(tokenize(question))
    passages = [re.sub(r"^\[\d+\] [^:]*: ", "", p) for b in _RESPONSE.findall(observation) for p in b.split("\n\n")]
    sentences = [s for passage in passages for s in re.split(r"(?<=\.)\s+", passage)]
    best = max((s for s in sentences if re.search(r"\b\d+\b", s)), key=lambda s: len(words & set(tokenize(s))))
    return re.search(r"\b\d+\b", best).group()


def tool_policy(env: gym.Env, task: dict) -> tuple[float, dict]:
    """Scripted: calculator (arithmetic) or search + reader (lookup), then finish with what the tool said."""
    obs, _ = env.reset(options={"task": task})
    if task["kind"] == "arithmetic":
        obs, reward, terminated, _, info = env.step(
            f"I'll compute it.\n{call('calculator', expression=task['expression'])}"
        )
        answer = _RESPONSE.findall(obs)[0]
    else:
        obs, reward, terminated, _, info = env.step(call("search", query=task["question"]))
        answer = read_number(obs, task["question"])
    assert not terminated and reward == 0.0 and info["n_tool_calls"] == 1
    _, reward, terminated, truncated, info = env.step(call("finish", response=answer))
    assert terminated and not truncated
    return reward, info


def guess_policy(env: gym.Env, task: dict) -> float:
    """Scripted without tools: answer with the first number in the question (or 42)."""
    env.reset(options={"task": task})
    numbers = re.findall(r"\d+", task["question"])
    _, reward, terminated, _, _ = env.step(f"The answer is {numbers[0] if numbers else 42}.")
    assert terminated
    return reward


def test_registered_and_passes_check_env():
    assert "rllm/Tool-v0" in rllm_gym.env_ids()
    env = gym.make("rllm/Tool-v0")
    assert env.spec.max_episode_steps == 16
    check_env(env.unwrapped, skip_render_check=True)


def test_builtin_tasks_have_the_documented_fields():
    tasks = builtin_tasks()
    assert len(tasks) == 34 and len({t["id"] for t in tasks}) == 34
    assert {t["kind"] for t in tasks} == {"arithmetic", "lookup"}
    assert all(t["question"] and t["ground_truth"] for t in tasks)


def test_scripted_tool_policy_solves_every_builtin_task_and_guessing_fails():
    env = gym.make("rllm/Tool-v0")
    tasks = builtin_tasks()
    solved = 0
    for task in tasks:
        reward, info = tool_policy(env, task)
        assert info["is_correct"], (task["id"], info["final_answer"])
        solved += reward == 1.0
    assert solved == len(tasks)
    guessed = sum(guess_policy(env, task) == 1.0 for task in tasks)
    assert guessed <= len(tasks) // 10


def test_reset_draws_seeded_tasks_and_reports_the_prompt():
    env = ToolEnv(reward_fn=exact)
    obs_a, info_a = env.reset(seed=5)
    obs_b, info_b = env.reset(seed=5)
    assert obs_a == obs_b == info_a["task"]["question"] and info_a == info_b
    assert info_a["tool_names"] == ["calculator", "search", "python", "finish"]
    assert info_a["system_prompt"].startswith("# Tools") and "<tools>" in info_a["system_prompt"]
    assert info_a["system_prompt"].endswith("Call the finish tool with your final answer when you know it.")
    assert info_a["tool_calls_left"] == 8 and info_a["final_answer"] is None


def test_several_calls_run_concurrently_and_results_keep_call_order():
    @tool
    def nap(seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return f"slept {seconds}"

    env = ToolEnv(tools=["calculator", "finish"], tool_map={"nap": nap}, reward_fn=exact)
    env.reset(options={"task": {"question": "q", "ground_truth": "1"}})
    reply = HERMES.render_calls(
        [ToolCall(name="nap", arguments={"seconds": 0.3})] * 3
        + [ToolCall(name="calculator", arguments={"expression": "6*7"})]
    )
    start = time.monotonic()
    obs, reward, terminated, truncated, info = env.step(reply)
    assert time.monotonic() - start < 0.8
    assert _RESPONSE.findall(obs) == ["slept 0.3", "slept 0.3", "slept 0.3", "42"]
    assert obs.endswith("Tool calls left: 4.")
    assert (reward, terminated, truncated, info["n_tool_calls"]) == (0.0, False, False, 4)


def test_malformed_calls_become_observations_with_a_penalty():
    env = ToolEnv(reward_fn=exact, malformed_call_penalty=0.1, max_reply_penalty=1.0)
    env.reset(options={"task": {"id": "t", "question": "q", "ground_truth": "4"}})
    reply = (
        call("calculator", expression="2+2")
        + call("calculater", expression="1")
        + call("calculator", expression=4)
        + call("calculator")
        + "<tool_call>{not json</tool_call>"
    )
    obs, reward, terminated, truncated, info = env.step(reply)
    assert not terminated and not truncated
    assert reward == pytest.approx(-0.4)
    assert _RESPONSE.findall(obs) == [
        "4",
        "Error: unknown tool 'calculater'; available tools: calculator, search, python, finish",
        "Error: invalid arguments for tool 'calculator': 4 is not of type 'string' (at 'expression')",
        "Error: invalid arguments for tool 'calculator': 'expression' is a required property",
        "Error: invalid JSON inside <tool_call>: Expecting property name enclosed in double quotes at character 1",
    ]
    assert [m["kind"] for m in info["malformed_calls"]] == [
        "unknown_tool",
        "invalid_arguments",
        "invalid_arguments",
        "invalid_json",
    ]
    assert info["n_tool_calls"] == 1
    _, reward, terminated, _, info = env.step(call("finish", response="4"))
    assert (reward, terminated, info["is_correct"], info["final_answer"]) == (1.0, True, True, "4")


def test_the_malformed_call_penalty_is_capped_per_reply_and_per_episode():
    env = ToolEnv(reward_fn=exact)  # 0.05 a call, at most 0.2 a reply and 0.5 an episode
    assert env.metadata["step_reward_range"] == (-0.2, 1.0)
    assert env.metadata["episode_return_range"] == (-0.5, 1.0)
    env.reset(options={"task": {"question": "q", "ground_truth": "4"}})
    spam = "<tool_call></tool_call>" * 4000  # used to cost 4,000 x 0.05 = -200
    rewards = [env.step(spam)[1] for _ in range(3)]
    assert rewards == pytest.approx([-0.2, -0.2, -0.1])
    _, reward, terminated, _, _ = env.step(spam + call("finish", response="4"))
    assert (reward, terminated) == (1.0, True)  # the episode's penalty budget is spent: the answer keeps its 1.0
    env.reset(options={"task": {"question": "q", "ground_truth": "4"}})  # a new episode, a new budget
    assert env.step(spam)[1] == pytest.approx(-0.2)


def test_a_reward_function_outside_the_bounds_is_clipped_into_them():
    def generous(task, answer):
        return RewardOutput(reward=50.0, is_correct=True)

    env = ToolEnv(reward_fn=generous)
    env.reset(options={"task": {"question": "q", "ground_truth": "4"}})
    _, reward, _, _, info = env.step("4")
    assert (reward, info["reward_clipped_from"]) == (1.0, 50.0)
    with pytest.raises(ValueError, match=re.escape("ToolEnv reward_bounds must be (low, high)")):
        ToolEnv(reward_bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match=re.escape("ToolEnv max_reply_penalty must be a finite number >= 0")):
        ToolEnv(max_reply_penalty=-1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_reward_is_an_error_never_a_clipped_or_nan_reward(bad):
    env = ToolEnv(reward_fn=lambda task, answer: RewardOutput(reward=bad, is_correct=True))
    env.reset(options={"task": {"question": "q", "ground_truth": "4"}})
    with pytest.raises(ValueError, match=re.escape(f"returned a non-finite reward {bad!r}: return a finite one")):
        env.step("4")
    env = ToolEnv(reward_fn=lambda task, answer: 1.0)
    env.reset(options={"task": {"question": "q", "ground_truth": "4"}})
    with pytest.raises(TypeError, match=re.escape("returned float, not a RewardOutput")):
        env.step("4")


def test_a_question_longer_than_the_observation_space_is_refused_at_reset():
    env = ToolEnv()
    question = "x" * (env.observation_space.max_length + 1)
    with pytest.raises(ValueError, match=re.escape("the observation space's limit of 200000: shorten the question")):
        env.reset(options={"task": {"question": question, "ground_truth": "4"}})


def test_deeply_nested_arguments_are_a_malformed_call_not_a_crash():
    env = ToolEnv()
    env.reset(options={"task": {"question": "q", "ground_truth": "4"}})
    deep = "[" * 300 + "]" * 300
    reply = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2", "x": ' + deep + "}}</tool_call>"
    observation, reward, terminated, _, info = env.step(reply)
    assert [call["kind"] for call in info["malformed_calls"]] == ["invalid_call"]
    assert "nest more than 64 levels deep" in observation and (reward, terminated) == (-0.05, False)
    env.close()


def test_step_before_the_first_reset_says_so():
    with pytest.raises(RuntimeError, match=re.escape("ToolEnv.step called before reset(): call reset() first")):
        ToolEnv().step("4")


def test_reply_without_tool_call_is_the_final_answer():
    env = ToolEnv(reward_fn=exact)
    env.reset(options={"task": {"question": "2+2?", "ground_truth": "4"}})
    obs, reward, terminated, truncated, _ = env.step("4")
    assert (obs, reward, terminated, truncated) == ("Answer submitted: correct.", 1.0, True, False)
    with pytest.raises(RuntimeError, match=re.escape("ToolEnv.step called after the episode ended")):
        env.step("4")


def test_tool_budget_truncates_the_episode():
    env = ToolEnv(reward_fn=exact, max_tool_calls=2)
    env.reset(options={"task": {"question": "q", "ground_truth": "1"}})
    obs, _, terminated, truncated, info = env.step(call("calculator", expression="1") * 3)
    assert _RESPONSE.findall(obs)[2] == (
        "Error: not run: the budget of 2 tool calls is used up; call finish with your answer"
    )
    assert (terminated, truncated, info["tool_calls_left"]) == (False, False, 0)
    obs, reward, terminated, truncated, _ = env.step(call("calculator", expression="1"))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert obs.startswith("No tool calls left (the budget is 2)")


def test_per_tool_timeout():
    @tool
    def stall(seconds: float) -> str:
        """Stall."""
        time.sleep(seconds)
        return "late"

    env = ToolEnv(tools=["finish"], tool_map={"stall": stall}, reward_fn=exact, tool_timeouts={"stall": 0.2})
    env.reset(options={"task": {"question": "q", "ground_truth": "1"}})
    obs, *_ = env.step(call("stall", seconds=1.5))
    assert _RESPONSE.findall(obs) == ["Error: tool 'stall' timed out after 0.2 s"]


def test_structured_model_output_and_other_parsers():
    env = ToolEnv(parser="openai", reward_fn=exact)
    env.reset(options={"task": {"question": "q", "ground_truth": "1024"}})
    output = ModelOutput(tool_calls=[ToolCall(name="calculator", arguments={"expression": "2**10"}, id="c1")])
    obs, _, _, _, info = env.step(output)
    assert info["tool_outputs"][0]["output"] == "1024" and info["tool_outputs"][0]["call_id"] == "c1"
    assert obs == "[calculator] 1024\n\nTool calls left: 7."
    _, reward, terminated, _, _ = env.step(ModelOutput(text="1024", content="1024"))
    assert (reward, terminated) == (1.0, True)

    env = ToolEnv(parser=JsonBlockToolParser(), reward_fn=exact)
    env.reset(options={"task": {"question": "q", "ground_truth": "7"}})
    _, reward, terminated, _, _ = env.step('```json\n{"name": "finish", "arguments": {"response": "7"}}\n```')
    assert (reward, terminated) == (1.0, True)


def test_env_without_finish_tool_and_non_text_actions():
    env = ToolEnv(tools=MultiTool(["calculator"]), reward_fn=exact)
    assert env.system_prompt.endswith("Reply without a tool call to give your final answer.")
    env.reset(options={"task": {"question": "q", "ground_truth": "1"}})
    obs, reward, terminated, _, info = env.step(None)  # type: ignore[arg-type]
    assert _RESPONSE.findall(obs) == ["Error: a reply must be text, got NoneType"]
    assert (reward, terminated, info["malformed_calls"][0]["kind"]) == (-0.05, False, "invalid_input")


def test_bad_arguments_and_tasks_are_rejected():
    with pytest.raises(ValueError, match=re.escape("task['question'] must be a non-empty string, got None")):
        ToolEnv(tasks=[{"ground_truth": "1"}])
    with pytest.raises(ValueError, match=re.escape("task needs a 'ground_truth'")):
        ToolEnv().reset(options={"task": {"question": "q"}})
    with pytest.raises(ValueError, match=re.escape("ToolEnv max_tool_calls must be a non-negative int, got -1")):
        ToolEnv(max_tool_calls=-1)
    with pytest.raises(ValueError, match=re.escape("ToolEnv tool_timeouts names unknown tools ['web']")):
        ToolEnv(tool_timeouts={"web": 1.0})
    with pytest.raises(ValueError, match=re.escape("ToolEnv malformed_call_penalty must be a number >= 0")):
        ToolEnv(malformed_call_penalty=-1)
    with pytest.raises(ValueError, match=re.escape("unknown tool parser 'xml'")):
        ToolEnv(parser="xml")
    with pytest.raises(ValueError, match=re.escape("ToolEnv tasks is empty")):
        ToolEnv(tasks=[])


def test_a_tool_failed_by_the_infrastructure_marks_the_step_infra_failed():
    """The python tool's sandbox could not run: the model did nothing wrong, so the step says infra_failed (the
    engine retries the episode); a program that fails on its own is the model's to handle."""
    from rllm_gym.sandbox import ExecutionStatus, SandboxResult
    from rllm_gym.tools.builtins import PythonTool

    class BrokenSandboxPython(PythonTool):
        def forward(self, code: str):
            if "crash" in code:
                return super().forward(code)
            return self._to_output(SandboxResult(ExecutionStatus.SANDBOX_ERROR, error="zygote cannot start"))

    env = ToolEnv(tools=["finish"], tool_map={"python": BrokenSandboxPython()}, reward_fn=exact)
    env.reset(options={"task": {"question": "q", "ground_truth": "1"}})
    _, _, _, _, info = env.step(call("python", code="print(1)"))
    assert info["infra_failed"] and info["tool_outputs"][0]["metadata"]["infra_failed"]
    _, _, _, _, info = env.step(call("python", code="raise SystemExit('crash')"))
    assert not info["infra_failed"] and info["tool_outputs"][0]["metadata"]["status"] == "runtime_error"
    _, reward, terminated, _, info = env.step(call("finish", response="1"))
    assert (reward, terminated, info["infra_failed"]) == (1.0, True, False)
