"""Token in, token out: each LLM call of an episode is conditioned on exactly the tokens of the previous call's prompt
and sampled completion, with stand-in templates of the common families and random replies (hypothesis)."""

from __future__ import annotations

import asyncio
import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rllm_gym.policies.base import BasePolicy, PolicyRequest, build_model_output
from rllm_gym.policies.tokens import continuation_ids
from rllm_gym.types import ModelOutput, Step

# Stand-ins that behave like the common families' chat templates, on the embedded model's tokenizer.
QWEN25 = (  # ChatML with a default system prompt injected when the chat has none
    "{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3 = (  # earlier assistant turns lose their <think> block; enable_thinking=False prefills an empty one
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
LLAMA3 = (  # header tokens, <|eot_id|> ends a turn, contents trimmed, a date line in the default system message
    "{{- '<|begin_of_text|>' }}"
    "{%- if messages[0].role != 'system' %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# name -> (template, end-of-turn token, whether the template re-spells earlier assistant text)
FAMILIES = {
    "embedded": (None, "<|im_end|>", False),
    "qwen2.5": (QWEN25, "<|im_end|>", False),
    "qwen3": (QWEN3, "<|im_end|>", True),
    "llama3": (LLAMA3, "<|eot_id|>", True),
}


def family_tokenizer(tiny_model_dir, family: str):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    template, _, _ = FAMILIES[family]
    if family == "llama3":
        tokenizer.add_special_tokens({"additional_special_tokens": LLAMA_SPECIALS})
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="module")
def tokenizers(tiny_model_dir):
    return {family: family_tokenizer(tiny_model_dir, family) for family in FAMILIES}


class ReplayPolicy(BasePolicy):
    """A backend that samples nothing: it replies with the next given token ids (cut at ``max_tokens``, as a length
    limit cuts), through the same prompt bookkeeping as HFPolicy, VLLMPolicy and OpenAIPolicy."""

    def __init__(self, tokenizer, replies, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.replies = iter(replies)

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        prompt = self.prompt_token_ids(request)
        ids = list(next(self.replies))[: request.params.max_tokens]
        ends = ids and ids[-1] in self.tokenizer.all_special_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return build_model_output(
            text, prompt_ids=prompt, completion_ids=ids, finish_reason="stop" if ends else "length"
        )


def play(policy, observations, tool_turns=(), max_tokens=256, **template_kwargs):
    """An agent's chat by hand: observation, reply, observation ...; returns the Steps (as agents record them)."""
    from rllm_gym.agents.base import BaseAgent
    from rllm_gym.policies import SamplingParams

    agent = BaseAgent(system_prompt=None if template_kwargs.pop("no_system", False) else "Play well.")

    async def run():
        for turn, observation in enumerate(observations):
            if turn in tool_turns:  # tool results, as a tool agent with native tools adds them
                agent.messages += [{"role": "tool", "content": observation}, {"role": "tool", "content": "2"}]
            else:
                agent.update_from_env(observation, 0.0, False, {})
            params = SamplingParams(max_tokens=max_tokens)
            output = await policy.generate(agent.chat_completions, params, previous=agent.get_current_state())
            agent.update_from_model(output)
        return agent.trajectory.steps

    return asyncio.run(run())


def assert_token_in_token_out(steps):
    for before, after in itertools.pairwise(steps):
        context = before.prompt_ids + before.response_ids
        assert after.prompt_ids[: len(context)] == context, "the prompt does not continue the sampled tokens"


def assert_same_text_as_the_template(tokenizer, steps, eot):
    """For a template that does not re-spell earlier turns: each prompt decodes to the chat rendered by the template
    with the replies as sampled (the end-of-turn token once, whether the model sampled it or the length cut it)."""
    for turn, step in enumerate(steps[1:], 1):
        chat = [dict(m) for m in step.chat_completions[:-1]]
        replies = iter(steps[:turn])  # the chat's assistant messages are the earlier steps' replies, in order
        for message in chat:
            if message["role"] == "assistant":
                ids = next(replies).response_ids
                ids = ids[:-1] if ids and tokenizer.convert_ids_to_tokens(ids[-1]) == eot else ids
                message["content"] = tokenizer.decode(ids, skip_special_tokens=False)
        expected = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert tokenizer.decode(step.prompt_ids, skip_special_tokens=False) == expected


def text_ids(tokenizer) -> list[int]:
    special = set(tokenizer.all_special_ids)
    return [i for i in range(min(len(tokenizer), 1024)) if i not in special]


@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_prompt_continues_the_sampled_tokens_for_random_replies(tokenizers, family, data):
    tokenizer = tokenizers[family]
    _, eot, rewrites = FAMILIES[family]
    eot_id = tokenizer.convert_tokens_to_ids(eot)
    pieces = st.lists(st.sampled_from(text_ids(tokenizer)), min_size=0, max_size=12)
    # A reply ends with the end-of-turn token (sampled), or without it (cut by the length limit or a stop string).
    replies = data.draw(st.lists(st.tuples(pieces, st.booleans()), min_size=2, max_size=5), label="replies")
    observations = data.draw(st.lists(st.text("abc xyz\n?:", max_size=12), min_size=len(replies)), label="obs")
    tool_turns = set(data.draw(st.lists(st.integers(1, len(replies) - 1), max_size=2), label="tool turns"))
    ids = [[*piece, eot_id] if ends else piece for piece, ends in replies]
    policy = ReplayPolicy(tokenizer, ids)
    steps = play(policy, observations[: len(ids)], tool_turns=tool_turns, no_system=data.draw(st.booleans()))
    assert [s.response_ids for s in steps] == [i for i in ids]
    assert_token_in_token_out(steps)
    if not rewrites:
        assert_same_text_as_the_template(tokenizer, steps, eot)


def test_a_reply_whose_text_re_tokenizes_differently_is_kept_as_sampled(tokenizers):
    tokenizer = tokenizers["embedded"]
    # Two tokens whose text the tokenizer spells as one other token (BPE's "le" "ft" -> "left").
    by_text = {tokenizer.decode([i]): i for i in text_ids(tokenizer)}
    pair = next(
        [a, b]
        for a, b in itertools.product(text_ids(tokenizer)[200:400], repeat=2)
        if tokenizer.decode([a, b]) in by_text and len(tokenizer.decode([a])) > 1
    )
    assert tokenizer.encode(tokenizer.decode(pair), add_special_tokens=False) != pair
    steps = play(ReplayPolicy(tokenizer, [pair, [7]]), ["go", "again"])
    assert_token_in_token_out(steps)
    # Re-rendering the chat would have re-spelled it: what token_history="template" gives.
    rendered = play(ReplayPolicy(tokenizer, [pair, [7]], token_history="template"), ["go", "again"])
    start = len(rendered[0].prompt_ids)
    assert rendered[1].prompt_ids[start : start + 2] != pair


def test_a_cut_reply_gets_the_end_of_turn_token_once(tokenizers):
    tokenizer = tokenizers["embedded"]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cut = play(ReplayPolicy(tokenizer, [[300, 301, 302], [5]]), ["a", "b"], max_tokens=2)
    sampled = play(ReplayPolicy(tokenizer, [[300, im_end], [5]]), ["a", "b"])
    for steps, reply in ((cut, [300, 301]), (sampled, [300, im_end])):
        assert steps[0].response_ids == reply
        added = steps[1].prompt_ids[len(steps[0].prompt_ids) + len(reply) :]
        assert tokenizer.decode(added).startswith("<|im_end|>" if reply[-1] != im_end else "\n<|im_start|>user")
        assert (reply + added).count(im_end) == 2  # the reply's end, and the new user message's


def test_qwen3_style_history_keeps_the_thinking_the_model_saw_unless_asked_for_the_template(tokenizers):
    tokenizer = tokenizers["qwen3"]
    thought = tokenizer.encode("<think>hmm</think>left", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for history, kept in (("sampled", True), ("template", False)):
        replies = [[*thought, im_end], [5, im_end]]
        steps = play(ReplayPolicy(tokenizer, replies, token_history=history), ["a", "b"])
        assert ("<think>hmm</think>" in tokenizer.decode(steps[1].prompt_ids)) is kept
        prefix_holds = steps[1].prompt_ids[: len(steps[0].prompt_ids) + len(thought) + 1] == [
            *steps[0].prompt_ids,
            *thought,
            im_end,
        ]
        assert prefix_holds is kept
    # enable_thinking=False: the generation prompt's empty think block is part of every continued prompt.
    policy = ReplayPolicy(tokenizer, [[5, im_end], [6, im_end]], chat_template_kwargs={"enable_thinking": False})
    steps = play(policy, ["a", "b"])
    assert_token_in_token_out(steps)
    assert tokenizer.decode(steps[1].prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_chat_that_dropped_messages_is_rendered_whole(tokenizers):
    # max_history_turns drops earlier turns by design: that call's prompt cannot continue the previous one.
    from rllm_gym.agents.base import BaseAgent
    from rllm_gym.policies import SamplingParams

    tokenizer = tokenizers["embedded"]
    agent = BaseAgent(system_prompt="s", max_history_turns=1)
    policy = ReplayPolicy(tokenizer, [[300], [301]])

    async def run():
        for observation in ("a", "b"):
            agent.update_from_env(observation, 0.0, False, {})
            previous = agent.get_current_state()
            agent.update_from_model(await policy.generate(agent.chat_completions, SamplingParams(), previous=previous))

    asyncio.run(run())
    first, second = agent.trajectory.steps
    expected = tokenizer.apply_chat_template(
        second.chat_completions[:-1], add_generation_prompt=True, return_dict=False
    )
    assert second.prompt_ids == expected and second.prompt_ids[: len(first.prompt_ids) + 1] != [
        *first.prompt_ids,
        300,
    ]


def test_continuation_needs_the_previous_chat_and_ids(tokenizers):
    tokenizer = tokenizers["embedded"]
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    step = Step(prompt_ids=[1, 2], response_ids=[3], chat_completions=chat)
    later = [*chat, {"role": "user", "content": "c"}]
    assert continuation_ids(tokenizer, step, later, None, {})[:3] == [1, 2, 3]
    assert continuation_ids(tokenizer, step, [{"role": "user", "content": "other"}, *later[1:]], None, {}) is None
    assert continuation_ids(tokenizer, step.model_copy(update={"prompt_ids": []}), later, None, {}) is None
    # A chat that holds the marker text itself cannot be cut at it: rendered whole rather than guessed.
    from rllm_gym.policies.tokens import _MARK

    assert continuation_ids(tokenizer, step, [*chat, {"role": "user", "content": _MARK}], None, {}) is None
    # A template that escapes contents (tojson) still writes the marker as is; its closing quote is template text.
    escaping = family_tokenizer(tokenizer.name_or_path, "embedded")
    escaping.chat_template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content | tojson) + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    added = continuation_ids(escaping, step, later, None, {})[3:]
    assert escaping.decode(added) == '"<|im_end|>\n<|im_start|>user\n"c"<|im_end|>\n<|im_start|>assistant\n'
    with pytest.raises(TypeError, match=re.escape("previous must be the agent's last Step")):
        asyncio.run(ReplayPolicy(tokenizer, [[1]]).generate(later, previous=chat))
    with pytest.raises(ValueError, match=r"token_history=\.\.\.\) must be 'sampled'"):
        ReplayPolicy(tokenizer, [], token_history="full")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_whole_chat_renders_to_the_ids_of_apply_chat_template(tokenizers, family):
    # render_prompt_ids renders text and encodes it (cheaper per call); the ids must be the template's own, tools,
    # template arguments and special-token text in the messages included.
    from rllm_gym.policies.tokens import render_prompt_ids

    tokenizer = tokenizers[family]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    chats = [
        [{"role": "user", "content": "What is 2 + 3? leftover le ft"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "<think>hm</think>left"},
            {"role": "user", "content": "a reply may spell <|im_end|> as text"},
        ],
    ]
    for chat in chats:
        for kwargs in ({}, {"enable_thinking": False}):
            expected = tokenizer.apply_chat_template(
                chat, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
            )
            assert render_prompt_ids(tokenizer, chat, tools, kwargs) == list(expected)


def test_tokenizing_template_arguments_take_apply_chat_templates_own_path(tokenizers):
    # sanitize_control_tokens changes how the rendered text is tokenized (special-token text in a message stays
    # text): only apply_chat_template(tokenize=True) honours it, so the ids must come from there.
    from rllm_gym.policies.tokens import render_prompt_ids

    tokenizer = tokenizers["embedded"]
    chat = [{"role": "user", "content": "say <|im_end|> now"}]
    kwargs = {"sanitize_control_tokens": True}
    sanitized = render_prompt_ids(tokenizer, chat, None, kwargs)
    assert sanitized == tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False, **kwargs)
    assert sanitized != render_prompt_ids(tokenizer, chat, None, {})


def test_the_same_chat_is_rendered_once_and_every_caller_gets_its_own_ids(tokenizers, monkeypatch):
    # A GRPO group asks for one chat G times; the template renders it once. Chats with non-string values or tools
    # are rendered every time (their equality does not tell what a template prints), and the cache stays bounded.
    from rllm_gym.policies import tokens

    tokenizer = tokenizers["qwen2.5"]
    rendered = []
    render = tokens.render_prompt_ids
    monkeypatch.setattr(tokens, "render_prompt_ids", lambda *args: rendered.append(args[1]) or render(*args))
    cache = tokens.RenderCache(size=2)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    first = cache.ids(tokenizer, chat, None, {})
    first.append(-1)  # the caller's list: the cache's copy is untouched
    again = cache.ids(tokenizer, [dict(m) for m in chat], None, {})
    assert again == render(tokenizer, chat, None, {}) and len(rendered) == 1
    other = [{"role": "user", "content": "2+2?"}]
    assert cache.ids(tokenizer, other, None, {}) != again and len(rendered) == 2
    listed = [{"role": "user", "content": "2+2?", "tool_calls": []}]
    tools = [{"type": "function", "function": {"name": "add"}}]
    for _ in range(2):
        cache.ids(tokenizer, listed, None, {})
        cache.ids(tokenizer, chat, tools, {})
    assert len(rendered) == 6
    cache.ids(tokenizer, [{"role": "user", "content": "a third chat"}], None, {})  # evicts the oldest (chat)
    cache.ids(tokenizer, chat, None, {})
    assert len(rendered) == 8


async def test_a_policy_renders_a_groups_first_prompt_once(tiny_model_dir, monkeypatch):
    from rllm_gym.policies import HFPolicy, SamplingParams, tokens

    policy = HFPolicy(tiny_model_dir, max_batch_size=8)
    rendered = []
    render = tokens.render_prompt_ids
    monkeypatch.setattr(tokens, "render_prompt_ids", lambda *args: rendered.append(1) or render(*args))
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    outputs = await asyncio.gather(*(policy.generate(chat, SamplingParams(max_tokens=2)) for _ in range(8)))
    assert len(rendered) == 1
    assert all(o.prompt_ids == render(policy.tokenizer, chat, None, {}) for o in outputs)
    await policy.aclose()


def test_encode_text_gives_the_ids_of_transformers_encode_and_its_settings_win(tokenizers):
    from rllm_gym.policies.tokens import encode_text

    tokenizer = AutoTokenizer.from_pretrained(tokenizers["embedded"].name_or_path)  # its own: settings change below
    texts = ["", "left le ft", "<|im_end|>\n<|im_start|>user\nnaïve 東京 <think>x</think><|im_end|>", " " * 5 + "\n\t"]
    for text in texts:
        assert encode_text(tokenizer, text) == tokenizer.encode(text, add_special_tokens=False)
    # Settings transformers applies before encoding are honoured: special-token text split as text ...
    tokenizer.split_special_tokens = True
    assert encode_text(tokenizer, texts[2]) == tokenizer.encode(texts[2], add_special_tokens=False)
    assert len(encode_text(tokenizer, "<|im_end|>")) > 1
    tokenizer.split_special_tokens = False
    # ... and truncation left on the Rust tokenizer (by some other call) does not cut the prompt.
    tokenizer.backend_tokenizer.enable_truncation(max_length=2)
    assert encode_text(tokenizer, "one two three four") == tokenizer.encode(
        "one two three four", add_special_tokens=False
    )
    assert len(encode_text(tokenizer, "one two three four")) > 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_render_chat_text_is_apply_chat_templates_text_and_takes_the_fast_path_on_the_pinned_transformers(
    tokenizers, family
):
    from rllm_gym.policies import tokens, transformers_adapter

    # The installed transformers is one the adapter supports (tests/policies/test_transformers_adapter.py says more).
    assert transformers_adapter.available("render_jinja_template")
    tokenizer = tokenizers[family]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    chats = [
        [{"role": "user", "content": "What is 2 + 3?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "<think>hm</think>left"},
            {"role": "tool", "content": "4"},
            {"role": "user", "content": "say <|im_end|> as text"},
        ],
        [{"role": "user", "content": "hi", "weight": 1}],  # not strings only: the long way
    ]
    for chat in chats:
        for kwargs in ({}, {"enable_thinking": False}):
            for chat_tools in (None, tools):
                expected = tokenizer.apply_chat_template(
                    chat, tools=chat_tools, add_generation_prompt=True, tokenize=False, **kwargs
                )
                assert tokens.render_chat_text(tokenizer, chat, chat_tools, kwargs) == expected


# The short chat (tokens.py's module docstring): the text after a reply rendered from the system message, the message
# before the reply, the reply and what follows, for templates that pass the probes; the ids stay the whole chat's.
TURN_NUMBERED = (  # the text after a reply depends on how many messages came before it
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + ' #' + loop.index|string + '\\n' + m.content }}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant #' + (messages|length + 1)|string + '\\n' }}"
    "{%- endif %}"
)
SYSTEM_LAST = (  # Mistral-v3 style: the system message goes with the last user message, wherever that is
    "{%- set system = messages[0].content if messages[0].role == 'system' else '' %}"
    "{%- for m in messages if m.role != 'system' %}"
    "{%- if m.role == 'user' and loop.last and system %}{{- '[INST] ' + system + '\\n\\n' + m.content + '[/INST]' }}"
    "{%- elif m.role == 'user' %}{{- '[INST] ' + m.content + '[/INST]' }}"
    "{%- else %}{{- m.content + '<|im_end|>' }}{%- endif %}{%- endfor %}"
)
NO_TOOL_FIRST = (  # refuses a chat whose first turn (after the system message) is a tool result
    "{%- set first = messages[1] if messages[0].role == 'system' and messages|length > 1 else messages[0] %}"
    "{%- if first.role == 'tool' %}{{- raise_exception('a chat cannot open with a tool result') }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOL_OUTPUTS_ONCE = (  # DeepSeek-R1 style: only the chat's first tool result opens the outputs block
    "{%- set ns = namespace(first=true) %}{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{%- if ns.first %}{{- '<outputs>' }}{%- set ns.first = false %}{%- endif %}"
    "{{- '<out>' + m.content + '</out>' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
REASONING_AFTER_QUERY = (  # Qwen3 style: an assistant message after the last user query shows its reasoning
    "{%- set ns = namespace(last=messages|length - 1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last and m.reasoning_content %}"
    "{{- '<think>' + m.reasoning_content + '</think>' }}{%- endif %}"
    "{{- m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def assert_whole_chat_ids(tokenizer, steps):
    for before, step in itertools.pairwise(steps):
        assert step.prompt_ids == continuation_ids(tokenizer, before, step.chat_completions[:-1], None, {})


@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_short_chat_continues_with_the_ids_of_the_whole_chat(tokenizers, family, data):
    tokenizer = tokenizers[family]
    eot_id = tokenizer.convert_tokens_to_ids(FAMILIES[family][1])
    replies = data.draw(st.lists(st.lists(st.sampled_from(text_ids(tokenizer)), max_size=6), min_size=2, max_size=6))
    ids = [[*reply, eot_id] if index % 2 else reply for index, reply in enumerate(replies)]
    observations = data.draw(st.lists(st.text("ab \n?:", max_size=8), min_size=len(ids), max_size=len(ids)))
    tool_turns = set(data.draw(st.lists(st.integers(1, len(ids) - 1), max_size=2)))
    policy = ReplayPolicy(tokenizer, ids)
    steps = play(policy, observations, tool_turns=tool_turns, no_system=data.draw(st.booleans()))
    assert policy.rendered.renders_after_reply_locally(tokenizer, None, {})  # the short chat was used
    assert_token_in_token_out(steps)
    assert_whole_chat_ids(tokenizer, steps)


def test_a_continued_prompt_renders_a_few_messages_however_long_the_chat(tokenizers, monkeypatch):
    from rllm_gym.policies import tokens

    tokenizer = tokenizers["qwen2.5"]
    policy = ReplayPolicy(tokenizer, [[300 + turn] for turn in range(10)])
    assert policy.rendered.renders_after_reply_locally(tokenizer, None, {})  # its probes, before counting
    sizes = []
    render = tokens.render_chat_text
    monkeypatch.setattr(
        tokens,
        "render_chat_text",
        lambda tok, messages, *args: sizes.append(len(messages)) or render(tok, messages, *args),
    )
    steps = play(policy, [f"observation {turn}" for turn in range(10)])
    assert len(steps[-1].chat_completions) == 21  # system, then 10 observations and replies
    assert sizes == [2] + [4] * 9  # the first prompt whole; then system, observation, reply, new observation
    assert_whole_chat_ids(tokenizer, steps)


# (template, whether its probes pass): numbered turns fail them; the system message is part of the short chat; a
# template that refuses a short chat at a call (one that opens with a tool result) passes them, and that call falls
# back to the whole chat.
@pytest.mark.parametrize(
    ("template", "local"), [(TURN_NUMBERED, False), (SYSTEM_LAST, True), (NO_TOOL_FIRST, True)], ids=["n", "s", "t"]
)
def test_templates_that_need_more_than_the_short_chat_get_the_whole_chats_ids(tiny_model_dir, template, local):
    tokenizer = family_tokenizer(tiny_model_dir, "embedded")
    tokenizer.chat_template = template
    policy = ReplayPolicy(tokenizer, [[300], [301], [302], [303]])
    steps = play(policy, ["a", "b", "c", "d"], tool_turns={2})
    assert_token_in_token_out(steps)
    assert_whole_chat_ids(tokenizer, steps)
    assert policy.rendered.renders_after_reply_locally(tokenizer, None, {}) is local
    last = tokenizer.decode(steps[-1].prompt_ids[len(steps[-2].prompt_ids) + 1 :])
    if template is TURN_NUMBERED:
        sent = len(steps[-1].chat_completions) - 1  # the numbers of the whole chat, not of a short one
        assert last.endswith(f"user #{sent}\nd<|im_end|>\n<|im_start|>assistant #{sent + 1}\n") and sent == 9
    if template is SYSTEM_LAST:
        assert last == "<|im_end|>[INST] Play well.\n\nd[/INST]"


def test_the_probes_are_kept_per_template_and_tool_list(tokenizers, monkeypatch):
    from rllm_gym.policies import tokens

    tokenizer = family_tokenizer(tokenizers["embedded"].name_or_path, "embedded")
    tools = [{"type": "function", "function": {"name": "add"}}]
    probed = []
    probe = tokens._renders_after_reply_locally
    monkeypatch.setattr(tokens, "_renders_after_reply_locally", lambda *args: probed.append(1) or probe(*args))
    cache = tokens.RenderCache()
    for _ in range(3):
        assert cache.renders_after_reply_locally(tokenizer, None, {})
        assert cache.renders_after_reply_locally(tokenizer, tools, {})
    assert len(probed) == 2
    tokenizer.chat_template = {"default": TURN_NUMBERED, "tool_use": QWEN25}  # named templates: a dict
    assert cache.renders_after_reply_locally(tokenizer, None, {}) is False and len(probed) == 3


def test_a_template_whose_tool_results_depend_on_earlier_ones_fails_the_probes(tiny_model_dir):
    tokenizer = family_tokenizer(tiny_model_dir, "embedded")
    tokenizer.chat_template = TOOL_OUTPUTS_ONCE
    policy = ReplayPolicy(tokenizer, [[300], [301], [302], [303], [304]])
    steps = play(policy, ["a", "b", "c", "d", "e"], tool_turns={1, 3})
    assert not policy.rendered.renders_after_reply_locally(tokenizer, None, {})
    assert_token_in_token_out(steps)
    assert_whole_chat_ids(tokenizer, steps)  # turn 3's results written as the whole chat has them: no second opener
    assert tokenizer.decode(steps[-1].prompt_ids, skip_special_tokens=False).count("<outputs>") == 1


def test_an_assistant_message_after_the_reply_renders_the_whole_chat(tiny_model_dir):
    from rllm_gym.policies import tokens

    tokenizer = family_tokenizer(tiny_model_dir, "embedded")
    tokenizer.chat_template = REASONING_AFTER_QUERY
    cache = tokens.RenderCache()
    assert cache.renders_after_reply_locally(tokenizer, None, {})  # its probes hold no assistant after the reply
    steps = play(ReplayPolicy(tokenizer, [[300], [301]]), ["q", "r"], tool_turns={1})
    previous = steps[1]  # replied to tool results: its short chat holds no user query
    # The client's chat goes on with tool results and an assistant message of its own after the last user query:
    # the whole chat shows its reasoning, a short chat would not.
    chat = [
        *previous.chat_completions,
        {"role": "tool", "content": "1"},
        {"role": "assistant", "content": "B", "reasoning_content": "why"},
        {"role": "tool", "content": "2"},
    ]
    ids = continuation_ids(tokenizer, previous, chat, None, {}, cache)
    assert ids == continuation_ids(tokenizer, previous, chat, None, {})
    assert "<think>why</think>B" in tokenizer.decode(ids, skip_special_tokens=False)
