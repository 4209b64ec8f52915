import ast
import json
import re
from pathlib import Path

import pytest

from rllm_gym.train.config_file import ConfigError
from rllm_gym.train.grpo import TrainConfig, cli, load_config, main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"


def test_yaml_then_cli_overrides(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("max_steps: 7\nlearning_rate: 0.01\nagent_args: {system_prompt: hi}\n")
    config, config_dir = load_config(["--config", str(config_file), "--max_steps", "3"])
    assert config.max_steps == 3  # the CLI wins
    assert config.learning_rate == 0.01  # the YAML wins over the default
    assert config.agent_args == {"system_prompt": "hi"}
    assert config_dir == tmp_path


def test_config_equals_path_reads_the_file_and_a_second_or_empty_config_is_refused(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("max_steps: 7\nenv_args: {size: 4}\n")
    config, config_dir = load_config([f"--config={config_file}", "--max_steps", "3"])
    assert (config.max_steps, config.env_args, config_dir) == (3, {"size": 4}, tmp_path)
    assert load_config([f"--config={config_file}"])[0].max_steps == 7  # the file was read, not skipped
    with pytest.raises(ConfigError, match=re.escape("--config is given 2 times: give one YAML file")):
        load_config([f"--config={config_file}", "--config", str(config_file)])
    with pytest.raises(ConfigError, match=re.escape("--config needs a YAML file: --config train/configs/")):
        load_config(["--config", "--max_steps", "3"])
    with pytest.raises(ConfigError, match=re.escape("--config needs a YAML file")):
        load_config(["--config="])


def test_dict_fields_are_dicts_from_yaml_flags_and_defaults_and_trl_flags_land_in_trl_args(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("agent_args: {system_prompt: hi}\ntrl_args: {max_grad_norm: 0.5}\nweight_decay: 0.1\n")
    config, _ = load_config(["--config", str(config_file), "--chat_template_kwargs", '{"enable_thinking": false}'])
    assert config.agent_args == {"system_prompt": "hi"} and config.env_args == {}
    assert config.chat_template_kwargs == {"enable_thinking": False}
    assert config.trl_args == {"max_grad_norm": 0.5, "weight_decay": 0.1}
    # A flag replaces the YAML's dict; a TRL field's own flag (either spelling) wins over the same key in trl_args.
    flags = ["--agent_args", '{"system_prompt": "yo"}', "--max-grad-norm", "0.25", "--weight_decay", "0.2"]
    config, _ = load_config(["--config", str(config_file), *flags])
    assert config.agent_args == {"system_prompt": "yo"}
    assert config.trl_args == {"max_grad_norm": 0.25, "weight_decay": 0.2}
    with pytest.raises(ConfigError, match=re.escape(f"{config_file}: env_args must be a JSON object, e.g. ")):
        config_file.write_text("env_args: [1]\n")
        load_config(["--config", str(config_file)])


def test_debug_false_shows_no_traceback(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "b", oops}\n')
    flags = ["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--tasks", str(tasks)]
    assert cli([*flags, "--debug", "false"]) == 1  # before: any --debug flag re-raised the error
    error = capsys.readouterr().err
    assert f"tasks: {tasks}:1 is not JSON" in error and error.endswith("(--debug shows the traceback)\n")
    with pytest.raises(ValueError, match="is not JSON"):
        cli([*flags, "--debug", "true"])


def test_unknown_yaml_field_is_named(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("max_stepz: 7\n")
    with pytest.raises(ValueError, match=re.escape("unknown field max_stepz (did you mean max_steps?); see Train")):
        load_config(["--config", str(config_file)])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env": ["rllm/FrozenLak-v0"]}, "'rllm/FrozenLak-v0' doesn't exist. Did you mean 'rllm/FrozenLake-v0'?"),
        ({"env_weights": [1.0, 2.0]}, "env_weights has 2 entries for 1 envs"),
        ({"num_generations": 1}, "num_generations must be >= 2"),
        ({"estimator": "ppo"}, "estimator must be one of"),
        ({"agent_args": "{oops"}, "agent_args must be a JSON object"),
        ({"use_vllm": True, "vllm_mode": "remote"}, "vllm_mode must be 'colocate' or 'server', got 'remote'"),
        ({"vllm_server_base_url": "10.0.0.5:8000"}, "vllm_server_base_url must be an http(s) URL"),
        ({"model_shape": "huge"}, "model_shape must be one of small, tiny, got 'huge'"),
        ({"model_shape": "small", "model": "gpt2"}, "model_shape sizes the embedded model: drop it when model names"),
        ({"eval_tasks": ["0.1", "0.2"]}, "eval_tasks has 2 entries for 1 envs: one eval split per env"),
        ({"eval_limit": 0}, "eval_limit must be >= 1, got 0"),
        ({"eval_steps": -1}, "eval_steps must be >= 0 (0 = off), got -1"),
    ],
)
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**kwargs)


def test_lora_run_trains_an_adapter(tmp_path):
    summary = main(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--lora", "true", "--lora_r", "4"])
    assert summary["config"]["lora"] is True
    assert (tmp_path / "run" / "final" / "adapter_config.json").is_file()


def test_a_multi_agent_task_gives_one_prompt_per_trajectory_side_by_side(tmp_path):
    from rllm_gym.train.grpo import build_prompts, make_splits
    from rllm_gym.train.trainer import decode_prompt

    config = TrainConfig(
        env=["rllm/SolverJudge-v0", "rllm/FrozenLake-v0"], env_args='{"n_solvers": 2}', prompts_per_step=6, max_steps=4
    )
    dataset = build_prompts(config, make_splits(config, tmp_path))
    decoded = [decode_prompt(row["prompt"]) for row in dataset]
    assert len(decoded) == 24
    position = 0
    while position < len(decoded):
        env_id, task, slot = decoded[position]
        assert slot == 0
        if (
            env_id == "rllm/SolverJudge-v0"
        ):  # solver_0, solver_1, judge_0 of the same task, in a row (or cut at the end)
            unit = decoded[position : position + 3]
            assert [s for _, _, s in unit] == [0, 1, 2][: len(unit)]
            assert all(t == task for _, t, _ in unit)
            position += 3
        else:
            position += 1
    assert {env_id for env_id, _, _ in decoded} == {"rllm/SolverJudge-v0", "rllm/FrozenLake-v0"}


def test_solver_judge_run_logs_each_role(tmp_path):
    output_dir = tmp_path / "run"
    summary = main(
        [
            "--config", str(TINY), "--output_dir", str(output_dir), "--env", "rllm/SolverJudge-v0",
            "--tasks", "seeds:4", "--agent_args", "{}", "--env_args", '{"n_solvers": 2}',
            "--prompts_per_step", "3", "--max_turns", "3", "--max_steps", "2",
        ]
    )  # fmt: skip
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    logged = {"train/reward/role/solver", "train/reward/role/judge", "rollout/pass_rate", "rollout/model_tokens_per_s"}
    assert logged <= set(records[-1])
    assert 0 <= records[-1]["rollout/pass_rate"] <= 1 and records[-1]["rollout/model_tokens_per_s"] > 0
    assert summary["num_processes"] == 1


def test_metrics_of_a_resumed_run_continue_the_killed_one(tmp_path):
    from rllm_gym.train.console import ConsoleLog

    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "elapsed_s": 10.0 * s, "reward": 0.1 * s}) + "\n" for s in (1, 2, 3))
    )
    console = ConsoleLog(tmp_path, resume_step=2)  # checkpoint-2: step 3 was logged after it and is redone
    assert [r["step"] for r in console.history] == [1, 2]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    fresh = ConsoleLog(tmp_path)  # a new run in the same folder starts an empty file
    assert fresh.history == [] and path.read_text() == ""


@pytest.mark.parametrize("path", sorted((REPO / "train" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_and_validate(path):
    config, config_dir = load_config(["--config", str(path)])
    assert config_dir == path.parent
    for source in config.tasks or []:
        assert source.startswith("seeds:") or (config_dir / source).is_file()


# How train/grpo.py reads (issue 44): short functions, argv read once, results returned ----------------------------

GRPO_SOURCE = REPO / "train" / "grpo.py"


def functions(source: Path) -> list[ast.FunctionDef]:
    return [node for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.FunctionDef)]


def test_no_function_of_grpo_py_is_over_60_lines():
    lengths = {node.name: node.end_lineno - node.lineno + 1 for node in functions(GRPO_SOURCE)}
    assert {"run", "main", "before_training", "build_trainer", "train", "finish"} <= set(lengths)
    too_long = {name: length for name, length in lengths.items() if length > 60}
    assert not too_long, f"functions of train/grpo.py over 60 lines (split them): {too_long}"


def argv_reads(source: Path) -> list[int]:
    """The lines of ``source`` that read ``sys.argv``."""
    tree = ast.parse(source.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "argv" and getattr(node.value, "id", None) == "sys"
    ]


def test_the_trainer_reads_argv_in_one_place_its_main_block():
    tree = ast.parse(GRPO_SOURCE.read_text())
    [main_block] = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    reads = argv_reads(GRPO_SOURCE)
    assert reads and all(main_block.lineno <= line <= main_block.end_lineno for line in reads)
    assert len(set(reads)) == 1  # one statement hands argv (and the program's name) on
    for module in ("config.py", "command.py", "summary.py", "run_dir.py"):
        assert argv_reads(REPO / "train" / module) == [], module
    assert "sys.argv" not in (REPO / "rllm_gym" / "cli.py").read_text().split("def run_train", 1)[1]


def test_the_summary_is_built_from_returned_values_not_read_back_from_attributes():
    source = GRPO_SOURCE.read_text()
    for attribute in (".last_evaluation", ".stopped_at", "console.history", "console.evaluations", "trainer.state."):
        assert attribute not in source, attribute


def test_a_run_returns_the_summary_it_writes(tmp_path):
    output_dir = tmp_path / "run"
    flags = ["--max_steps", "2", "--eval_greedy", "true", "--eval_limit", "2"]
    summary = main(["--config", str(TINY), "--output_dir", str(output_dir), *flags])
    written = json.loads((output_dir / "summary.json").read_text())
    assert json.loads(json.dumps(summary, default=str)) == written
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    [after] = [record for record in records if "eval_train/greedy" in record and record["step"] == 2]
    assert written["evaluation_after"] == {"step": 2, **{k: v for k, v in after.items() if k.startswith("eval_")}}
    assert written["reward_last"] == [record for record in records if "reward" in record][-1]["reward"]
    assert sum(written["termination_reasons"].values()) > 0 and written["num_processes"] == 1
    assert json.loads((output_dir / "run.json").read_text())["split"] == written["split"]
