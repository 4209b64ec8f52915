from __future__ import annotations

import asyncio
import re

import pytest

from rllm_gym.policies import HFPolicy, SamplingParams

CHAT = [{"role": "user", "content": "What is 2 + 3?"}]
CHATS = [
    CHAT,
    [{"role": "user", "content": "Say a long sentence about a frozen lake, please."}],
    [{"role": "user", "content": "hi"}],
]


@pytest.fixture(scope="module")
def policy(tiny_model_dir) -> HFPolicy:
    return HFPolicy(tiny_model_dir)


async def test_a_temperature_below_vllms_greedy_threshold_decodes_greedily_rather_than_failing(policy):
    greedy = await policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=6))
    for tiny in (1e-300, 5e-6):  # logits / 1e-300 are infinite: sampling from them fails
        out = await policy.generate(CHAT, SamplingParams(temperature=tiny, max_tokens=6))
        assert out.completion_ids == greedy.completion_ids


async def test_greedy_output_has_ids_logprobs_and_lengths(policy):
    out = await policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=10))
    again = await policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=10))
    assert out == again
    assert out.prompt_ids == policy.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    assert len(out.completion_ids) == len(out.logprobs) == out.completion_length == 10
    assert out.prompt_length == len(out.prompt_ids)
    assert all(lp <= 0 for lp in out.logprobs)
    assert out.finish_reason == "length"
    assert out.text == policy.tokenizer.decode(out.completion_ids, skip_special_tokens=True)


async def test_concurrent_requests_are_batched_and_match_solo_results(policy):
    chats = [[{"role": "user", "content": f"question {i}"}] for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=6)
    solo = [await policy.generate(chat, params) for chat in chats]
    policy.batch_sizes.clear()
    together = await asyncio.gather(*(policy.generate(chat, params) for chat in chats))
    assert policy.batch_sizes == [8]
    assert [o.completion_ids for o in together] == [o.completion_ids for o in solo]
    for batched, alone in zip(together, solo, strict=True):
        assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


async def test_a_batch_goes_out_once_every_expected_request_arrived(tiny_model_dir):
    # A long wait that the batch never sits out: it is sent when the 3 expected requests (or max_batch_size) are in.
    waiting = HFPolicy(tiny_model_dir, batch_wait_s=30, max_batch_size=64)
    waiting.expected_requests = lambda: 3
    params = SamplingParams(temperature=0, max_tokens=2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(*(waiting.generate([{"role": "user", "content": f"q{i}"}], params) for i in range(3)))
    full = HFPolicy(tiny_model_dir, batch_wait_s=30, max_batch_size=2)
    await asyncio.gather(*(full.generate([{"role": "user", "content": f"q{i}"}], params) for i in range(2)))
    assert loop.time() - start < 20
    assert waiting.batch_sizes == [3] and full.batch_sizes == [2]
    await waiting.aclose()
    await full.aclose()


async def test_requests_with_different_params_run_in_separate_batches(policy):
    policy.batch_sizes.clear()
    short, long = await asyncio.gather(
        policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=2)),
        policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=5)),
    )
    assert sorted(policy.batch_sizes) == [1, 1]
    assert (len(short.completion_ids), len(long.completion_ids)) == (2, 5)
    assert long.completion_ids[:2] == short.completion_ids


async def test_sampling_with_a_seed_is_reproducible(policy):
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
    first = await policy.generate(CHAT, params)
    second = await policy.generate(CHAT, params)
    other = await policy.generate(CHAT, SamplingParams(temperature=1.0, max_tokens=12, seed=8))
    assert first.completion_ids == second.completion_ids
    assert other.completion_ids != first.completion_ids


async def test_stop_strings_end_the_completion_and_are_left_out(policy):
    greedy = await policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=12))
    stop = greedy.text.strip()[3:5]  # a piece of text the model is known to produce
    out = await policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=12, stop=[stop]))
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert greedy.text.startswith(out.text)
    assert len(out.completion_ids) < 12


async def test_prompt_ids_and_thinking_switch(tiny_model_dir, policy):
    no_think = HFPolicy(tiny_model_dir, enable_thinking=False)
    out = await no_think.generate(CHAT, SamplingParams(temperature=0, max_tokens=3))
    assert no_think.tokenizer.decode(out.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    params = SamplingParams(temperature=0, max_tokens=3)
    same = await policy.generate(prompt_ids=out.prompt_ids, sampling_params=params)
    assert same.completion_ids == out.completion_ids


async def test_exactly_one_of_messages_and_prompt_ids(policy):
    with pytest.raises(ValueError, match="exactly one of `messages`"):
        await policy.generate(CHAT, prompt_ids=[1, 2])
    with pytest.raises(ValueError, match="exactly one of `messages`"):
        await policy.generate()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": "8"}, "HFPolicy(max_batch_size=...) must be an int >= 1, got '8'"),
        ({"max_batch_size": 0}, "HFPolicy(max_batch_size=...) must be an int >= 1, got 0"),
        ({"batch_wait_s": -1}, "HFPolicy(batch_wait_s=...) must be seconds in [0, 60), got -1"),
        ({"device": "gpu"}, "HFPolicy(device=...) must be a torch device such as 'cpu', 'cuda', 'cuda:1', or 'auto'"),
    ],
)
def test_bad_arguments_name_the_argument(tiny_model_dir, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        HFPolicy(tiny_model_dir, **kwargs)


@pytest.mark.parametrize("checkpoint_penalty", [None, 5.0])
async def test_logprobs_are_gathered_per_step_and_match_the_stacked_logits(policy, checkpoint_penalty, monkeypatch):
    """The sampled tokens' logprobs as the old method computed them (every step's raw logits kept, (B, T, V)),
    without asking generate for the logits or scores; a checkpoint's repetition penalty does not leak in."""
    import torch

    from rllm_gym.policies import hf

    monkeypatch.setattr(policy.model.generation_config, "repetition_penalty", checkpoint_penalty)
    params = SamplingParams(temperature=1.0, max_tokens=9, seed=3)
    config = policy._generation_config(params)
    assert not (config.output_logits or config.output_scores or config.return_dict_in_generate)
    prompts = [policy.tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=False) for c in CHATS]
    kept: list[hf.SampledLogprobs] = []

    class Spy(hf.SampledLogprobs):
        def __init__(self, *args):
            super().__init__(*args)
            kept.append(self)

    original = hf.SampledLogprobs
    hf.SampledLogprobs = Spy
    try:
        outputs = policy._generate_batch(prompts, params)
    finally:
        hf.SampledLogprobs = original
    [spy] = kept
    assert len(spy.steps) == 9 and all(step.shape == (len(prompts),) for step in spy.steps)  # O(B x T) kept

    width = max(map(len, prompts))
    ids = torch.tensor([[policy.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    old_config = policy._generation_config(params)
    old_config.return_dict_in_generate = old_config.output_logits = True
    with torch.random.fork_rng():
        torch.manual_seed(3)
        out = policy.model.generate(input_ids=ids, attention_mask=mask, generation_config=old_config)
    tokens = out.sequences[:, width:]
    old = torch.log_softmax(torch.stack(out.logits, 1).float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    for row, output in enumerate(outputs):
        assert output.completion_ids == tokens[row, : len(output.completion_ids)].tolist()
        assert output.logprobs == pytest.approx(old[row, : len(output.logprobs)].tolist(), abs=1e-5)


@pytest.mark.parametrize("mode", ["raw", "temperature"])
async def test_logprobs_mode_scores_the_sampled_tokens_at_the_requests_temperature(tiny_model_dir, mode):
    """logprobs_mode="temperature": each sampled token's log-probability under logits / T, what TRL's loss scores
    (the async trainer's behaviour log-probabilities); "raw": under the logits themselves. Checked by a forward pass
    over the prompt and the sampled tokens."""
    import torch

    policy = HFPolicy(tiny_model_dir, logprobs_mode=mode)
    out = await policy.generate(CHATS[1], SamplingParams(temperature=0.5, max_tokens=8, seed=1))
    ids = torch.tensor([out.prompt_ids + out.completion_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(out.prompt_ids) - 1 : -1].float()
    scale = 0.5 if mode == "temperature" else 1.0
    want = torch.log_softmax(logits / scale, -1).gather(-1, torch.tensor(out.completion_ids)[:, None])[:, 0]
    assert out.logprobs == pytest.approx(want.tolist(), abs=1e-4)
    other = torch.log_softmax(logits / (1.5 - scale), -1).gather(-1, torch.tensor(out.completion_ids)[:, None])[:, 0]
    # the two modes really differ
    assert max(abs(a - b) for a, b in zip(out.logprobs, other.tolist(), strict=True)) > 1e-2
    greedy = await policy.generate(CHATS[1], SamplingParams(temperature=0, max_tokens=4))
    raw = await HFPolicy(tiny_model_dir).generate(CHATS[1], SamplingParams(temperature=0, max_tokens=4))
    assert greedy.logprobs == pytest.approx(raw.logprobs, abs=1e-6)  # greedy: no temperature to score at


def test_logprobs_mode_is_checked(tiny_model_dir):
    with pytest.raises(ValueError, match="logprobs_mode"):
        HFPolicy(tiny_model_dir, logprobs_mode="processed")


def test_sampled_logprobs_keep_one_step_of_logits_at_a_time():
    import torch

    from rllm_gym.policies.hf import SampledLogprobs

    collector = SampledLogprobs()
    scores = [torch.randn(2, 50) for _ in range(3)]
    tokens = torch.tensor([[4, 7, 9], [1, 2, 3]])
    prefix = torch.zeros(2, 5, dtype=torch.long)
    for step, step_scores in enumerate(scores):
        input_ids = torch.cat([prefix, tokens[:, :step]], dim=1)
        assert collector(input_ids, step_scores) is step_scores  # the scores pass through unchanged
        assert len(collector.steps) == step  # the token of a step is taken once the next step shows it
    got = collector.finish(tokens)
    want = torch.stack(
        [torch.log_softmax(s, -1).gather(-1, tokens[:, i : i + 1]).squeeze(-1) for i, s in enumerate(scores)], 1
    )
    assert got.shape == (2, 3) and torch.allclose(got, want)


async def test_requests_that_trickle_in_join_one_batch_while_more_are_expected(tiny_model_dir):
    # Requests 0.15 s apart, 0.45 s from the first to the last: a wait of 0.3 s counted from the first request split
    # them; counted from the latest, every expected request makes the one batch (the trainer's one generate a step).
    policy = HFPolicy(tiny_model_dir, batch_wait_s=0.3, max_batch_size=64)
    policy.expected_requests = lambda: 4
    params = SamplingParams(temperature=0, max_tokens=2)

    async def ask(i: int):
        await asyncio.sleep(0.15 * i)
        return await policy.generate([{"role": "user", "content": f"q{i}"}], params)

    await asyncio.gather(*(ask(i) for i in range(4)))
    assert policy.batch_sizes == [4]
    await policy.aclose()


async def test_a_batch_goes_out_when_the_expected_count_falls_to_what_it_holds(tiny_model_dir):
    # Three episodes in flight, two have asked, the third ends without asking: requests_changed() sends the batch
    # of two at once instead of after batch_wait_s (30 s here).
    policy = HFPolicy(tiny_model_dir, batch_wait_s=30, max_batch_size=64)
    active = 3
    policy.expected_requests = lambda: active
    params = SamplingParams(temperature=0, max_tokens=2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    asks = [asyncio.ensure_future(policy.generate([{"role": "user", "content": f"q{i}"}], params)) for i in range(2)]
    await asyncio.sleep(0.2)
    assert not any(ask.done() for ask in asks)  # still waiting for the third episode
    active = 2
    policy.requests_changed()
    await asyncio.gather(*asks)
    assert loop.time() - start < 20
    assert policy.batch_sizes == [2]
    await policy.aclose()


async def test_generate_on_loop_runs_the_batch_on_the_loops_thread_with_the_same_outputs(tiny_model_dir):
    import threading

    params = SamplingParams(temperature=0, max_tokens=4)
    chats = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    outputs, threads = {}, {}
    for on_loop in (False, True):
        policy = HFPolicy(tiny_model_dir, generate_on_loop=on_loop)
        generate = policy._generate_batch

        def recorded(prompts, sampling, on_loop=on_loop, generate=generate):
            threads[on_loop] = threading.get_ident()
            return generate(prompts, sampling)

        policy._generate_batch = recorded
        outputs[on_loop] = await asyncio.gather(*(policy.generate(chat, params) for chat in chats))
        await policy.aclose()
    assert threads[True] == threading.get_ident() != threads[False]
    assert [o.completion_ids for o in outputs[True]] == [o.completion_ids for o in outputs[False]]
    with pytest.raises(ValueError, match=r"HFPolicy\(generate_on_loop=...\) must be True or False, got 'yes'"):
        HFPolicy(tiny_model_dir, generate_on_loop="yes")


async def test_on_token_streams_each_rows_ids_and_changes_no_output(tiny_model_dir):
    import threading

    for on_loop in (False, True):
        policy = HFPolicy(tiny_model_dir, generate_on_loop=on_loop)
        chats = [[{"role": "user", "content": text}] for text in ("move left", "go up now")]
        params = SamplingParams(temperature=1.0, max_tokens=10, seed=7)
        pieces: list[list[int]] = [[], []]
        threads = set()

        def collect(row, pieces=pieces, threads=threads):
            return lambda ids: (pieces[row].extend(ids), threads.add(threading.get_ident()))

        streamed = await asyncio.gather(
            *(policy.generate(c, params, on_token=collect(i)) for i, c in enumerate(chats))
        )
        plain = await asyncio.gather(*(policy.generate(c, params) for c in chats))
        assert policy.streams_tokens and policy.batch_sizes == [2, 2]  # streamed rows batch like any others
        assert pieces == [out.completion_ids for out in streamed]  # up to each row's end, nothing after
        assert [o.completion_ids for o in streamed] == [o.completion_ids for o in plain]
        assert threads == {threading.get_ident()}  # on the caller's loop, whichever thread generated


async def test_a_batching_backend_whose_batches_take_no_callbacks_ignores_on_token(tiny_model_dir):
    from rllm_gym.policies.base import build_model_output
    from rllm_gym.policies.hf import BatchingPolicy

    class Whole(BatchingPolicy):  # as the trainer's colocated vLLM: whole replies only
        def _generate_batch(self, prompts, params):
            return [build_model_output("ok", prompt_ids=p, completion_ids=[1, 2]) for p in prompts]

    policy = Whole(HFPolicy(tiny_model_dir).tokenizer, {}, max_batch_size=4, batch_wait_s=0.001)
    seen = []
    out = await policy.generate(prompt_ids=[3, 4], on_token=seen.append)
    assert not policy.streams_tokens and out.completion_ids == [1, 2] and seen == []


async def test_unseeded_sampling_draws_fresh_noise_and_a_seeded_call_leaves_the_global_generator_alone(policy):
    import torch

    params = SamplingParams(temperature=1.0, max_tokens=12)
    torch.manual_seed(0)
    first = await asyncio.gather(*(policy.generate(chat, params) for chat in CHATS))
    second = await asyncio.gather(*(policy.generate(chat, params) for chat in CHATS))
    # The same batch sampled twice: fresh draws, not the first batch's again (the generator advanced).
    assert [o.completion_ids for o in first] != [o.completion_ids for o in second]
    torch.manual_seed(0)
    again = await asyncio.gather(*(policy.generate(chat, params) for chat in CHATS))
    assert [o.completion_ids for o in again] == [o.completion_ids for o in first]  # reproducible from the seed
    state = torch.random.get_rng_state()
    seeded = await policy.generate(CHATS[0], SamplingParams(temperature=1.0, max_tokens=12, seed=5))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert (await policy.generate(CHATS[0], SamplingParams(temperature=1.0, max_tokens=12, seed=5))) == seeded
