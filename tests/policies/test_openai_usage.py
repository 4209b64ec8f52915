"""Token counts of the OpenAI policy: from the server's ``usage`` when there are no token ids (no tokenizer), from the
ids when there are (the local tokenizer's or the server's), never invented when the server gives neither."""

from __future__ import annotations

import logging

import pytest

from rllm_gym.policies import HFPolicy, OpenAIPolicy, SamplingParams
from rllm_gym.policies.openai import usage_counts
from rllm_gym.policies.stub_server import StubOpenAIServer, count_tokens

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
GREEDY = SamplingParams(temperature=0, max_tokens=12)


async def test_without_a_tokenizer_the_counts_are_the_servers_usage():
    with StubOpenAIServer(reply="It is five, I think.") as server:
        async with OpenAIPolicy("stub", server.url) as policy:
            out = await policy.generate(CHAT, GREEDY)
    assert (out.prompt_ids, out.completion_ids) == ([], [])
    assert out.prompt_length == count_tokens(CHAT) == 2 + 5  # the stub counts words
    assert out.completion_length == 5


async def test_without_a_tokenizer_prompt_ids_on_completions_are_counted_from_the_ids():
    with StubOpenAIServer(reply="one two three") as server:
        async with OpenAIPolicy("stub", server.url) as policy:
            out = await policy.generate(prompt_ids=[5, 6, 7, 8], sampling_params=GREEDY)
    assert (out.prompt_length, out.completion_length) == (4, 3)


async def test_a_reply_without_usage_leaves_the_counts_at_zero():
    with StubOpenAIServer(usage=False) as server:
        async with OpenAIPolicy("stub", server.url) as policy:
            out = await policy.generate(CHAT, GREEDY)
    assert (out.prompt_length, out.completion_length) == (0, 0)


async def test_with_a_tokenizer_the_local_ids_win_and_a_disagreeing_server_is_named_once(tiny_model_dir, caplog):
    with StubOpenAIServer(reply="five") as server:
        async with OpenAIPolicy("stub", server.url, tokenizer=str(tiny_model_dir)) as policy:
            with caplog.at_level(logging.WARNING, logger="rllm_gym"):
                first = await policy.generate(CHAT, GREEDY)
                await policy.generate(CHAT, GREEDY)
    # The stub's word count (7) is not the tokenizer's: the ids, which the trainer uses, decide the count.
    assert first.prompt_length == len(first.prompt_ids) > count_tokens(CHAT)
    assert first.completion_length == len(first.completion_ids)
    warnings = [r.getMessage() for r in caplog.records if "prompt tokens where the local prompt ids" in r.getMessage()]
    assert warnings == [
        f"the server counted 7 prompt tokens where the local prompt ids have {len(first.prompt_ids)}: the server "
        "renders the chat differently (another chat template or tokenizer?); the local ids and their count are used"
    ]


@pytest.mark.parametrize(
    ("usage", "counts"),
    [
        ({"prompt_tokens": 7, "completion_tokens": 3}, (7, 3)),
        ({"prompt_tokens": 7}, (7, None)),
        ({"prompt_tokens": -1, "completion_tokens": "3"}, (None, None)),
        ({"prompt_tokens": True, "completion_tokens": 2.5}, (None, None)),
        ("not a dict", (None, None)),
        (None, (None, None)),
    ],
)
def test_usage_counts_keep_only_non_negative_integers(usage, counts):
    assert usage_counts({"usage": usage}) == counts


@pytest.mark.slow
async def test_transformers_serve_usage_gives_the_same_counts_as_local_generation(served_model, tiny_model_dir):
    """Against a real `transformers serve` process, with no tokenizer on our side: its `usage` counts the prompt as
    the model's own chat template does, and the reply as the tokens it generated."""
    local = await HFPolicy(tiny_model_dir).generate(CHAT, GREEDY)
    async with OpenAIPolicy(str(tiny_model_dir), served_model) as remote:
        out = await remote.generate(CHAT, GREEDY)
    assert (out.prompt_ids, out.completion_ids) == ([], [])
    assert out.prompt_length == len(local.prompt_ids) > 0
    assert out.finish_reason == "length" and out.completion_length == GREEDY.max_tokens == len(local.completion_ids)
