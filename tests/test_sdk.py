"""The SDK: agent programs (async, sync, in another process) run as episodes through a real gateway."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest

from rllm_gym.policies import HFPolicy, ScriptedPolicy
from rllm_gym.sdk import AgentProgramEngine, load_function, run_agent_program
from rllm_gym.types import RewardOutput, TerminationReason

TASKS = [{"question": "move left", "answer": "left"}, {"question": "move up", "answer": "up"}]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(tiny_model_dir, max_batch_size=64)


async def two_turn_program(task, base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    first = await client.chat.completions.create(model="p", messages=messages, max_tokens=6)
    messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "once more"}]
    second = await client.chat.completions.create(model="p", messages=messages, max_tokens=6)
    return {"text": second.choices[0].message.content}


def graded(task, output):
    return RewardOutput(reward=1.0, is_correct=True, metadata={"length": len(output["text"]), "note": "x"})


async def test_an_async_program_becomes_an_episode_with_input_output_and_reward(policy):
    episodes = await run_agent_program(two_turn_program, TASKS, policy, reward_fn=graded, n_rollouts=2)
    assert [e.id for e in episodes] == [f"{e.task_id}:{i}" for e in episodes[:1] for i in range(2)] + [
        f"{episodes[2].task_id}:{i}" for i in range(2)
    ]
    for episode, task in zip(episodes, [TASKS[0]] * 2 + [TASKS[1]] * 2, strict=True):
        (trajectory,) = episode.trajectories
        assert episode.termination_reason is TerminationReason.ENV_DONE and episode.is_correct
        assert trajectory.input == {"task": task} and trajectory.output == episode.trajectories[0].output
        assert trajectory.reward == 1.0 and trajectory.signals == {"length": float(len(trajectory.output["text"]))}
        one, two = trajectory.steps
        assert two.prompt_ids[: len(one.prompt_ids) + len(one.response_ids)] == one.prompt_ids + one.response_ids
        assert len(two.logprobs) == len(two.response_ids) > 0
        assert (one.reward, two.reward) == (0.0, 1.0)


def sync_program(task, base_url):
    if task["question"] == "raise":
        raise ValueError("the program broke")
    if task["question"] == "hang":
        time.sleep(8)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="p", messages=[{"role": "user", "content": task["question"]}])
    # The program grades itself through its session.
    httpx.post(base_url.removesuffix("/v1") + "/reward", json={"reward": 0.25, "signals": {"tries": 1}})
    return reply.choices[0].message.content


async def test_a_program_that_raises_or_hangs_ends_its_own_episode_only():
    policy = ScriptedPolicy(["done"], cycle=True)
    tasks = [{"question": "raise"}, {"question": "hang"}, {"question": "fine"}]
    engine = AgentProgramEngine(sync_program, policy, timeout_s=2.0)
    episodes = await engine.run(tasks)
    reasons = [e.termination_reason for e in episodes]
    assert reasons == [TerminationReason.ERROR, TerminationReason.TIMEOUT, TerminationReason.ENV_DONE]
    assert episodes[0].metadata["error"]["message"] == "the program broke"
    fine = episodes[2].trajectories[0]
    assert (fine.output, fine.reward, fine.signals) == ("done", 0.25, {"tries": 1.0})
    assert not engine.gateway.url  # the engine's gateway listens only while episodes run


PROCESS = """
import os, sys
from openai import OpenAI
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
reply = client.chat.completions.create(model="p", messages=[{"role": "user", "content": sys.argv[1]}], max_tokens=5)
print(reply.choices[0].message.content)
"""


def program_in_another_process(task, base_url):
    environment = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "unused", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROCESS, task["question"]], env=environment, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


async def test_a_program_in_another_process_uses_the_openai_environment_variables(policy):
    (episode,) = await run_agent_program(
        program_in_another_process, TASKS[:1], policy, reward_fn=lambda task, output: 1.0, timeout_s=120
    )
    (step,) = episode.trajectories[0].steps
    assert episode.termination_reason is TerminationReason.ENV_DONE, episode.metadata
    assert step.chat_completions[0] == {"role": "user", "content": "move left"}
    assert len(step.response_ids) == len(step.logprobs) > 0
    assert episode.trajectories[0].output == step.model_output.content


async def test_a_reward_fn_with_a_wrong_return_type_is_an_error_episode():
    policy = ScriptedPolicy(["x"], cycle=True)
    (episode,) = await run_agent_program(sync_program, [{"question": "q"}], policy, reward_fn=lambda t, o: "good")
    assert episode.termination_reason is TerminationReason.ERROR
    assert "reward_fn must return a float or a RewardOutput, got str" in episode.metadata["error"]["message"]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (float("nan"), "reward_fn returned its reward = nan: a reward must be a finite number"),
        (float("-inf"), "reward_fn returned its reward = -inf: a reward must be a finite number"),
        (10**400, "reward_fn returned its reward = 1000000000"),
        (RewardOutput(reward=float("inf")), "reward_fn returned RewardOutput.reward = inf"),
        (RewardOutput(reward=1.0, metadata={"steps": float("nan")}), "RewardOutput.metadata['steps'] = nan"),
    ],
    ids=["nan", "-inf", "huge-int", "output-inf", "metadata-nan"],
)
async def test_a_reward_fn_that_returns_nan_or_inf_is_an_error_episode_not_a_reward(result, message):
    policy = ScriptedPolicy(["x"], cycle=True)
    (episode,) = await run_agent_program(sync_program, [{"question": "q"}], policy, reward_fn=lambda t, o: result)
    assert episode.termination_reason is TerminationReason.ERROR
    assert message in episode.metadata["error"]["message"]
    assert episode.trajectories[0].signals == {"tries": 1.0}  # what the program posted; no NaN joined it


def exiting_program(task, base_url):
    if task["question"] == "exit":
        sys.exit(3)
    if task["question"] == "interrupt":
        raise KeyboardInterrupt
    return "stayed"


async def async_exiting_program(task, base_url):
    if task["question"] == "exit":
        sys.exit("bye")
    return "stayed"


async def test_a_program_or_reward_fn_that_calls_sys_exit_ends_its_own_episode_in_error_not_the_batch():
    policy = ScriptedPolicy(["x"], cycle=True)
    tasks = [{"question": "exit"}, {"question": "interrupt"}, {"question": "fine"}]
    episodes = await run_agent_program(exiting_program, tasks, policy)
    episodes += await run_agent_program(async_exiting_program, [{"question": "exit"}, {"question": "fine"}], policy)
    (scored,) = await run_agent_program(exiting_program, tasks[2:], policy, reward_fn=lambda t, o: sys.exit(0))
    reasons = [e.termination_reason.value for e in [*episodes, scored]]
    assert reasons == ["error", "error", "env_done", "error", "env_done", "error"]
    messages = [e.metadata["error"]["message"] for e in (episodes[0], episodes[1], episodes[3], scored)]
    assert messages[0] == "exiting_program called sys.exit(3): return a value (or raise) instead"
    assert messages[1] == "exiting_program raised KeyboardInterrupt: return a value (or raise an Exception)"
    assert messages[2] == "async_exiting_program called sys.exit('bye'): return a value (or raise) instead"
    assert messages[3].endswith("called sys.exit(0): return a value (or raise) instead")
    assert episodes[0].metadata["error"]["type"] == "ProgramExitError"
    assert [episodes[2].trajectories[0].output, episodes[4].trajectories[0].output] == ["stayed", "stayed"]


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


class Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr")


ODD_OUTPUTS = {
    "deep": nested(300),
    "deeper": nested(5000),
    "unprintable": Unprintable(),
    "surrogate": ["caf\udce9"],  # bytes decoded with errors="surrogateescape"
    "surrogate key": {"\ud800": 1},
    "fine": [1, {"a": 2, "é": "ü"}],
}


def odd_output_program(task, base_url):
    return ODD_OUTPUTS[task["question"]]


async def test_an_output_a_record_cannot_hold_is_kept_as_text_and_the_run_writes_every_episode(tmp_path):
    tasks = [{"question": q} for q in ODD_OUTPUTS]
    out = tmp_path / "episodes.jsonl"
    episodes = await run_agent_program(odd_output_program, tasks, ScriptedPolicy(["x"], cycle=True), out=out)
    assert [e.termination_reason for e in episodes] == [TerminationReason.ENV_DONE] * len(tasks)
    outputs = [e.trajectories[0].output for e in episodes]
    assert outputs[:3] == [repr(nested(300)), "<list without a repr>", "<Unprintable without a repr>"]
    assert outputs[3:] == ["['caf\\udce9']", "{'\\ud800': 1}", [1, {"a": 2, "é": "ü"}]]
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(tasks)


async def program_that_swallows_errors(task, base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    answers = []
    for question in ("1+1?", "2+2?"):
        try:
            reply = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": question}])
            answers.append(reply.choices[0].message.content)
        except openai.APIError:
            answers.append("")  # a program that answers whatever happens
    return answers


async def test_a_policy_failure_the_program_swallows_is_an_error_episode_not_a_wrong_answer():
    policy = ScriptedPolicy(["2"])  # one reply, then the policy fails (a 502 to the program)
    (episode,) = await run_agent_program(
        program_that_swallows_errors, [{"question": "q"}], policy, reward_fn=lambda t, o: float(o == ["2", "4"])
    )
    assert episode.termination_reason is TerminationReason.ERROR
    assert episode.metadata["error"]["type"] == "PolicyError"
    assert "a call of this episode met a policy failure:" in episode.metadata["error"]["message"]
    assert "ran out of replies" in episode.metadata["error"]["message"]
    assert episode.trajectories[0].output == ["2", ""] and len(episode.trajectories[0].steps) == 1


async def program_raising_what_ends_a_run(task, base_url):
    if task["question"] == "cancelled":
        raise asyncio.CancelledError  # its own, not the episode's
    if task["question"] == "generator exit":
        raise GeneratorExit
    if task["question"] == "hang":
        await asyncio.sleep(60)
    return "stayed"


def sync_program_raising_cancelled(task, base_url):
    raise asyncio.CancelledError


async def test_a_program_raising_cancelled_error_ends_its_own_episode_and_a_real_timeout_stays_a_timeout():
    policy = ScriptedPolicy(["x"], cycle=True)
    tasks = [{"question": q} for q in ("cancelled", "generator exit", "hang", "fine")]
    episodes = await run_agent_program(program_raising_what_ends_a_run, tasks, policy, timeout_s=2.0)
    episodes += await run_agent_program(sync_program_raising_cancelled, tasks[:1], policy)
    assert [e.termination_reason.value for e in episodes] == ["error", "error", "timeout", "env_done", "error"]
    name = "program_raising_what_ends_a_run"
    assert [e.metadata["error"]["message"] for e in (episodes[0], episodes[1], episodes[4])] == [
        f"{name} raised CancelledError: return a value (or raise an Exception)",
        f"{name} raised GeneratorExit: return a value (or raise an Exception)",
        "sync_program_raising_cancelled raised CancelledError: return a value (or raise an Exception)",
    ]


async def program_whose_client_times_out(task, base_url):
    if task["question"] == "own timeout":
        raise TimeoutError("the tool server did not answer")
    return "answer"


def grader_that_times_out(task, output):
    raise TimeoutError("the grader did not answer")


async def test_a_timeout_error_of_the_program_or_reward_fn_is_an_error_not_the_models_timeout():
    policy = ScriptedPolicy(["x"], cycle=True)
    tasks = [{"question": "own timeout"}, {"question": "fine"}]
    episodes = await run_agent_program(program_whose_client_times_out, tasks, policy)
    episodes += await run_agent_program(
        program_whose_client_times_out, tasks[1:], policy, reward_fn=grader_that_times_out
    )
    assert [e.termination_reason.value for e in episodes] == ["error", "env_done", "error"]
    assert [e.metadata["error"]["message"] for e in (episodes[0], episodes[2])] == [
        "program_whose_client_times_out raised TimeoutError: the tool server did not answer",
        "grader_that_times_out raised TimeoutError: the grader did not answer",
    ]


@pytest.mark.parametrize(
    "result", [np.float32(0.5), np.float64(0.5), np.int64(1)], ids=["float32", "float64", "int64"]
)
async def test_a_reward_fn_may_return_a_numpy_number(result):
    policy = ScriptedPolicy(["x"], cycle=True)
    (episode,) = await run_agent_program(sync_program, [{"question": "q"}], policy, reward_fn=lambda t, o: result)
    assert episode.termination_reason is TerminationReason.ENV_DONE
    assert episode.trajectories[0].reward == float(result) and type(episode.trajectories[0].reward) is float


def test_load_function_names_what_is_wrong():
    assert load_function("rllm_gym.sdk:load_function") is load_function
    with pytest.raises(ValueError, match="must be 'module:function'"):
        load_function("rllm_gym.sdk.load_function")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_x'"):
        load_function("no_such_module_x:f", "--reward-fn")
    with pytest.raises(ValueError, match="has no attribute 'nothing'"):
        load_function("rllm_gym.sdk:nothing")
    with pytest.raises(ValueError, match="is a list, not a function"):
        load_function("rllm_gym.sdk:__all__")


def test_sessions_are_closed_when_episodes_end():
    policy = ScriptedPolicy(["ok"], cycle=True)
    engine = AgentProgramEngine(sync_program, policy)
    asyncio.run(engine.run([{"question": "a"}, {"question": "b"}], n_rollouts=2))
    assert engine.gateway.open_sessions == 0


async def calls_until_refused(task, base_url):
    """Asks again and again; returns what it saw when the gateway refuses a call, or raises (task["raise"])."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    for _ in range(10):
        try:
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "again"}])
        except openai.BadRequestError as error:
            if task.get("raise"):
                raise
            return error.code
    return "never refused"


def output_of(task, output):
    return float(output == "max_turns_exceeded")


async def test_max_turns_refuses_the_next_call_and_ends_the_episode_as_max_turns_exceeded():
    policy = ScriptedPolicy(["ok"], cycle=True)
    tasks = [{"raise": False}, {"raise": True}]
    episodes = await run_agent_program(calls_until_refused, tasks, policy, reward_fn=output_of, max_turns=3)
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.MAX_TURNS_EXCEEDED, episode.metadata
        assert len(episode.trajectories[0].steps) == 3
    returned, raised = (episode.trajectories[0] for episode in episodes)
    # The program saw the OpenAI error code; its answer is still scored when it returns one.
    assert (returned.output, returned.reward) == ("max_turns_exceeded", 1.0)
    assert raised.output is None and raised.reward == 0.0
    # A program within its limit ends as usual.
    (fine,) = await run_agent_program(calls_until_refused, tasks[:1], policy, reward_fn=output_of, max_turns=10)
    assert fine.termination_reason is TerminationReason.ENV_DONE and fine.trajectories[0].output == "never refused"
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        AgentProgramEngine(calls_until_refused, policy, max_turns=0)
