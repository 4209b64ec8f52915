from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import re
import sys
import time
from types import ModuleType, SimpleNamespace

import pytest

from rllm_gym.policies import PolicyError, SamplingParams, VLLMPolicy
from rllm_gym.policies.vllm import model_output_from_vllm, vllm_sampling_kwargs
from rllm_gym.types import ToolCall


def test_sampling_kwargs_default_and_full():
    assert vllm_sampling_kwargs(SamplingParams(temperature=0, max_tokens=32)) == {
        "n": 1,
        "temperature": 0,
        "top_p": 1.0,
        "max_tokens": 32,
        "skip_special_tokens": True,
        "logprobs": 0,
    }
    full = vllm_sampling_kwargs(
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, stop=["\n\n"], seed=5), logprobs=False
    )
    assert full == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 256,
        "skip_special_tokens": True,
        "top_k": 20,
        "stop": ["\n\n"],
        "seed": 5,
    }


def _request_output(text, token_ids, logprobs, finish_reason="stop", prompt_token_ids=(1, 2, 3)):
    # Stand-ins with the attributes of vllm.RequestOutput / CompletionOutput / Logprob.
    entries = None
    if logprobs is not None:
        entries = [
            {tok: SimpleNamespace(logprob=lp), 999: SimpleNamespace(logprob=-9.0)}
            for tok, lp in zip(token_ids, logprobs, strict=True)
        ]
    completion = SimpleNamespace(text=text, token_ids=tuple(token_ids), logprobs=entries, finish_reason=finish_reason)
    return SimpleNamespace(request_id="r1", prompt_token_ids=list(prompt_token_ids), outputs=[completion])


def test_request_output_becomes_model_output():
    out = model_output_from_vllm(
        _request_output("<think>a</think>The answer", [10, 11, 12, 2], [-0.1, -0.2, -0.3, -0.4])
    )
    assert (out.reasoning, out.content) == ("a", "The answer")
    assert out.prompt_ids == [1, 2, 3] and out.completion_ids == [10, 11, 12, 2]
    assert out.logprobs == [-0.1, -0.2, -0.3, -0.4]  # the sampled token's entry, not the alternatives
    assert (out.prompt_length, out.completion_length, out.finish_reason) == (3, 4, "stop")


def test_tool_calls_length_and_missing_logprobs():
    call = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    out = model_output_from_vllm(_request_output(call, [5, 6], None))
    assert out.tool_calls == [ToolCall(name="f", arguments={"a": 1})]
    assert out.finish_reason == "tool_calls" and out.logprobs == []
    cut = model_output_from_vllm(_request_output("partial", [5, 6], [-1.0, -1.0], finish_reason="length"))
    assert cut.finish_reason == "length"


def test_request_without_completions_is_an_error():
    empty = SimpleNamespace(request_id="r9", prompt_token_ids=[1], outputs=[])
    with pytest.raises(PolicyError, match=re.escape("vLLM returned no completion for request 'r9'")):
        model_output_from_vllm(empty)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_policy_without_vllm_says_how_to_install_it():
    with pytest.raises(ImportError, match=re.escape("pip install 'rllm-gym[vllm]'")):
        VLLMPolicy("any-model")


async def _ask(policy: VLLMPolicy, first_ids: list[int]) -> list[str]:
    outputs = await asyncio.gather(*(policy.generate(prompt_ids=[i, 7]) for i in first_ids))
    return [output.content for output in outputs]


def test_one_policy_serves_many_event_loops_and_threads(standin_vllm, tiny_model_dir):
    policy = VLLMPolicy(str(tiny_model_dir))
    try:
        # Two loops in a row on this thread (the second used to hang on the first's engine) ...
        assert asyncio.run(_ask(policy, [1, 2])) == ["echo 1", "echo 2"]
        assert asyncio.run(_ask(policy, [3])) == ["echo 3"]
        # ... and eight threads with a loop each, all at once.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            batches = [list(range(k * 10, k * 10 + 5)) for k in range(8)]
            results = list(pool.map(lambda ids: asyncio.run(_ask(policy, ids)), batches))
        assert results == [[f"echo {i}" for i in ids] for ids in batches]
        assert policy.engine.loop is policy._loop and not policy.engine.cancelled
        # The closed loops are not kept: each new loop drops them (here: ten loops ran, one more asks).
        assert asyncio.run(_ask(policy, [4])) == ["echo 4"] and len(policy._to_callers) == 1
    finally:
        policy.shutdown()
    assert policy.engine.shut_down and not policy._thread.is_alive()
    policy.shutdown()  # twice is fine
    with pytest.raises(PolicyError, match="shut down"):
        asyncio.run(_ask(policy, [1]))


def test_on_token_gets_the_completion_in_pieces_on_the_callers_loop(standin_vllm, tiny_model_dir):
    policy = VLLMPolicy(str(tiny_model_dir))

    async def streamed() -> tuple:
        loop, pieces = asyncio.get_running_loop(), []

        def on_token(ids):
            assert asyncio.get_running_loop() is loop  # relayed from the engine's loop to the caller's
            pieces.append(ids)

        out = await policy.generate(prompt_ids=[7, 1], on_token=on_token)
        plain = await policy.generate(prompt_ids=[7, 1])
        return pieces, out, plain

    try:
        assert policy.streams_tokens
        pieces, out, plain = asyncio.run(streamed())
    finally:
        policy.shutdown()
    assert pieces == [[7], [2]] and [t for piece in pieces for t in piece] == out.completion_ids
    assert out == plain  # streamed or not, the same ModelOutput
    assert policy.engine.args.disable_log_stats is True  # vllm.LLM's default, not AsyncEngineArgs'


def test_cancelling_a_request_aborts_it_on_the_engine(standin_vllm, tiny_model_dir):
    policy = VLLMPolicy(str(tiny_model_dir))

    async def slow() -> None:
        params = SamplingParams(max_tokens=8)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await policy.generate(prompt_ids=[4, 7], sampling_params=params)

    try:
        policy._vllm.SamplingParams = lambda **kwargs: SimpleNamespace(delay=30, **kwargs)
        asyncio.run(slow())
        deadline = time.monotonic() + 5
        while not policy.engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(policy.engine.cancelled) == 1  # the engine saw the abort, it does not generate on for nobody
    finally:
        policy.shutdown()


def test_vllm_sampling_params_are_built_once_per_distinct_settings(standin_vllm, tiny_model_dir):
    policy = VLLMPolicy(str(tiny_model_dir))
    built, seen = [], []
    policy._vllm.SamplingParams = lambda **kwargs: built.append(kwargs) or SimpleNamespace(**kwargs)
    generate = policy.engine.generate

    def recording(prompt, params, request_id, lora_request=None):
        seen.append(params)
        return generate(prompt, params, request_id, lora_request)

    policy.engine.generate = recording

    async def ask() -> None:
        greedy, seeded = SamplingParams(temperature=0.0, max_tokens=4), SamplingParams(max_tokens=4, seed=3)
        await asyncio.gather(*(policy.generate(prompt_ids=[i, 7], sampling_params=greedy) for i in range(6)))
        await policy.generate(prompt_ids=[1, 7], sampling_params=seeded)
        await policy.generate(prompt_ids=[1, 7], sampling_params=greedy, on_token=lambda ids: None)

    try:
        asyncio.run(ask())
    finally:
        policy.shutdown()
    # Three distinct settings (greedy, seeded, greedy streamed): three objects, each what vllm_sampling_kwargs says.
    assert len(built) == 3 and len({id(params) for params in seen}) == 3 and len(seen) == 8
    assert seen[0] is seen[5] and seen[6].seed == 3 and seen[7].output_kind == "cumulative"
    assert built[0] == {
        **vllm_sampling_kwargs(SamplingParams(temperature=0.0, max_tokens=4)),
        "output_kind": "final_only",
    }


def test_prompt_ids_go_through_vllms_direct_token_input_where_it_has_one(monkeypatch):
    from rllm_gym.policies.vllm import token_input_builder

    inputs = ModuleType("vllm.inputs")
    inputs.tokens_input = lambda prompt_token_ids: {"type": "token", "prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)

    def standin(version):
        return SimpleNamespace(__version__=version, TokensPrompt=lambda prompt_token_ids: ("raw", prompt_token_ids))

    for version in ("0.22.0", "0.31.0+cpu", "0.40.0"):
        assert token_input_builder(standin(version))([5, 6]) == {"type": "token", "prompt_token_ids": [5, 6]}
    # Before 0.22 (and for a build that names no version) the engine renders a TokensPrompt itself.
    for version in ("0.21.0", "not a version", None):
        assert token_input_builder(standin(version))([5, 6]) == ("raw", [5, 6])
    monkeypatch.delattr(inputs, "tokens_input")  # a later vLLM that moved it: the TokensPrompt way again
    assert token_input_builder(standin("0.31.0"))([5, 6]) == ("raw", [5, 6])


def test_cpu_engine_defaults_fill_what_vllm_gets_wrong_on_a_cpu():
    from rllm_gym.policies.vllm import CPU_KV_CACHE_BYTES, cpu_engine_defaults

    assert cpu_engine_defaults({}, checkpoint_dtype="float32", environ={}) == {
        "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "dtype": "float32",
    }
    # A bfloat16 checkpoint keeps its dtype (what transformers loads); a config without one means float32.
    assert cpu_engine_defaults({}, checkpoint_dtype="bfloat16", environ={})["dtype"] == "bfloat16"
    assert cpu_engine_defaults({}, checkpoint_dtype=None, environ={})["dtype"] == "float32"
    # The caller's values win, and a memory setting of theirs (argument or vLLM's env var) replaces the KV default.
    given = {"dtype": "bfloat16", "enforce_eager": False, "enable_chunked_prefill": True}
    given["gpu_memory_utilization"] = 0.3
    assert cpu_engine_defaults(given, checkpoint_dtype="float32", environ={}) == given
    env = cpu_engine_defaults({}, checkpoint_dtype="float32", environ={"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert "kv_cache_memory_bytes" not in env


def test_policy_applies_cpu_defaults_only_on_a_cpu_platform(standin_vllm, tiny_model_dir, monkeypatch):
    platforms = ModuleType("vllm.platforms")
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    for is_cpu, expected in ((True, {"dtype": "float32", "enforce_eager": True}), (False, {})):
        platforms.current_platform = SimpleNamespace(is_cpu=lambda is_cpu=is_cpu: is_cpu)
        policy = VLLMPolicy(str(tiny_model_dir), max_model_len=512)
        try:
            args = vars(policy.engine.args)
            assert {key: args.get(key) for key in expected} == expected
            assert ("kv_cache_memory_bytes" in args) is is_cpu and args["max_model_len"] == 512
        finally:
            policy.shutdown()


def test_engine_shuts_down_once_and_at_exit(standin_vllm, tiny_model_dir):
    from rllm_gym.policies import vllm as vllm_module

    policy = VLLMPolicy(str(tiny_model_dir))
    calls = []
    stand_in = type(policy.engine).__mro__[1]  # the stand-in AsyncLLM under the policy's once-only subclass
    original = stand_in.shutdown
    try:
        stand_in.shutdown = lambda self: calls.append(self)
        assert policy in vllm_module._RUNNING
        vllm_module._shutdown_running_policies()  # what interpreter exit runs for a policy still running
        assert not policy._thread.is_alive() and policy not in vllm_module._RUNNING
        policy.engine.shutdown()  # vLLM's __del__ calling again: no second shutdown of the engine
        assert calls == [policy.engine]
    finally:
        stand_in.shutdown = original
        policy.shutdown()


def test_every_request_gets_an_id_of_its_own_across_policies(standin_vllm, tiny_model_dir):
    ids = []
    policies = [VLLMPolicy(str(tiny_model_dir)) for _ in range(2)]
    for policy in policies:
        generate = policy.engine.generate
        policy.engine.generate = lambda prompt, params, request_id, lora_request=None, generate=generate: (
            ids.append(request_id) or generate(prompt, params, request_id, lora_request)
        )

    async def ask(policy) -> None:
        await asyncio.gather(*(policy.generate(prompt_ids=[i, 7], sampling_params=SamplingParams()) for i in range(5)))

    try:
        for policy in policies:
            asyncio.run(ask(policy))
            asyncio.run(ask(policy))  # a later event loop continues the count
    finally:
        for policy in policies:
            policy.shutdown()
    assert len(ids) == 20 and len(set(ids)) == 20
    assert len({request_id.split("-")[0] for request_id in ids}) == 2  # one random prefix per policy
