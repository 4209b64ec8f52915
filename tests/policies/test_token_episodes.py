"""Token in, token out over whole episodes: on FrozenLake, Math-v0 with retries and Tool-v0, with the embedded model
(HFPolicy), a token-level stand-in that spells its replies with unusual tokens, OpenAIPolicy on a server that takes
token prompts and VLLMPolicy on a stand-in engine: every call's prompt starts with the previous prompt and
completion, token for token, and each trajectory is one training row."""

from __future__ import annotations

import asyncio
import itertools
import json
import random

import pytest

from rllm_gym.engine import engine_for
from rllm_gym.policies import HFPolicy, OpenAIPolicy, SamplingParams
from rllm_gym.policies.base import BasePolicy, PolicyRequest, build_model_output
from rllm_gym.policies.stub_server import StubOpenAIServer
from rllm_gym.train.sequences import trajectory_to_sequences
from rllm_gym.types import Episode, ModelOutput

ENVS = {  # env id -> (env arguments, the LLM calls an episode may make)
    "rllm/FrozenLake-v0": ({}, 4),
    "rllm/Math-v0": ({"max_turns": 3}, 3),  # retries: a wrong answer gets feedback and another turn
    "rllm/Tool-v0": ({}, 4),
}


def check_episodes(episodes: list[Episode]) -> int:
    """Assert token in, token out for every pair of consecutive calls; one row per trajectory. The calls checked."""
    pairs = 0
    for episode in episodes:
        assert "error" not in episode.metadata, episode.metadata.get("error")
        for trajectory in episode.trajectories:
            for before, after in itertools.pairwise(trajectory.steps):
                context = before.prompt_ids + before.response_ids
                assert after.prompt_ids[: len(context)] == context, f"{episode.id}: a prompt re-rendered the chat"
                pairs += 1
            rows = trajectory_to_sequences(trajectory)
            assert len(rows) == 1 and not rows[0].prefix_mismatch
            assert rows[0].prompt_ids + rows[0].completion_ids == trajectory.steps[-1].prompt_ids + (
                trajectory.steps[-1].response_ids
            )
            assert episode.metrics["text_rendered_calls"] == 0
    return pairs


def run(env_id: str, policy, episodes: int, max_tokens: int, seed: int = 0) -> list[Episode]:
    env_args, max_steps = ENVS[env_id]
    engine = engine_for(
        env_id,
        policy,
        env_args=env_args,
        max_turns=max_steps,
        n_parallel=episodes,
        stop_on_truncation=False,  # cut replies go on: they are the case where an end-of-turn token is added
        sampling_params=SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=None),
    )
    tasks = list(range(seed, seed + episodes)) if env_id == "rllm/FrozenLake-v0" else None
    if tasks is None:
        return asyncio.run(engine.run_pairs([(None, f"t{i}:{i}") for i in range(episodes)]))
    return asyncio.run(engine.run_pairs([(task, f"seed-{task}:0") for task in tasks]))


@pytest.fixture(scope="module")
def model_policy(tiny_model_dir) -> HFPolicy:
    return HFPolicy(tiny_model_dir, max_batch_size=64)


@pytest.mark.parametrize("env_id", ["rllm/FrozenLake-v0", "rllm/Math-v0"])
def test_the_embedded_model_is_conditioned_on_exactly_what_it_sampled(model_policy, env_id):
    episodes = run(env_id, model_policy, episodes=24, max_tokens=10)
    assert check_episodes(episodes) >= 24  # multi-turn: most episodes make several calls
    finishes = {s.model_output.finish_reason for e in episodes for s in e.trajectories[0].steps}
    assert "length" in finishes  # replies cut by the length limit, continued with the end-of-turn token


class SpellingPolicy(BasePolicy):
    """A token-level stand-in backend whose replies are valid actions and tool calls spelled one character per token
    (text that re-tokenizes differently), some with the end-of-turn token, some cut: the same prompt bookkeeping as
    HFPolicy, VLLMPolicy and OpenAIPolicy."""

    def __init__(self, tokenizer, seed: int):
        super().__init__(tokenizer)
        self.random = random.Random(seed)
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def reply(self) -> str:
        call = {"name": "calculator", "arguments": {"expression": f"{self.random.randint(1, 99)} * 7"}}
        replies = [
            f"Action: {self.random.choice(['left', 'right', 'up', 'down'])}",
            f"<tool_call>\n{json.dumps(call)}\n</tool_call>",  # Tool-v0 goes on after a call, the others grade it
            f"<think>try {self.random.randint(1, 9)}</think>\\boxed{{{self.random.randint(1, 9)}}}",
        ]
        return self.random.choices(replies, weights=[1, 6, 1])[0]

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        prompt = self.prompt_token_ids(request)
        text = self.reply()
        ids = [i for ch in text for i in self.tokenizer.encode(ch, add_special_tokens=False)]
        assert ids != self.tokenizer.encode(text, add_special_tokens=False)  # not the tokenizer's own spelling
        cut = self.random.random() < 0.3
        ids = ids[: self.random.randint(1, len(ids))] if cut else [*ids, self.im_end]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        finish_reason = "length" if cut else "stop"
        return build_model_output(text, prompt_ids=prompt, completion_ids=ids, finish_reason=finish_reason)


@pytest.mark.parametrize("env_id", list(ENVS))
def test_replies_spelled_with_other_tokens_are_kept_as_sampled(model_policy, env_id):
    episodes = run(env_id, SpellingPolicy(model_policy.tokenizer, seed=len(env_id)), episodes=40, max_tokens=64)
    assert check_episodes(episodes) >= 30
    if env_id == "rllm/Tool-v0":  # tool results came back as messages after tool calls
        assert any("<tool_response>" in str(s.observation) for e in episodes for s in e.trajectories[0].steps)


def test_openai_policy_sends_the_continued_tokens_to_a_token_prompt_server(model_policy):
    tokenizer = model_policy.tokenizer
    rng = random.Random(1)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def reply_ids(prompt: list[int]) -> list[int]:  # random tokens, sometimes the end-of-turn token
        ids = [rng.randrange(300, 900) for _ in range(rng.randint(1, 6))]
        return [*ids, im_end] if rng.random() < 0.5 else ids

    with StubOpenAIServer(reply_ids=reply_ids) as server:
        policy = OpenAIPolicy("stub", server.url, tokenizer=tokenizer, return_token_ids=True)
        episodes = run("rllm/FrozenLake-v0", policy, episodes=8, max_tokens=6)
        requests = list(server.requests)
    assert check_episodes(episodes) >= 8
    assert {path for path, _ in requests} == {"/v1/completions"}
    sent = {tuple(body["prompt"]) for _, body in requests}
    assert {tuple(s.prompt_ids) for e in episodes for s in e.trajectories[0].steps} == sent  # the ids it was given


def test_a_chat_text_server_call_is_marked_and_counted():
    with StubOpenAIServer(reply="Action: left") as server:
        policy = OpenAIPolicy("stub", server.url)
        [episode] = run("rllm/FrozenLake-v0", policy, episodes=1, max_tokens=6)
    steps = episode.trajectories[0].steps
    assert steps and all(s.model_output.text_rendered for s in steps)
    assert episode.metrics["text_rendered_calls"] == len(steps)


def test_vllm_policy_feeds_the_continued_tokens_to_its_engine(standin_vllm, tiny_model_dir):
    from rllm_gym.policies.vllm import VLLMPolicy

    policy = VLLMPolicy(str(tiny_model_dir))
    try:
        episodes = run("rllm/FrozenLake-v0", policy, episodes=6, max_tokens=6)
    finally:
        policy.shutdown()
    assert check_episodes(episodes) >= 6
    prompts = [s.prompt_ids for e in episodes for s in e.trajectories[0].steps]
    assert sorted(policy.engine.prompts) == sorted(prompts)  # the engine was given exactly the recorded ids
