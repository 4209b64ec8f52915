"""reasoning-gym suites: generated offline (the same tasks every time), scored by each dataset's own scorer, posed
with reasoning-gym's default system prompt and answered in <answer></answer> tags."""

from __future__ import annotations

from rllm_gym.benchmarks import benchmark, load_benchmark
from rllm_gym.benchmarks.reasoning_gym import SUITES, TASKS_PER_DATASET
from rllm_gym.registry import make


def test_a_suite_is_its_datasets_eval_split_the_same_on_every_load():
    bench = benchmark("rg-logic")
    tasks = load_benchmark("rg-logic")
    assert len(tasks) == bench.size == TASKS_PER_DATASET * len(SUITES["logic"])
    assert {task["dataset"] for task in tasks} == set(SUITES["logic"])
    assert [task["id"] for task in tasks[:2]] == ["rg-logic/0", "rg-logic/1"]
    assert tasks == load_benchmark("rg-logic", data_dir="/ignored: generated suites read no data")


def test_answers_in_answer_tags_are_scored_by_the_dataset():
    bench = benchmark("rg-arithmetic")
    tasks = load_benchmark("rg-arithmetic")[:5]
    env = make(bench.env, **bench.env_args)
    for task in tasks:
        env.reset(options={"task": task})
        _, reward, _, _, info = env.step(f"Thinking done.\n<answer>{task['ground_truth']}</answer>")
        assert (reward, info["is_correct"]) == (1.0, True), task
        env.reset(options={"task": task})
        _, reward, _, _, _ = env.step("<answer>not an answer at all</answer>")
        assert reward == 0.0


def test_the_system_prompt_is_reasoning_gyms_default():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    args = benchmark("rg-algebra").resolved_agent_args()
    assert args == {"system_prompt": SYSTEM_PROMPTS["default"]} and "<answer>" in args["system_prompt"]
