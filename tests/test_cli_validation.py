"""The rllm-gym CLI rejects bad flags with a usage error naming the flag and the allowed values, before any model
loads (in-process: these never reach a policy)."""

from __future__ import annotations

import pytest

from rllm_gym.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "--temperature", "-1"], "--temperature must be >= 0 (0 = greedy), got -1.0"),
        (["eval", "--top-p", "0"], "--top-p must be in (0, 1] (1 = off), got 0.0"),
        (["eval", "--top-p", "1.5"], "--top-p must be in (0, 1] (1 = off), got 1.5"),
        (["eval", "--timeout", "0"], "--timeout must be > 0 seconds (leave it out for no limit), got 0.0"),
        (["eval", "--env-args", "[1]"], """--env-args must be a JSON object such as '{"size": 6}', got [1]"""),
        (["eval", "--agent-args", '"x"'], """--agent-args must be a JSON object such as '{"size": 6}', got 'x'"""),
        (["eval", "--agent", "nocolon"], "--agent must look like 'package.module:Class', got 'nocolon'"),
        (["eval", "--n", "0"], "--n must be >= 1, got 0"),
        (["eval", "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
        (["eval", "--env", "rllm/Nope-v0"], "--env: Environment 'rllm/Nope-v0' doesn't exist."),
        (["eval", "--policy", "x"], "argument --policy: invalid choice: 'x' (choose from 'hf', 'openai', 'vllm')"),
        (["eval", "--thinking", "maybe"], "argument --thinking: invalid choice: 'maybe' (choose from 'on', 'off')"),
        (["eval", "--policy", "openai"], "--policy openai needs --model (the served or loaded model name)"),
        (["view", "/nonexistent/episodes.jsonl"], "rllm-gym view: error: /nonexistent/episodes.jsonl is not a file"),
    ],
)
def test_bad_flags_are_usage_errors_that_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
