"""VLLMPolicy on real vLLM: CPU defaults, generation, logprobs against transformers, stop strings, loops and threads,
episodes through the engine. One engine for the whole module."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm_gym.policies.base import SamplingParams
from rllm_gym.types import TerminationReason

CHATS = [[{"role": "user", "content": text}] for text in ("What is 3 + 4?", "move left", "find the goal", "hi")]
# GRPO's importance ratio compares these logprobs with the trainer's float32 forward pass on the same ids.
MEAN_TOLERANCE_NATS = 0.01


@pytest.fixture(scope="module")
def policy(vllm_model_dir):
    from rllm_gym.policies.vllm import VLLMPolicy

    policy = VLLMPolicy(vllm_model_dir)  # the project's CPU defaults, nothing passed
    yield policy
    policy.shutdown()


def _generate_all(policy, chats, params):
    async def run():
        return await asyncio.gather(*(policy.generate(chat, params) for chat in chats))

    return asyncio.run(run())


def test_the_installed_vllm_gets_prompt_ids_as_direct_token_input():
    # A TokensPrompt would go vLLM's raw-prompt way (a deprecation warning and a hop to the renderer's threads).
    import vllm
    from vllm.inputs import tokens_input

    from rllm_gym.policies.vllm import token_input_builder

    assert token_input_builder(vllm) is tokens_input
    assert tokens_input([1, 2]) == {"type": "token", "prompt_token_ids": [1, 2]}


def test_cpu_defaults_reach_the_engine(policy):
    from rllm_gym.policies.vllm import CPU_KV_CACHE_BYTES

    config = policy.engine.vllm_config
    assert config.model_config.dtype == torch.float32  # the checkpoint's dtype, not the CPU backend's bfloat16
    assert config.model_config.enforce_eager is True
    assert config.scheduler_config.enable_chunked_prefill is False
    assert config.cache_config.kv_cache_memory_bytes == CPU_KV_CACHE_BYTES


def test_many_seeded_requests_past_one_batch_of_prompt_tokens(policy, vllm_model_dir):
    # 32 prompts of ~100 tokens in flight pass max_num_batched_tokens (2,048): with chunked prefill (vLLM's default)
    # a seeded request split over two steps killed the CPU engine ("CPU Generator does not use offset").
    chats = [[{"role": "user", "content": f"{i} " + "move left then down " * 20}] for i in range(32)]
    outs = _generate_all(policy, chats, SamplingParams(temperature=1.0, max_tokens=4, seed=7))
    assert sum(len(out.prompt_ids) for out in outs) > 2048
    assert all(len(out.completion_ids) == len(out.logprobs) >= 1 for out in outs)


def test_generation_carries_ids_and_one_logprob_per_token(policy, vllm_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    outs = _generate_all(policy, CHATS, SamplingParams(temperature=1.0, max_tokens=12, seed=3))
    for chat, out in zip(CHATS, outs, strict=True):
        assert out.prompt_ids == tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
        assert 1 <= len(out.completion_ids) <= 12 and len(out.logprobs) == len(out.completion_ids)
        assert all(lp <= 0.0 for lp in out.logprobs)
        # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 sequence (a reply cut by max_tokens
        # mid-character), which a full decode shows as U+FFFD: the texts agree up to that.
        decoded = tokenizer.decode(out.completion_ids, skip_special_tokens=True)
        assert decoded.startswith(out.text) and set(decoded[len(out.text) :]) <= {"\ufffd"}
    again = _generate_all(policy, CHATS, SamplingParams(temperature=1.0, max_tokens=12, seed=3))
    assert [o.completion_ids for o in again] == [o.completion_ids for o in outs]  # a seed fixes the sample


def test_logprobs_equal_a_float32_transformers_forward_pass(policy, vllm_model_dir):
    outs = _generate_all(policy, CHATS, SamplingParams(temperature=1.0, max_tokens=16, seed=11))
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32).eval()
    diffs = []
    for out in outs:
        ids = torch.tensor([out.prompt_ids + out.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(out.prompt_ids) - 1 : -1]
        reference = torch.log_softmax(logits.float(), dim=-1)
        reference = reference.gather(1, torch.tensor(out.completion_ids)[:, None])[:, 0]
        diffs.extend((reference - torch.tensor(out.logprobs)).abs().tolist())
    assert len(diffs) >= 16
    mean = sum(diffs) / len(diffs)
    assert mean < MEAN_TOLERANCE_NATS, (mean, max(diffs))
    assert max(diffs) < 0.05


def test_stop_strings_cut_the_reply(policy):
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    (full,) = _generate_all(policy, CHATS[:1], greedy)
    text = full.text
    assert len(text) >= 6, text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut_at = text.index(stop)
    (cut,) = _generate_all(policy, CHATS[:1], SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]))
    assert cut.text == text[:cut_at] and cut.finish_reason == "stop"
    assert len(cut.completion_ids) < len(full.completion_ids) and len(cut.logprobs) == len(cut.completion_ids)


def test_a_streamed_request_hands_over_its_tokens_as_they_come_and_samples_the_same(policy):
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=4)
    pieces = []

    async def run():
        streamed = await policy.generate(CHATS[1], params, on_token=pieces.append)
        return streamed, await policy.generate(CHATS[1], params)

    streamed, plain = asyncio.run(run())
    assert policy.streams_tokens and len(pieces) > 1  # one engine step at a time, not the whole reply at the end
    assert [t for piece in pieces for t in piece] == streamed.completion_ids == plain.completion_ids
    assert streamed.logprobs == plain.logprobs and streamed.text == plain.text
    assert policy.engine.log_stats is False  # vllm.LLM's default: no per-step stats on the engine's loop


def test_the_gateway_streams_a_vllm_reply_token_by_token(policy):
    import openai

    from rllm_gym.gateway import Gateway

    async def run():
        async with Gateway(policy) as gateway:
            session = gateway.open_session()
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.id, max_retries=0)
            stream = await client.chat.completions.create(
                model="p", messages=CHATS[1], max_tokens=24, temperature=1.0, seed=2, stream=True
            )
            chunks = [chunk async for chunk in stream]
            return chunks, gateway.close_session(session.id).steps

    chunks, (step,) = asyncio.run(run())
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == step.model_output.content and len(step.response_ids) >= 1
    assert len(deltas) > 1 or len(step.model_output.content.split()) <= 1


def test_several_event_loops_and_threads_share_the_engine(policy):
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    first = [o.completion_ids for o in _generate_all(policy, CHATS, greedy)]
    assert [o.completion_ids for o in _generate_all(policy, CHATS, greedy)] == first  # a second asyncio.run
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: [o.completion_ids for o in _generate_all(policy, CHATS, greedy)], range(4)))
    assert results == [first] * 4


async def test_episodes_through_the_engine(policy, vllm_model_dir, frozenlake_engine):
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    engine = frozenlake_engine(policy, max_turns=3, max_tokens=12)
    episodes = await engine.run(list(range(4)), n_rollouts=2)
    assert len(episodes) == 8
    steps = 0
    for episode in episodes:
        assert episode.termination_reason is not TerminationReason.ERROR, episode.metadata.get("error")
        previous = None
        for step in episode.trajectories[0].steps:
            steps += 1
            if previous is None:  # an episode's first prompt is the chat template's rendering
                expected = tokenizer.apply_chat_template(
                    step.chat_completions[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
                )
                assert step.prompt_ids == list(expected)
            else:  # token in, token out: later prompts continue exactly what vLLM saw and sampled
                seen = previous.prompt_ids + previous.response_ids
                assert step.prompt_ids[: len(seen)] == seen and len(step.prompt_ids) > len(seen)
            assert step.response_ids and len(step.logprobs) == len(step.response_ids)
            previous = step
    assert steps >= 8


def test_shared_sampling_params_skip_vllms_deep_copy_and_stay_as_built(policy):
    import vllm
    from packaging.specifiers import SpecifierSet

    from rllm_gym.policies.vllm_adapter import INTERNALS, SUPPORTED_VLLM, available

    # If this fails after an upgrade of vLLM: read SamplingParams.clone() and InputProcessor.process_inputs again,
    # then move SUPPORTED_VLLM or the internal (meanwhile vLLM deep-copies the params per request, as it used to).
    assert vllm.__version__ in SpecifierSet(",".join(SUPPORTED_VLLM))
    for name, internal in INTERNALS.items():
        assert internal.present() and available(vllm, name), internal.where
    seeded = SamplingParams(temperature=1.0, max_tokens=6, seed=11, stop=["zz"])
    first = _generate_all(policy, CHATS, seeded)
    shared = policy._vllm_params[(seeded, False)]
    assert shared.skip_clone is True

    def settings():
        return shared.max_tokens, list(shared.stop), shared.seed, shared.stop_token_ids, set(shared.all_stop_token_ids)

    built = settings()
    second = _generate_all(policy, CHATS, seeded)
    # vLLM's per-request changes went to its shallow copies: the shared object and what it samples stay the same.
    assert settings() == built and built[:4] == (6, ["zz"], 11, [])
    assert [o.completion_ids for o in second] == [o.completion_ids for o in first]
    assert [o.logprobs for o in second] == [o.logprobs for o in first]
