"""A trained model folder remembers how it was trained: final/ and each checkpoint hold rllm_gym_training.json and a
filled-in model card, and ``rllm-gym eval --model <folder>`` evaluates in that prompt format unless flags override."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rllm_gym.store import read_episodes

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}
SYSTEM_PROMPT = yaml.safe_load(TINY.read_text())["agent_args"]["system_prompt"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=300)


@pytest.mark.slow
def test_model_folders_record_their_training_and_eval_uses_it(tmp_path):
    output_dir = tmp_path / "run"
    trained = run(
        "-m", "rllm_gym.train.grpo", "--config", str(TINY), "--output_dir", str(output_dir), "--save_steps", "2"
    )
    assert trained.returncode == 0, trained.stderr

    final = output_dir / "final"
    record = json.loads((final / "rllm_gym_training.json").read_text())
    assert record["env"] == ["rllm/FrozenLake-v0"] and record["steps"] == 3 and record["max_steps"] == 3
    assert record["agent_args"]["system_prompt"] == SYSTEM_PROMPT and record["env_args"] == {}
    assert record["max_turns"] == 2 and record["max_completion_length"] == 4
    checkpoint = json.loads((output_dir / "checkpoint-2" / "rllm_gym_training.json").read_text())
    assert checkpoint["steps"] == 2 and checkpoint["agent_args"] == record["agent_args"]
    card = (final / "README.md").read_text()
    for fact in (
        "# run/final",
        "- Base model: the embedded tiny model",
        "- Environments: `rllm/FrozenLake-v0` (tasks: frozenlake_demo_maps.jsonl)",
        "- Steps: 3 of 3",
        SYSTEM_PROMPT,
        "- Env arguments: none (the env's defaults)",
        "- Greedy success on training tasks, before training: not measured (eval_greedy: false)",
        "- Greedy success on held-out tasks (never trained on), after training: not measured (no eval_tasks: no "
        "tasks were held out)",
    ):
        assert fact in card, card
    assert "None" not in card and ": \n" not in card
    assert (output_dir / "checkpoint-2" / "README.md").is_file() and not (output_dir / "README.md").exists()

    out = tmp_path / "episodes.jsonl"
    evaluated = run("-m", "rllm_gym.cli", "eval", "--model", str(final), "--tasks", "1", "--n", "1", "--out", str(out))
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"rllm-gym eval: settings from {final / 'rllm_gym_training.json'}: --env rllm/FrozenLake-v0" in (
        evaluated.stderr
    )
    assert "--max-turns 2, --max-tokens 4" in evaluated.stderr
    [episode] = read_episodes(out)
    first_chat = episode.trajectories[0].steps[0].chat_completions
    assert first_chat[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert len(episode.trajectories[0].steps) <= 2

    out2 = tmp_path / "override.jsonl"
    overridden = run(
        "-m", "rllm_gym.cli", "eval", "--model", str(final), "--tasks", "1", "--n", "1", "--out", str(out2),
        "--agent-args", '{"system_prompt": "Be brief."}',
    )  # fmt: skip
    assert overridden.returncode == 0, overridden.stderr
    assert "(given on the command line instead: --agent-args)" in overridden.stderr
    [episode] = read_episodes(out2)
    assert episode.trajectories[0].steps[0].chat_completions[0]["content"] == "Be brief."


def test_the_card_suggests_evaluating_on_the_held_out_tasks(tmp_path, monkeypatch):
    """The card's eval command scores the held-out tasks where they are a file or a seed range, and says so where
    they are not (tasks drawn by seed may be ones the model trained on)."""
    from rllm_gym.train.model_record import eval_command, heldout_files

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "held.jsonl").write_text('{"id": "a"}\n')
    files = heldout_files(["held.jsonl", "0.1"], tmp_path / "configs")
    assert files == [str(Path("configs") / "held.jsonl"), None]  # found next to the config, named from here
    why, command = eval_command({"heldout_data": files, "eval_tasks": ["held.jsonl", "0.1"]})
    assert command == "rllm-gym eval --model <this folder> --data configs/held.jsonl --n 4" and "held-out" in why
    why, command = eval_command({"heldout_data": [None], "eval_tasks": ["seeds:1000-1064"]})
    assert command == "rllm-gym eval --model <this folder> --seed 1000 --tasks 64 --n 4" and "held-out" in why
    why, command = eval_command({"heldout_data": [None], "eval_tasks": ["0.1"]})
    assert command.endswith("--tasks 64 --n 4") and "may include tasks it trained on" in why
    assert heldout_files(None, tmp_path) is None
