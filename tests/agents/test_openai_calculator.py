"""The shipped calculator agent program: its tool runs calls and answers malformed ones with an error to read."""

from __future__ import annotations

from types import SimpleNamespace

from rllm_gym.agents.openai_calculator import make_task, reward, run_tool


def call(name: str, arguments: str) -> SimpleNamespace:
    return SimpleNamespace(function=SimpleNamespace(name=name, arguments=arguments))


def test_the_tool_adds_and_explains_bad_calls():
    assert run_tool(call("add", '{"a": 2, "b": "3"}')) == "5"
    assert run_tool(call("mul", "{}")) == "error: no tool named 'mul'; the only tool is add"
    assert run_tool(call("add", "{not json")).startswith("error: add takes {'a': int, 'b': int} (JSONDecodeError")
    assert run_tool(call("add", '{"a": 1}')).startswith("error: add takes {'a': int, 'b': int} (KeyError")


def test_seeds_make_tasks_and_the_reward_reads_the_answer():
    task = make_task(3)
    assert task == make_task(3) and task["question"].startswith("What is ")
    assert reward(3, f"It is {task['answer']}.") == 1.0
    assert reward(3, None) == 0.0 and reward({"question": "q", "answer": 7}, "8") == 0.0
