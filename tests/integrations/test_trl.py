"""rllm-gym envs as TRL environments: tools TRL can render, episodes driven through them, and a real
``trl.GRPOTrainer(environment_factory=...)`` run on the CPU."""

from __future__ import annotations

import inspect
import json
import re
import socket

import pytest
from transformers.utils import get_json_schema

from rllm_gym.envs.openenv import EnvServerError
from rllm_gym.integrations.trl import dataset_rows, environment_factory, parse_qwen_tool_calls
from rllm_gym.registry import UnknownEnvError, env_ids


def tools_of(cls: type) -> dict[str, dict]:
    """The tools TRL would expose, as the JSON schemas transformers renders into the chat template."""
    members = inspect.getmembers(cls, predicate=inspect.isfunction)
    return {
        name: get_json_schema(function)["function"]
        for name, function in members
        if name not in ("reset", "get_reward") and not name.startswith("_")
    }


@pytest.mark.parametrize("env_id", env_ids(multi_agent=False))
def test_every_single_agent_id_has_documented_typed_tools(env_id: str) -> None:
    tools = tools_of(environment_factory(env_id))
    assert tools
    for schema in tools.values():
        assert schema["description"]
        for prop in schema["parameters"]["properties"].values():
            assert prop["description"] and prop["type"]


def test_action_tools_are_named_after_the_action(openenv_frozenlake_url: str) -> None:
    assert tools_of(environment_factory("rllm/FrozenLake-v0")).keys() == {"move"}
    assert tools_of(environment_factory("rllm/Math-v0")).keys() == {"submit_answer"}
    assert tools_of(environment_factory("rllm/Code-v0")).keys() == {"submit_solution"}
    assert tools_of(environment_factory("rllm/ReasoningGym-v0")).keys() == {"submit_answer"}
    assert tools_of(environment_factory("rllm/OpenEnv-v0", base_url=openenv_frozenlake_url)).keys() == {"reply"}
    tool_env = tools_of(environment_factory("rllm/Tool-v0"))
    assert tool_env.keys() == {"calculator", "search", "python", "finish"}
    assert tool_env["calculator"]["parameters"]["required"] == ["expression"]


def test_frozenlake_episode_through_the_move_tool() -> None:
    env = environment_factory("rllm/FrozenLake-v0", size=2, p=1.0)()
    first = env.reset(prompt=[{"role": "user", "content": "play"}], seed=3)
    assert first == env.reset(seed=3)  # the row's seed picks the episode
    # On a 2x2 map without holes, right then down (or down then right) reaches the goal from the top-left start.
    replies = [env.move(direction) for direction in ("right", "down", "left", "up", "right", "down")]
    ended = next(i for i, reply in enumerate(replies) if "The episode ended" in reply)
    assert "do not call any more tools" in replies[ended + 1]
    assert env.get_reward() == 1.0


def test_math_submit_answer_is_graded_and_counts_once() -> None:
    task = {"question": "What is 6 times 7?", "ground_truth": "42"}
    env = environment_factory("rllm/Math-v0")()
    assert env.reset(task=json.dumps(task)) == task["question"]
    assert env.get_reward() == 0.0
    env.submit_answer(answer="42")
    env.submit_answer(answer="41")  # after the end: not stepped, the return stays
    assert env.get_reward() == 1.0
    env.reset(task=task)
    env.submit_answer(answer="41")
    assert env.get_reward() == 0.0


def test_tool_env_calls_its_tools_and_finishes() -> None:
    task = {"question": "What is 123456789 * 987654321?", "ground_truth": str(123456789 * 987654321)}
    env = environment_factory("rllm/Tool-v0", tools=["calculator", "finish"])()
    env.reset(task=task)
    assert str(123456789 * 987654321) in env.calculator(expression="123456789 * 987654321")
    assert "Error" in env.calculator(expression=None)  # a missing argument is the env's malformed call, no exception
    assert env.get_reward() < 0  # the malformed call's penalty
    env.finish(response=task["ground_truth"])
    assert env.get_reward() == pytest.approx(0.95)


def test_bad_input_is_one_clear_error() -> None:
    with pytest.raises(UnknownEnvError, match=re.escape("Did you mean 'rllm/FrozenLake-v0'")):
        environment_factory("rllm/FrozenLak-v0")
    with pytest.raises(ValueError, match="multi-agent"):
        environment_factory("rllm/SolverJudge-v0")
    with pytest.raises(ValueError, match="size"):
        environment_factory("rllm/FrozenLake-v0", size=1)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(EnvServerError, match=re.escape(f"OpenEnv server {url} cannot be reached")) as error:
        environment_factory("rllm/OpenEnv-v0", base_url=url, timeout=2)
    assert "\n" not in str(error.value)
    env = environment_factory("rllm/Math-v0")()
    with pytest.raises(ValueError, match="field 'seed'"):
        env.reset(seed="3")
    with pytest.raises(ValueError, match="field 'task'"):
        env.reset(task="{not json")
    with pytest.raises(ValueError, match="positive int"):
        dataset_rows("rllm/Math-v0", 0)


def test_dataset_rows() -> None:
    rows = dataset_rows("rllm/FrozenLake-v0", 3, seed=10)
    assert rows["seed"] == [10, 11, 12]
    assert rows[0]["prompt"][0]["role"] == "user"


@pytest.mark.slow
def test_plain_trl_grpo_trainer_trains_two_steps(tiny_model_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = parse_qwen_tool_calls(AutoTokenizer.from_pretrained(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    factory = environment_factory("rllm/FrozenLake-v0", size=3)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=24,
        learning_rate=1e-2,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=dataset_rows("rllm/FrozenLake-v0", 8),
        environment_factory=factory,
        args=args,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert factory.__name__ in trainer.reward_func_names  # get_reward is the reward source
    assert all(len(pool) >= 1 and isinstance(pool[0], factory) for pool in trainer._environment_pool.values())
    logged = trainer.state.log_history[0]
    assert f"rewards/{factory.__name__}/mean" in logged  # get_reward is the reward source TRL logs
    assert "tools/call_frequency" in logged  # the env's move tool was offered to the model
    # TRL reset every rollout's env from its row before generating (a random model makes no tool calls, so no
    # episode ended and the rewards are all 0.0: the test checks the wiring, not learning).
    instances = [env for pool in trainer._environment_pool.values() for env in pool]
    assert len(instances) >= 4 and all(isinstance(env, factory) and not env._done for env in instances)
