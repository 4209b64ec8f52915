"""The whole ``rllm-gym`` command line, driven as a subprocess: ``list`` prints the registry, ``train`` is the trainer
with its flags and messages, ``eval`` draws a progress bar only on a terminal (and not with ``--no-progress``), and
an eval on an OpenAI-compatible server without a tokenizer records the server's token counts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rllm_gym import registry
from rllm_gym.cli import main
from rllm_gym.policies.stub_server import StubOpenAIServer, count_tokens
from rllm_gym.registry import ENV_SPECS, EnvSpec, default_agent, env_ids
from rllm_gym.store import read_episodes

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
# No TQDM_DISABLE here: the progress tests need tqdm's own terminal detection.
ENV = {**{k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}, "OMP_NUM_THREADS": "1"}
ENV["CUDA_VISIBLE_DEVICES"] = ""
CLI = [sys.executable, "-m", "rllm_gym.cli"]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300, cwd=REPO)


# list ----------------------------------------------------------------------------------------------------------------


def test_list_prints_one_line_per_registered_env():
    result = run([*CLI, "list"])
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split() == ["id", "default", "agent", "extras", "description"]
    assert len(lines) == len(ENV_SPECS)
    for spec, line in zip(ENV_SPECS, lines, strict=True):
        assert line.startswith(f"{spec.id} ") and line.endswith(spec.description)
    frozen = lines[env_ids().index("rllm/FrozenLake-v0")]
    assert frozen.split()[:3] == ["rllm/FrozenLake-v0", "FrozenLakeAgent", "-"]
    judge = lines[env_ids().index("rllm/SolverJudge-v0")]
    assert judge.split()[:4] == ["rllm/SolverJudge-v0", "solver=SolverAgent", "judge=JudgeAgent", "-"]


def test_list_json_gives_the_registry_with_full_agent_paths():
    result = run([*CLI, "list", "--json"])
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["id"] for row in rows] == env_ids()
    for spec, row in zip(ENV_SPECS, rows, strict=True):
        agent = default_agent(row["id"])
        if row["multi_agent"]:
            assert row["agent"] == {role: f"{cls.__module__}:{cls.__qualname__}" for role, cls in agent.items()}
        else:
            assert row["agent"] == f"{agent.__module__}:{agent.__qualname__}"
        assert row["description"] == spec.description != ""
        assert row["extras"] == list(spec.extras)
        assert row["install"] == (f'pip install "rllm-gym[{",".join(spec.extras)}]"' if spec.extras else None)


def test_list_shows_extras_and_falls_back_to_the_module_docstring(monkeypatch, capsys):
    extra = EnvSpec("my/Lake-v0", "rllm_gym.envs.frozenlake:FrozenLakeEnv", agent=None, extras=("vllm", "serve"))
    monkeypatch.setattr(registry, "ENV_SPECS", (*ENV_SPECS, extra))
    assert main(["list"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[:3] == ["my/Lake-v0", "-", "vllm,serve"]
    assert line.endswith("FrozenLake as a text environment: the reference env that every other rllm-gym env copies.")
    assert main(["list", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[-1]
    assert row["agent"] is None and row["install"] == 'pip install "rllm-gym[vllm,serve]"'


# train ---------------------------------------------------------------------------------------------------------------


def test_train_runs_the_trainer_with_its_flags(tmp_path):
    output_dir = tmp_path / "run"
    result = run([*CLI, "train", "--config", str(TINY), "--output_dir", str(output_dir), "--max_steps", "1"])
    assert result.returncode == 0, result.stderr
    assert [line.split()[:2] for line in result.stdout.splitlines() if line.startswith("step ")] == [["step", "1"]]
    assert json.loads((output_dir / "summary.json").read_text())["termination_reasons"]
    assert (output_dir / "final").is_dir()


def test_train_fails_exactly_as_the_trainer_module_does(tmp_path):
    args = ["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--max_stepz", "1"]
    ours = run([*CLI, "train", *args])
    theirs = run([sys.executable, "-m", "rllm_gym.train.grpo", *args])
    assert ours.returncode == theirs.returncode == 2  # a usage error, as in rllm-gym eval
    assert ours.stderr.splitlines()[-1] == theirs.stderr.splitlines()[-1]
    assert "rllm-gym train: error: unknown flag --max_stepz (did you mean --max_steps?)" in ours.stderr
    assert not (tmp_path / "run").exists()


def test_train_help_is_the_trainers():
    result = run([*CLI, "train", "--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: rllm-gym train")
    assert "--max_steps" in result.stdout and "--gradient_accumulation_steps" in result.stdout
    top = run([*CLI, "--help"])
    assert "GRPO training: python -m rllm_gym.train.grpo with the same flags" in " ".join(top.stdout.split())


# eval: progress bar and token counts ---------------------------------------------------------------------------------


def stub_eval(url: str, *extra: str) -> list[str]:
    args = ["eval", "--policy", "openai", "--model", "stub", "--base-url", url, "--tasks", "2", "--n", "2"]
    return [*CLI, *args, "--max-turns", "2", "--json", *extra]


def test_eval_draws_a_progress_bar_only_on_a_terminal_and_not_with_no_progress(stderr_on_a_terminal):
    with StubOpenAIServer() as server:
        status, terminal = stderr_on_a_terminal(stub_eval(server.url), env=ENV)
        assert status == 0, terminal
        assert "eval rllm/FrozenLake-v0: 100%" in terminal and "4/4" in terminal

        status, quiet = stderr_on_a_terminal(stub_eval(server.url, "--no-progress"), env=ENV)
        assert status == 0, quiet
        assert "eval rllm/FrozenLake-v0" not in quiet

        status, quiet = stderr_on_a_terminal(stub_eval(server.url), env={**ENV, "TQDM_DISABLE": "1"})
        assert status == 0, quiet
        assert "eval rllm/FrozenLake-v0" not in quiet

        piped = run(stub_eval(server.url))
        assert piped.returncode == 0, piped.stderr
        assert "eval rllm/FrozenLake-v0" not in piped.stderr and "\r" not in piped.stderr
    help_text = run([*CLI, "eval", "--help"]).stdout
    assert "--no-progress" in help_text and "only when stderr is a terminal" in " ".join(help_text.split())


def test_eval_without_a_tokenizer_records_the_servers_token_counts(tmp_path):
    out = tmp_path / "episodes.jsonl"
    with StubOpenAIServer() as server:
        result = run(stub_eval(server.url, "--out", str(out)))
    assert result.returncode == 0, result.stderr
    steps = [step for episode in read_episodes(out) for step in episode.trajectories[0].steps]
    assert len(steps) == 8  # 2 tasks x 2 rollouts x 2 turns
    for step in steps:
        *prompt, reply = step.chat_completions
        assert step.prompt_ids == step.response_ids == []  # no tokenizer: no ids
        assert step.model_output.prompt_length == count_tokens(prompt) > 0
        assert step.model_output.completion_length == count_tokens(reply["content"]) > 0
    summary = json.loads(result.stdout)  # the summary's token figures come from the same counts
    replies = sum(step.model_output.completion_length for step in steps)
    assert summary["mean_response_tokens"] == pytest.approx(replies / 4)
    first = next(iter(read_episodes(out))).trajectories[0].steps[0].model_output
    shown = run([*CLI, "view", str(out), "--index", "0"])
    assert f"step 0: reward=0.0 done=False tokens={first.prompt_length}+{first.completion_length}" in shown.stdout


def test_eval_renders_prompts_with_the_recorded_chat_template_options(tmp_path, tiny_model_dir):
    """A model folder's recorded chat_template_kwargs reach the template; --chat-template-kwargs overrides them."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    # A template that shows the option it was given: the proof that it arrived.
    config["chat_template"] = (
        "{{ 'mode=' ~ (mode | default('none')) ~ '\\n' }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    record = {"env": ["rllm/FrozenLake-v0"], "agent_args": {}, "env_args": {}, "max_turns": 1}
    record |= {"max_completion_length": 2, "chat_template_kwargs": {"mode": "recorded"}}
    (model / "rllm_gym_training.json").write_text(json.dumps(record))

    def first_prompt(*flags: str) -> tuple[str, str]:
        out = tmp_path / f"episodes{len(flags)}.jsonl"
        command = [*CLI, "eval", "--model", str(model), "--tasks", "1", "--n", "1", "--out", str(out), *flags]
        result = run(command)
        assert result.returncode == 0, result.stderr
        step = next(iter(read_episodes(out))).trajectories[0].steps[0]
        return AutoTokenizer.from_pretrained(model).decode(step.prompt_ids), result.stderr

    prompt, stderr = first_prompt()
    assert prompt.startswith("mode=recorded\n") and '--chat-template-kwargs {"mode": "recorded"}' in stderr
    prompt, stderr = first_prompt("--chat-template-kwargs", '{"mode": "flag"}')
    assert prompt.startswith("mode=flag\n") and "instead: --chat-template-kwargs" in stderr
    bad = run([*CLI, "eval", "--chat-template-kwargs", "[1]"])
    assert bad.returncode == 2 and "--chat-template-kwargs must be a JSON object" in bad.stderr
