"""train/command.py: the trainer's command line, handed argv once by each entry point; what its flags alone refuse is
refused before torch and TRL load."""

import subprocess
import sys
from pathlib import Path

import pytest

from rllm_gym.train.command import train_command

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
# A fresh interpreter: whether the refusal loaded torch shows in its sys.modules.
REFUSE = (
    "import sys; from rllm_gym.train.command import train_command; "
    "print(train_command({argv!r}), 'torch' in sys.modules)"
)


def test_a_taken_output_dir_is_refused_before_torch_loads(tmp_path):
    taken = tmp_path / "run"
    taken.mkdir()
    (taken / "metrics.jsonl").write_text("")
    argv = ["--config", str(TINY), "--output_dir", str(taken)]
    result = subprocess.run(
        [sys.executable, "-c", REFUSE.format(argv=argv)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert f"rllm-gym train: output_dir {taken} holds another run (metrics.jsonl)" in result.stderr


def test_the_program_name_given_is_the_one_help_and_usage_errors_show(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_command(["--help"], prog="my-trainer")
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: my-trainer ")


def test_a_config_error_is_one_line_and_exit_status_2(tmp_path, capsys):
    status = train_command(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--max_stepz", "1"])
    assert status == 2
    assert capsys.readouterr().err.strip() == (
        "rllm-gym train: error: unknown flag --max_stepz (did you mean --max_steps?); every TrainConfig field is a "
        "--flag"
    )
    assert not (tmp_path / "run").exists()
