"""``rllm_gym/cli_eval.py``: ``rllm-gym eval`` driven as the command line (and in-process where no model loads). It
writes episodes and a summary, resumes a killed run without repeats, checks its inputs before a model loads (one line
naming the flag, no traceback), says why episodes failed, draws a progress bar only on a terminal, records a server's
token counts when there is no tokenizer, and renders prompts with the recorded chat-template options."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from transformers import AutoTokenizer

from rllm_gym.cli import main
from rllm_gym.policies.stub_server import StubOpenAIServer, count_tokens
from rllm_gym.store import read_episodes

CLI = ("-m", "rllm_gym.cli")
# No TQDM_DISABLE here: the progress tests need tqdm's own terminal detection.
TERMINAL_ENV = {**{k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}, "OMP_NUM_THREADS": "1"}
TERMINAL_ENV["CUDA_VISIBLE_DEVICES"] = ""
BAD_MAP = "task['map'] may only use the letters S (start, exactly one)"


def eval_args(model, out, tasks=12):
    return [
        "eval",
        "--env",
        "rllm/FrozenLake-v0",
        "--model",
        str(model),
        "--tasks",
        str(tasks),
        "--n",
        "1",
        "--max-turns",
        "2",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--n-parallel",
        "1",
        "--out",
        str(out),
    ]


def comparable(episode):
    data = episode.to_dict()
    data["metadata"].pop("attempts", None)
    for trajectory in data["trajectories"]:
        trajectory.pop("uid")
        for step in trajectory["steps"]:
            step.pop("id")
    return data


# a run: episodes, summary, resume ------------------------------------------------------------------------------------


def test_eval_writes_episodes_and_prints_the_summary(tiny_model_dir, tmp_path, run_python):
    out = tmp_path / "episodes.jsonl"
    result = run_python(*CLI, *eval_args(tiny_model_dir, out, tasks=3), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["episodes"] == 3 and summary["tasks"] == 3 and summary["n"] == 1
    assert {"pass@1", "pass^1", "mean_reward", "mean_turns", "termination_reasons"} <= set(summary)
    episodes = list(read_episodes(out))
    assert sorted(e.id for e in episodes) == ["seed-0:0", "seed-1:0", "seed-2:0"]
    step = episodes[0].trajectories[0].steps[0]
    assert step.prompt_ids and step.response_ids and len(step.logprobs) == len(step.response_ids)

    view = run_python(*CLI, "view", str(out), "--id", "seed-1:0")
    assert view.returncode == 0, view.stderr
    assert "seed-1:0" in view.stdout and "Current grid:" in view.stdout and "step 0: reward=" in view.stdout


def test_killed_eval_resumes_to_the_same_episodes_none_twice(tiny_model_dir, tmp_path, run_python):
    clean = tmp_path / "clean.jsonl"
    assert run_python(*CLI, *eval_args(tiny_model_dir, clean)).returncode == 0
    out = tmp_path / "killed.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    process = subprocess.Popen(
        [sys.executable, *CLI, *eval_args(tiny_model_dir, out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().count("\n") >= 3):
        assert process.poll() is None and time.monotonic() < deadline, "eval ended before it could be killed"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = out.read_text().count("\n")
    assert 3 <= written < 12, "the kill should land half-way"
    resumed = run_python(*CLI, *eval_args(tiny_model_dir, out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    ids = [e.id for e in read_episodes(out)]
    assert len(ids) == len(set(ids)) == 12
    expected = {e.id: comparable(e) for e in read_episodes(clean)}
    assert {e.id: comparable(e) for e in read_episodes(out)} == expected


def test_eval_runs_multi_agent_envs(tiny_model_dir, capsys):
    args = ["eval", "--env", "rllm/SolverJudge-v0", "--model", str(tiny_model_dir), "--tasks", "2", "--n", "2"]
    assert main([*args, "--max-tokens", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 4 and summary["mean_turns"] == 3.0  # two solvers and a judge per episode


# inputs checked before a model loads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--tasks", "0"], "--tasks must be >= 1, got 0"),
        (["eval", "--max-turns", "0"], "--max-turns must be >= 1, got 0"),
        (["eval", "--seed", "-1"], "--seed must be >= 0 (it seeds sampling and every env reset), got -1"),
        (["eval", "--policy", "openai"], "--policy openai needs --model"),
        (["eval", "--resume"], "--resume needs --out"),
    ],
)
def test_bad_arguments_are_named(args, message, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(args)
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


def test_max_steps_is_a_deprecated_alias_of_max_turns(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["eval", "--max-steps", "0"])  # reaches the --max-turns check: the alias stored into max_turns
    err = capsys.readouterr().err
    assert excinfo.value.code == 2
    assert "rllm-gym eval: --max-steps is deprecated and will be removed: use --max-turns" in err
    assert "--max-turns must be >= 1, got 0" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "--temperature", "-1"], "--temperature must be >= 0 (0 = greedy), got -1.0"),
        (["eval", "--top-p", "0"], "--top-p must be in (0, 1] (1 = off), got 0.0"),
        (["eval", "--top-p", "1.5"], "--top-p must be in (0, 1] (1 = off), got 1.5"),
        (["eval", "--timeout", "0"], "--timeout must be > 0 seconds (leave it out for no limit), got 0.0"),
        (
            ["eval", "--env-args", "[1]"],
            """argument --env-args: '[1]' is not a JSON object: write one such as '{"size""",
        ),
        (["eval", "--agent-args", '"x"'], """argument --agent-args: '"x"' is not a JSON object: write one such as"""),
        (["eval", "--agent-args", "{bad"], "argument --agent-args: '{bad' is not valid JSON (Expecting property name"),
        (["eval", "--env-args", "size=4"], "argument --env-args: 'size=4' is not valid JSON (Expecting value, col"),
        (["eval", "--chat-template-kwargs", "{"], "argument --chat-template-kwargs: '{' is not valid JSON"),
        (["eval", "--agent", "nocolon"], "--agent must look like 'package.module:Class', got 'nocolon'"),
        (["eval", "--n", "0"], "--n must be >= 1, got 0"),
        (["eval", "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
        (["eval", "--env", "rllm/Nope-v0"], "--env: Environment 'rllm/Nope-v0' doesn't exist."),
        (["eval", "--policy", "x"], "argument --policy: invalid choice: 'x' (choose from 'hf', 'openai', 'vllm')"),
        (["eval", "--thinking", "maybe"], "argument --thinking: invalid choice: 'maybe' (choose from 'on', 'off')"),
        (["eval", "--policy", "openai"], "--policy openai needs --model (the served or loaded model name)"),
    ],
)
def test_bad_flags_are_usage_errors_that_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_existing_out_file_needs_resume(tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    out.write_text('{"id": "x:0"}\n')
    with pytest.raises(SystemExit):
        main(["eval", "--out", str(out)])
    assert "pass --resume to continue it" in capsys.readouterr().err


def test_unknown_env_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--env", "rllm/FrozenLak-v0"])
    assert (
        "Environment 'rllm/FrozenLak-v0' doesn't exist. Did you mean 'rllm/FrozenLake-v0'?" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "runs/demo_cpu/fnial"], "--model runs/demo_cpu/fnial: no such folder (the nearest existing one"),
        (["--taks", "3"], "rllm-gym eval: error: unrecognized argument --taks; did you mean --tasks?"),
        (
            ["--agent-args", '{"system_promt": ""}'],
            "agent_args: FrozenLakeAgent takes no argument 'system_promt' (did you mean 'system_prompt'?); it accepts "
            "enable_thinking, max_history_turns, name, observation_template, system_prompt",
        ),
        (["--env-args", '{"sise": 4}'], "env_args: rllm/FrozenLake-v0 (FrozenLakeEnv) takes no argument 'sise' (did"),
    ],
)
def test_eval_rejects_bad_inputs_at_once_naming_them(args, message, tmp_path, run_python):
    start = time.monotonic()
    result = run_python(*CLI, "eval", *args, "--tasks", "1", cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - start < 30  # no model load, no network


def test_eval_names_the_malformed_line_of_a_data_file_before_the_model_loads(tmp_path, capsys):
    """A usage error (exit 2, one line after eval's usage) raised by the checks, which run before any model loads."""
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"id": "a", "map": ["SFG"]}\n{"id": "b", oops}\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--data", str(data)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert err.startswith("usage: rllm-gym eval")
    why = "Expecting property name enclosed in double quotes"
    assert line == f"rllm-gym eval: error: --data {data}:2 is not valid JSON ({why}): one task dict per line"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SystemExit):
        main(["eval", "--data", str(empty)])
    assert f"--data {empty} holds no tasks" in capsys.readouterr().err


def test_a_data_file_is_evaluated_whole_unless_tasks_cuts_it(tmp_path, capsys):
    """--tasks defaults to the whole --data file; a cut is said on stderr. Without --data, 16 seeds from --seed."""
    from rllm_gym.cli import build_parser, parse_args
    from rllm_gym.cli_eval import apply_training_record, check_eval_args

    data = write_tasks(tmp_path / "tasks.jsonl", [["SFG"]] * 20)

    def tasks(*argv: str) -> list:
        parser = build_parser()
        args = parse_args(parser, ["eval", *argv])
        apply_training_record(args)
        return check_eval_args(parser, args)

    assert len(tasks("--data", str(data))) == 20 and "first" not in capsys.readouterr().err
    assert [task["id"] for task in tasks("--data", str(data), "--tasks", "3")] == ["lake0", "lake1", "lake2"]
    assert f"rllm-gym eval: --tasks 3: the first 3 of the 20 tasks of {data}" in capsys.readouterr().err
    assert len(tasks("--data", str(data), "--tasks", "50")) == 20
    assert tasks() == list(range(16)) and tasks("--seed", "5", "--tasks", "2") == [5, 6]


# failed episodes and unreachable servers -----------------------------------------------------------------------------


def write_tasks(path, maps):
    path.write_text("".join(json.dumps({"id": f"lake{i}", "map": rows}) + "\n" for i, rows in enumerate(maps)))
    return path


def data_eval_args(model, data):
    return ["eval", "--model", str(model), "--data", str(data), "--n", "2", "--max-turns", "2", "--max-tokens", "4"]


def test_an_eval_whose_episodes_all_errored_exits_1_with_the_error(tiny_model_dir, tmp_path, run_python):
    data = write_tasks(tmp_path / "tasks.jsonl", [["SXG"], ["SXG"]])
    result = run_python(*CLI, *data_eval_args(tiny_model_dir, data), "--json")
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["termination_reasons"] == {"error": 4}
    [group] = summary["errors"]
    assert group["type"] == "ValueError" and BAD_MAP in group["message"]
    assert group["count"] == 4 and group["example"] in {"lake0:0", "lake0:1", "lake1:0", "lake1:1"}
    assert "rllm-gym eval: all 4 episodes ended in ERROR, so there is no score:" in result.stderr
    assert f"4 x ValueError: {BAD_MAP}" in result.stderr
    assert "Traceback" not in result.stderr
    # The engine's log names the first failure as it happens (a warning, shown at the default level).
    assert "WARNING rllm_gym.engine.engine: episode lake" in result.stderr


def test_a_partly_failed_eval_exits_0_and_its_table_lists_the_errors(tiny_model_dir, tmp_path, run_python):
    data = write_tasks(tmp_path / "tasks.jsonl", [["SFG"], ["SXG"]])
    result = run_python(*CLI, *data_eval_args(tiny_model_dir, data), "--log-level", "error")
    assert result.returncode == 0, result.stderr
    assert "termination_reasons" in result.stdout and "error 2" in result.stdout
    assert "errors behind the ERROR episodes" in result.stdout
    assert "2 x ValueError: task['map'] may only use" in result.stdout and "(e.g. episode lake1:" in result.stdout
    assert "rllm_gym.engine" not in result.stderr  # --log-level error hides the engine's warnings


def test_an_unreachable_server_is_named_with_the_connection_error(run_python):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    result = run_python(*CLI, "eval", "--policy", "openai", "--model", "m", "--base-url", url, "--tasks", "1")
    assert result.returncode == 1
    assert f"rllm-gym eval: cannot reach the OpenAI-compatible server at {url}: ConnectError:" in result.stderr
    assert "Traceback" not in result.stderr


# progress bar, token counts, chat-template options -------------------------------------------------------------------


def stub_eval(url: str, *extra: str) -> list[str]:
    args = ["eval", "--policy", "openai", "--model", "stub", "--base-url", url, "--tasks", "2", "--n", "2"]
    return [*CLI, *args, "--max-turns", "2", "--json", *extra]


def test_eval_draws_a_progress_bar_only_on_a_terminal_and_not_with_no_progress(stderr_on_a_terminal, run_python):
    with StubOpenAIServer() as server:
        status, terminal = stderr_on_a_terminal([sys.executable, *stub_eval(server.url)], env=TERMINAL_ENV)
        assert status == 0, terminal
        assert "eval rllm/FrozenLake-v0: 100%" in terminal and "4/4" in terminal

        command = [sys.executable, *stub_eval(server.url, "--no-progress")]
        status, quiet = stderr_on_a_terminal(command, env=TERMINAL_ENV)
        assert status == 0, quiet
        assert "eval rllm/FrozenLake-v0" not in quiet

        command = [sys.executable, *stub_eval(server.url)]
        status, quiet = stderr_on_a_terminal(command, env={**TERMINAL_ENV, "TQDM_DISABLE": "1"})
        assert status == 0, quiet
        assert "eval rllm/FrozenLake-v0" not in quiet

        piped = run_python(*stub_eval(server.url), env=TERMINAL_ENV)
        assert piped.returncode == 0, piped.stderr
        assert "eval rllm/FrozenLake-v0" not in piped.stderr and "\r" not in piped.stderr
    help_text = run_python(*CLI, "eval", "--help", env=TERMINAL_ENV).stdout
    assert "--no-progress" in help_text and "only when stderr is a terminal" in " ".join(help_text.split())


def test_eval_without_a_tokenizer_records_the_servers_token_counts(tmp_path, run_python):
    out = tmp_path / "episodes.jsonl"
    with StubOpenAIServer() as server:
        result = run_python(*stub_eval(server.url, "--out", str(out)))
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
    shown = run_python(*CLI, "view", str(out), "--index", "0")
    assert f"step 0: reward=0.0 done=False tokens={first.prompt_length}+{first.completion_length}" in shown.stdout


def test_eval_renders_prompts_with_the_recorded_chat_template_options(tmp_path, tiny_model_dir, run_python):
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
        result = run_python(*CLI, "eval", "--model", str(model), "--tasks", "1", "--n", "1", "--out", str(out), *flags)
        assert result.returncode == 0, result.stderr
        step = next(iter(read_episodes(out))).trajectories[0].steps[0]
        return AutoTokenizer.from_pretrained(model).decode(step.prompt_ids), result.stderr

    prompt, stderr = first_prompt()
    assert prompt.startswith("mode=recorded\n") and '--chat-template-kwargs {"mode": "recorded"}' in stderr
    prompt, stderr = first_prompt("--chat-template-kwargs", '{"mode": "flag"}')
    assert prompt.startswith("mode=flag\n") and "instead: --chat-template-kwargs" in stderr
    bad = run_python(*CLI, "eval", "--chat-template-kwargs", "[1]")
    assert bad.returncode == 2 and "argument --chat-template-kwargs: '[1]' is not a JSON object" in bad.stderr
