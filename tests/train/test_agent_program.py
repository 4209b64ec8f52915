"""GRPO trains an agent program (``agent_program``/``reward_fn``): the env supplies the tasks, the program's calls
through a gateway are the episodes, and the trainer's own model answers them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest

from rllm_gym.train.grpo import load_config, main

TINY = Path(__file__).resolve().parents[2] / "train" / "configs" / "test_tiny.yaml"
SEEN: list[dict] = []


async def program(task, base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": f"Map: {task.get('map', task)}. Your move?"}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again?"}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    SEEN.append(task)
    return second.choices[0].message.content


def reward(task, output):
    return float(len(output or "") % 2)  # any signal that varies within a group


@pytest.mark.slow  # ~20-30 s on 2 cores
def test_grpo_trains_an_agent_program(tmp_path):
    SEEN.clear()
    flags = ["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--max_steps", "2", "--eval_greedy", "true"]
    flags += ["--eval_limit", "2", "--num_generations", "4"]  # 4 replies a group: their rewards rarely all agree
    flags += ["--agent_program", f"{__name__}:program", "--reward_fn", f"{__name__}:reward"]
    summary = main(flags)
    assert summary["config"]["agent_program"] == f"{__name__}:program"
    assert summary["termination_reasons"] == {"env_done": 2 * 2 * 4} and not summary["errors"]
    # 16 training episodes, and the greedy evaluations (2 training tasks, at step 0 and step 2) ran the program too.
    assert len(SEEN) == 16 + 2 * 2 and all(isinstance(task, dict) for task in SEEN)  # the env's task dicts
    assert "evaluation_before" in summary and "evaluation_after" in summary
    assert (tmp_path / "run" / "final" / "config.json").is_file()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [record for record in map(json.loads, lines) if "grad_norm" in record]  # the training steps' records
    assert len(steps) == 2
    for step in steps:
        # Both calls of an episode are one training row (the second continued the first's tokens).
        assert step["rollout/rows_per_trajectory"] == 1.0 and step["rollout/prefix_mismatch"] == 0.0
        assert step["rollout/turns"] == 2.0
    # They trained (sampled replies: a step whose groups all agree by chance has nothing to learn from).
    assert any(step["advantages/std"] > 0 and step["grad_norm"] > 0 for step in steps)


def test_agent_program_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match=re.escape("reward_fn scores an agent_program's output")):
        main(["--config", str(TINY), "--output_dir", str(tmp_path / "a"), "--reward_fn", f"{__name__}:reward"])
    with pytest.raises(ValueError, match=re.escape("agent_program must be 'module:function'")):
        main(["--config", str(TINY), "--output_dir", str(tmp_path / "b"), "--agent_program", "program"])
    config, _ = load_config(["--config", str(TINY), "--agent_program", f"{__name__}:program"])
    assert config.agent_program == f"{__name__}:program" and config.reward_fn is None
