"""The OpenAI API's JSON as OpenAIPolicy speaks it: token ids and logprobs read out of chat and /completions choices,
and the extension fields a request carries only when asked."""

from __future__ import annotations

from rllm_gym.policies.base import SamplingParams
from rllm_gym.policies.openai_wire import EXTENSION_FIELDS, chat_request_body, logprob_entries


def test_logprobs_and_token_ids_come_from_chat_and_completions_choices():
    chat = {"logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:2", "logprob": 0}]}}
    assert logprob_entries(chat) == ([-0.5, 0.0], [7, 2])
    # Tokens spelled as text (no return_tokens_as_token_ids): the logprobs without ids, which are not guessed.
    assert logprob_entries({"logprobs": {"content": [{"token": "left", "logprob": -1.0}]}}) == ([-1.0], None)
    completions = {"logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.25, None]}}
    assert logprob_entries(completions) == ([-0.25, 0.0], None)  # /completions ids come in `token_ids` instead
    assert logprob_entries({}) == logprob_entries({"logprobs": None}) == ([], None)


def test_extension_fields_go_out_only_when_asked():
    params = SamplingParams(max_tokens=4)
    plain = chat_request_body("m", [], params)
    assert not set(EXTENSION_FIELDS) & set(plain) and "logprobs" not in plain
    asked = chat_request_body("m", [], params, return_token_ids=True)
    assert all(asked[field] is True for field in EXTENSION_FIELDS) and asked["logprobs"] is True
