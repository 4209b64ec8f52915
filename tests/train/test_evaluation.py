"""train/evaluation.py: pass@k, and evaluation before, every eval_steps and after training, on the right tasks, through
a resume."""

import json
import re
from pathlib import Path
from unittest.mock import patch

import pytest

from rllm_gym.train import evaluation
from rllm_gym.train.evaluation import pass_at_k
from rllm_gym.train.grpo import main
from rllm_gym.train.run_dir import OutputDirError
from rllm_gym.train.sequences import decode_prompt
from rllm_gym.train.trainer import RLLMGRPOTrainer

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
HELD_OUT = [{"id": "held-a", "map": ["SFH", "FFF", "HFG"]}, {"id": "held-b", "map": ["SHF", "FFH", "FFG"]}]


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0  # one of four samples right: some draw of all four holds it
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)


def run(tmp_path, *flags):
    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(task) + "\n" for task in HELD_OUT))
    base = [
        "--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--eval_greedy", "true",
        "--eval_tasks", str(tmp_path / "held_out.jsonl"), "--eval_steps", "2", "--eval_n", "2", "--save_steps", "2",
    ]  # fmt: skip
    calls, prompts = [], []
    original_run, original_rollout = evaluation.run_episodes, RLLMGRPOTrainer._generate_and_score_completions

    def spy_run(config, env_id, policy, tasks, **kwargs):
        calls.append((tasks, kwargs.get("n_rollouts", 1), kwargs["sampling_params"].temperature))
        return original_run(config, env_id, policy, tasks, **kwargs)

    def spy_rollout(self, inputs):
        prompts.extend(decode_prompt(example["prompt"])[1] for example in inputs)
        return original_rollout(self, inputs)

    with (
        patch.object(evaluation, "run_episodes", spy_run),
        patch.object(RLLMGRPOTrainer, "_generate_and_score_completions", spy_rollout),
    ):
        summary = main([*base, *flags])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return summary, calls, prompts, records


def evaluated_steps(records):
    return [record["step"] for record in records if "eval_heldout/greedy" in record]


def test_evaluation_runs_before_every_eval_steps_and_after_on_the_right_tasks(tmp_path):
    summary, calls, prompts, records = run(tmp_path, "--max_steps", "3")
    assert evaluated_steps(records) == [0, 2, 3]  # before, at step 2, after the last step: each once
    for record in records:
        if "eval_heldout/greedy" in record:
            assert {"eval_train/greedy", "eval_heldout/pass@1", "eval_heldout/pass@2"} <= set(record)
    # Each evaluation: greedy on the training tasks, greedy and 2 samples each on the held-out ones.
    held_out = [task for tasks, _, _ in calls for task in tasks if task in HELD_OUT]
    assert len(calls) == 3 * 3 and len(held_out) == 3 * 2 * 2
    assert [(n, temperature) for tasks, n, temperature in calls if tasks == HELD_OUT] == [(1, 0.0), (2, 1.0)] * 3
    training = [tasks for tasks, _, _ in calls if tasks != HELD_OUT]
    assert all(task not in HELD_OUT for tasks in training for task in tasks) and training[0]
    # Training never saw a held-out lake.
    assert prompts and not [task for task in prompts if task["map"] in [t["map"] for t in HELD_OUT]]
    assert summary["heldout_before"].keys() == summary["heldout_after"].keys() == {"rllm/FrozenLake-v0"}
    assert summary["evaluation_after"]["step"] == 3
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "Greedy success on held-out tasks (never trained on), after training: rllm/FrozenLake-v0" in card


def test_a_resumed_run_keeps_its_evaluations_and_split(tmp_path):
    run(tmp_path, "--max_steps", "2")
    summary, calls, _, records = run(tmp_path, "--max_steps", "4", "--resume", "true")
    assert evaluated_steps(records) == [0, 2, 4]  # the first part's evaluations kept, the "before" not redone
    assert len(calls) == 3  # only the evaluation after step 4 ran in the resumed part
    assert summary["evaluation_before"] == json.loads((tmp_path / "run" / "run.json").read_text())["evaluation_before"]
    # The held-out tasks changed under the run: resuming it would mix two splits.
    changed = [HELD_OUT[0], {"id": "held-c", "map": ["SFF", "FFF", "FFG"]}]
    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(task) + "\n" for task in changed))
    with (
        pytest.raises(OutputDirError, match=re.escape("the eval split rebuilt from the run's sources differs")),
        patch.object(evaluation, "run_episodes"),
    ):
        main(
            ["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--eval_tasks",
             str(tmp_path / "held_out.jsonl"), "--eval_steps", "2", "--eval_n", "2", "--eval_greedy", "true",
             "--save_steps", "2", "--max_steps", "6", "--resume", "true"]
        )  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--eval_n", "4"], "eval_n samples the eval split: set eval_tasks too"),
        (["--eval_n", "1", "--eval_tasks", "0.5"], "eval_n must be 0 (greedy only) or >= 2"),
        (["--eval_tasks", "0.5", "0.5"], "eval_tasks has 2 entries for 1 envs"),
        (["--eval_steps", "2"], "eval_steps needs something to evaluate"),
    ],
)
def test_evaluation_flags_are_checked(flags, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        main(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *flags])
