"""TrainConfig rejects bad values with a message naming the field and what is allowed."""

from __future__ import annotations

import re

import pytest

from rllm_gym.train.grpo import TrainConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env": "rllm/FrozenLake-v0"}, "env must be a list of env ids, got the string 'rllm/FrozenLake-v0'"),
        ({"prompts_per_step": 0}, "prompts_per_step must be >= 1, got 0"),
        ({"max_turns": 0}, "max_turns must be >= 1, got 0"),
        ({"max_completion_length": 0}, "max_completion_length must be >= 1, got 0"),
        ({"max_steps": 0}, "max_steps must be >= 1, got 0"),
        ({"save_steps": 0}, "save_steps must be >= 1, got 0"),
        ({"lora_r": 0}, "lora_r must be >= 1, got 0"),
        ({"warm_start_steps": -1}, "warm_start_steps must be >= 0"),
        ({"warm_start_steps": 5, "warm_start_replies": []}, "needs at least one entry in warm_start_replies"),
        ({"temperature": -1}, "temperature must be >= 0, got -1"),
        ({"learning_rate": 0}, "learning_rate must be > 0, got 0"),
        ({"beta": -0.1}, "beta must be >= 0 (0 = no KL term), got -0.1"),
        ({"gamma": 2}, "gamma must be in [0, 1], got 2"),
        ({"env_weights": [-1.0]}, "env_weights must be >= 0 with a positive sum, got [-1.0]"),
        ({"advantage_mode": "x"}, "advantage_mode must be one of broadcast, per_step, state, got 'x'"),
        ({"exclude_termination": ["bogus"]}, "unknown reasons bogus; allowed: env_done, max_turns_exceeded"),
    ],
)
def test_bad_fields_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**kwargs)
