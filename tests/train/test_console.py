"""What a training run shows, driven as the command line: progress bars on a terminal only (and not with ``--progress
false`` or ``TQDM_DISABLE=1``), one line per checkpoint saved, and no library warning or shard bar in between."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rllm_gym.train.config import TrainConfig, load_config
from rllm_gym.train.console import progress_bar

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {key: value for key, value in os.environ.items() if key != "TQDM_DISABLE"}
ENV.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
BARS = ("warm start", "eval before", "train", "eval at step 2")


def train(
    tmp_path: Path, *args: str, terminal: Callable[..., tuple[int, str]] | None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """One short run (a warm start step, the greedy evaluations, a checkpoint per step); its exit status, stdout and
    stderr. ``terminal``: the ``stderr_on_a_terminal`` fixture to run it with stderr on a pseudo-terminal."""
    command = [
        sys.executable,
        "-m",
        "rllm_gym.train.grpo",
        "--config",
        str(TINY),
        "--output_dir",
        str(tmp_path / "run"),
    ]
    command += ["--warm_start_steps", "1", "--eval_greedy", "true", "--save_steps", "1", *args]
    with open(tmp_path / "stdout.txt", "w+") as stdout:
        if terminal is None:
            result = subprocess.run(
                command, stdout=stdout, stderr=subprocess.PIPE, text=True, env={**ENV, **(env or {})}
            )
            stdout.seek(0)
            return result.returncode, stdout.read(), result.stderr
        status, stderr = terminal(command, stdout=stdout, env={**ENV, **(env or {})})
        stdout.seek(0)
        return status, stdout.read(), stderr


def test_a_run_on_a_terminal_draws_bars_and_says_each_checkpoint_once(tmp_path, stderr_on_a_terminal):
    status, stdout, stderr = train(tmp_path, "--max_steps", "2", terminal=stderr_on_a_terminal)
    assert status == 0, stderr
    for desc, total in zip(BARS, (1, 8, 2, 8), strict=True):  # 8: the tasks of frozenlake_demo_maps.jsonl
        assert re.search(rf"{desc}: 100%\|.*\| {total}/{total} ", stderr), f"no finished {desc!r} bar in {stderr!r}"
    lines = stdout.splitlines()
    assert [line for line in lines if line.startswith("saved ")] == [
        "saved checkpoint-1 (step 1/2)",
        "saved checkpoint-2 (step 2/2)",
        f"saved {tmp_path / 'run' / 'final'} (the trained model, step 2)",
    ]
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1", "2"]
    # Nothing but our bars on stderr: no "Loading weights" / "Loading checkpoint shards" / "Writing model shards" bar,
    # and none of the FutureWarnings transformers and TRL repeated at every step; nor DeepSpeed's CPU notice on stdout.
    others = [part for part in re.split(r"[\r\n]+", stderr) if part.strip() and not part.startswith(BARS)]
    assert others == []
    assert "Setting accelerator" not in stdout


@pytest.mark.parametrize(("args", "terminal"), [(["--progress", "false"], True), ([], False)], ids=["off", "piped"])
def test_no_bars_with_progress_off_or_stderr_not_a_terminal(tmp_path, args, terminal, stderr_on_a_terminal):
    status, stdout, stderr = train(
        tmp_path, "--max_steps", "1", *args, terminal=stderr_on_a_terminal if terminal else None
    )
    assert status == 0, stderr
    assert "%|" not in stderr and "\r" not in stderr.replace("\r\n", "\n")
    assert "saved checkpoint-1 (step 1/1)" in stdout.splitlines()  # the lines stay


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_follow_tqdm_disable_and_show_only_on_the_main_process(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    config = TrainConfig()
    assert not progress_bar(config, 3, "train", "step").disable
    assert progress_bar(config, 3, "train", "step", show=False).disable  # another process of the run
    monkeypatch.setenv("TQDM_DISABLE", "1")  # tqdm's own switch, which an explicit disable=None would override
    assert progress_bar(config, 3, "train", "step").disable


def test_progress_is_a_field_with_help_and_a_no_flag():
    assert "only when stderr is a terminal" in TrainConfig.__dataclass_fields__["progress"].metadata["help"]
    assert load_config([])[0].progress is True
    assert load_config(["--no-progress"])[0].progress is False
    assert load_config(["--progress", "false"])[0].progress is False


def test_evaluation_lines_give_the_share_and_the_count_solved():
    """The README states held-out success as 41/64: the console says both, and the evaluator records the counts."""
    from rllm_gym.train.console import evaluation_parts
    from rllm_gym.train.evaluation import Evaluator, describe_scores

    logs = {"eval_heldout/greedy": 41 / 64, "eval_heldout/tasks": 64, "eval_train/greedy": 0.5, "eval_train/tasks": 2}
    assert evaluation_parts({**logs, "eval_heldout/pass@2": 0.7}) == [
        "held-out greedy 0.641 (41/64)",
        "held-out pass@2 0.700",
        "train greedy 0.500 (1/2)",
    ]
    assert describe_scores(logs, "after") == (
        "greedy success after: training tasks 0.500 (1/2), held-out tasks (never trained on) 0.641 (41/64)"
    )
    assert evaluation_parts({"eval_heldout/greedy": 0.25}) == ["held-out greedy 0.250"]  # older logs: no count
    evaluator = Evaluator.__new__(Evaluator)  # metrics() reads only the config and the training tasks
    evaluator.config, evaluator.train_tasks = load_config([])[0], {"rllm/FrozenLake-v0": [0]}
    results = [("heldout", "greedy", "rllm/FrozenLake-v0", 1, 1)] * 3 + [("heldout", "greedy", "e", 1, 0)]
    metrics = evaluator.metrics([*results, ("train", "greedy", "rllm/FrozenLake-v0", 1, 0)])
    assert metrics["eval_heldout/tasks"] == 4 and metrics["eval_heldout/greedy"] == 0.75
    assert metrics["eval_train/tasks"] == 1


def test_deepspeeds_build_notice_is_dropped_and_every_other_line_passes_at_once(capsys):
    from rllm_gym.train.console import without_build_notices

    with without_build_notices():
        print("step     1  reward 0.500")
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        print("a partial", end="", flush=True)
        assert capsys.readouterr().out == "step     1  reward 0.500\na partial"  # nothing held back
        print(" line")
        print("DeepSpeed says something else")
    assert capsys.readouterr().out == " line\nDeepSpeed says something else\n"
