"""The gateway on VLLMPolicy (real vLLM): an agent program written with the ``openai`` client, run through the
gateway, records Steps with the very ids and logprobs the same VLLMPolicy gives when called directly. One engine."""

from __future__ import annotations

import asyncio

import openai
import pytest

from rllm_gym.policies.base import SamplingParams
from rllm_gym.sdk import run_agent_program
from rllm_gym.types import Step, TerminationReason

TURNS = 2
PARAMS = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def policy(vllm_model_dir):
    from rllm_gym.policies.vllm import VLLMPolicy

    policy = VLLMPolicy(vllm_model_dir)
    yield policy
    policy.shutdown()


def first_message(task: int) -> dict[str, str]:
    return {"role": "user", "content": f"move left then up, task {task}"}


async def program(task: int, base_url: str) -> str:
    """Two greedy turns, the second extending the first (so its prompt continues the first's tokens)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [first_message(task)]
    content = ""
    for _ in range(TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=12, temperature=0)
        content = reply.choices[0].message.content or ""
        messages = [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": "and again"}]
    await client.close()
    return content


async def direct(policy, task: int) -> list:
    """The same two calls on the policy itself: ``previous`` continues the first call's prompt and sampled ids."""
    messages, outputs, previous = [first_message(task)], [], None
    for _ in range(TURNS):
        output = await policy.generate(messages, PARAMS, previous=previous)
        outputs.append(output)
        reply = {"role": "assistant", "content": output.content}
        previous = Step(
            chat_completions=[*messages, reply], prompt_ids=output.prompt_ids, response_ids=output.completion_ids
        )
        messages = [*messages, reply, {"role": "user", "content": "and again"}]
    return outputs


def test_a_greedy_two_turn_program_through_the_gateway_records_the_direct_paths_ids_and_logprobs(policy):
    tasks = [0, 1, 2]

    async def both():
        # One request at a time on both paths: the same batch (of one) in the engine, so the same floating point.
        expected = [await direct(policy, task) for task in tasks]
        episodes = await run_agent_program(program, tasks, policy, sampling_params=PARAMS, n_parallel=1)
        return expected, episodes

    expected, episodes = asyncio.run(both())
    for outputs, episode in zip(expected, episodes, strict=True):
        assert episode.termination_reason == TerminationReason.ENV_DONE
        steps = episode.trajectories[0].steps
        assert len(steps) == TURNS
        for output, step in zip(outputs, steps, strict=True):
            assert step.prompt_ids == output.prompt_ids
            assert step.response_ids == output.completion_ids and len(step.response_ids) >= 1
            assert step.logprobs == output.logprobs and len(step.logprobs) == len(step.response_ids)
        # Token in, token out: the second prompt starts with the first call's prompt and sampled ids.
        first, second = steps
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == [
            *first.prompt_ids,
            *first.response_ids,
        ]
