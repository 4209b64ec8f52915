"""ServerVLLMPolicy: multi-turn generation through TRL's vLLM server mode, training processes kept in lockstep rounds.

One-process tests use a stand-in client with ``VLLMClient.generate``'s signature (tests/train/lockstep_worker.py),
whose completion encodes its prompt. The launch test runs that worker on 2 real processes (gloo collectives) with
different numbers of episodes and turns per process, an idle process, a server failure and a failing rollout.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from trl.generation.vllm_client import VLLMClient

from rllm_gym.policies.base import PolicyError
from rllm_gym.train.vllm_server import ServerVLLMPolicy, indexed_cuda_device

REPO = Path(__file__).resolve().parents[2]
WORKER_PATH = Path(__file__).with_name("lockstep_worker.py")
_spec = importlib.util.spec_from_file_location("lockstep_worker", WORKER_PATH)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

EOS = worker.EOS
ONE_PROCESS = SimpleNamespace(num_processes=1, process_index=0, is_main_process=True)
CAUSE = "ConnectionError: vLLM server at http://127.0.0.1:8000 refused the connection"


def make_policy(client=None, **overrides) -> tuple[ServerVLLMPolicy, worker.FakeClient]:
    client = client or worker.FakeClient()
    policy = ServerVLLMPolicy(worker.fake_generation(client, **overrides), ONE_PROCESS, worker.FakeTokenizer(), [EOS])
    return policy, client


def expected_completion(prompt: list[int]) -> list[int]:
    return [worker.prompt_code(prompt), EOS]


def test_outputs_match_their_own_prompts():
    policy, client = make_policy()
    prompts = [[5, 1], [1, 5], [9, 9, 9], [3]]

    async def rollout():
        return await asyncio.gather(*(policy.generate(prompt_ids=p) for p in prompts))

    outputs = asyncio.run(policy.run(rollout()))
    for prompt, output in zip(prompts, outputs, strict=True):
        code = worker.prompt_code(prompt)
        assert output.prompt_ids == prompt
        assert output.completion_ids == expected_completion(prompt)
        assert output.text == output.content == str(code)  # EOS skipped in the text
        assert output.finish_reason == "stop"
        # The sampled token is the SECOND of vLLM's top-2 candidates: its own logprob, not the most likely one's.
        assert output.logprobs == [-1.0, -2.0]
    assert [len(call["prompts"]) for call in client.calls] == [4]


def test_concurrent_requests_share_one_round_and_metrics_count_rounds():
    policy, client = make_policy()

    async def episode(start: int, turns: int) -> list[int]:
        prompt = [start]
        for turn in range(turns):
            output = await policy.generate(prompt_ids=prompt)
            assert output.completion_ids == expected_completion(prompt)
            prompt = prompt + output.completion_ids + [40 + turn]
        return prompt

    async def rollout():
        return await asyncio.gather(episode(1, 3), episode(2, 3), episode(3, 1))

    asyncio.run(policy.run(rollout()))
    # Turn by turn: 3 requests, then the two longer episodes' 2 and 2; the last round (nothing left) skips the server.
    assert [len(call["prompts"]) for call in client.calls] == [3, 2, 2]
    assert [n for n in policy.round_sizes if n] == [3, 2, 2] and policy.round_sizes[-1] == 0
    rounds = len(policy.round_sizes)
    assert policy.metrics() == {
        "vllm_server/rounds": float(rounds),
        "vllm_server/empty_rounds": float(rounds - 3),
        "vllm_server/requests_per_round": 7 / 3,
        "vllm_server/local_requests": 7.0,
        "vllm_server/server_calls": 3.0,
        "vllm_server/server_errors": 0.0,
        "vllm_server/prompts_too_long": 0.0,
    }


def test_server_call_uses_trl_server_sampling_settings():
    policy, client = make_policy(min_p=None, structured_outputs_regex="[0-9]+")

    async def rollout():
        return await policy.generate(prompt_ids=[4, 2])

    asyncio.run(policy.run(rollout()))
    (call,) = client.calls
    assert call == {
        "prompts": [[4, 2]],
        "features": None,
        "n": 1,
        "repetition_penalty": 1.1,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.0,  # TRL's server branch sends 0.0 for an unset min_p
        "max_tokens": 12,
        "logprobs": 1,
        "structured_outputs_regex": "[0-9]+",
        "generation_kwargs": {"seed": 3},
    }

    # The stand-in binds its arguments to the installed TRL's signature: it records the real client's defaults and
    # refuses what the real client refuses, so the same call works on the real client.
    assert set(call) == set(inspect.signature(VLLMClient.generate).parameters) - {"self"}
    with pytest.raises(TypeError, match="max_token"):
        worker.FakeClient().generate([[1]], max_token=12)
    with pytest.raises(TypeError):
        worker.FakeClient().generate([[1]], None, 1, 1.0, 1.0, 1.0, 0, 0.0, 16, 0, None, None, "one too many")


def test_rounds_without_prompts_skip_the_server():
    policy, client = make_policy()

    async def rollout():
        await asyncio.sleep(0.3)  # an env step 6x max_wait_s: rounds go on with nothing to send
        return await policy.generate(prompt_ids=[8])

    output = asyncio.run(policy.run(rollout()))
    assert output.completion_ids == expected_completion([8])
    assert [len(call["prompts"]) for call in client.calls] == [1]
    assert policy.round_sizes[-2:] == [1, 0] and len(policy.round_sizes) >= 3
    assert policy.metrics()["vllm_server/empty_rounds"] == len(policy.round_sizes) - 1


class ShortClient(worker.FakeClient):
    """A server that hits the length limit and returns no logprobs (``logprobs=None``)."""

    def generate(self, prompts, *args, **kwargs):
        self.calls.append({"prompts": prompts})
        return {"prompt_ids": prompts, "completion_ids": [[7, 8, 9] for _ in prompts], "logprobs": None}


def test_length_finish_and_missing_logprobs():
    policy, _ = make_policy(ShortClient(), logprobs=None)

    async def rollout():
        return await policy.generate(prompt_ids=[1])

    output = asyncio.run(policy.run(rollout()))
    assert (output.completion_ids, output.finish_reason, output.logprobs) == ([7, 8, 9], "length", [0.0, 0.0, 0.0])


def test_server_error_fails_every_request_and_the_rest_of_the_rollout():
    policy, client = make_policy(worker.FakeClient(fail_on=(1,)))

    async def rollout():
        first = await asyncio.gather(*(policy.generate(prompt_ids=[i]) for i in range(3)), return_exceptions=True)
        with pytest.raises(PolicyError) as later:
            await policy.generate(prompt_ids=[9])
        return first, str(later.value)

    first, later = asyncio.run(policy.run(rollout()))
    assert [type(e) for e in first] == [PolicyError] * 3
    assert {str(e) for e in first} == {f"ServerVLLMPolicy generate failed: {CAUSE}"}
    assert later == (
        f"ServerVLLMPolicy generate failed: {CAUSE} (an earlier server call of this rollout failed; "
        "this request was not sent)"
    )
    assert len(client.calls) == 1
    assert policy.metrics()["vllm_server/server_errors"] == 1.0


def test_wrong_number_of_completions_is_a_server_error():
    class Truncating(worker.FakeClient):
        def generate(self, prompts, *args, **kwargs):
            return super().generate(prompts[:1], *args, **kwargs)

    policy, _ = make_policy(Truncating())

    async def rollout():
        return await asyncio.gather(*(policy.generate(prompt_ids=[i]) for i in range(2)), return_exceptions=True)

    errors = asyncio.run(policy.run(rollout()))
    assert {str(e) for e in errors} == {
        "ServerVLLMPolicy generate failed: ValueError: the server returned 1 completions for 2 prompts"
    }


def test_rollout_exception_is_reraised_after_the_rounds():
    policy, client = make_policy()

    async def rollout():
        await policy.generate(prompt_ids=[1])
        raise KeyError("env broke")

    with pytest.raises(KeyError, match=re.escape("env broke")):
        asyncio.run(policy.run(rollout()))
    assert len(client.calls) == 1 and policy.round_sizes[-1] == 0


def test_messages_are_rendered_with_the_chat_template():
    policy, client = make_policy()

    async def rollout():
        return await policy.generate([{"role": "user", "content": "hello"}, {"role": "user", "content": "hi"}])

    output = asyncio.run(policy.run(rollout()))
    assert client.calls[0]["prompts"] == [[5, 2]]
    assert output.prompt_ids == [5, 2]


def test_generate_outside_run_is_rejected():
    policy, _ = make_policy()
    with pytest.raises(RuntimeError, match=re.escape("must be awaited inside `await policy.run(coroutine)`")):
        asyncio.run(policy.generate(prompt_ids=[1]))


def test_wrong_mode_and_bad_waits_are_rejected():
    with pytest.raises(ValueError, match=re.escape("needs TRL's vLLM server mode")) as error:
        make_policy(mode="colocate")
    assert "got vllm_mode 'colocate'" in str(error.value) and "TrainerVLLMPolicy" in str(error.value)
    with pytest.raises(ValueError, match=re.escape("ServerVLLMPolicy(max_wait_s=...) must be seconds in [0, 60)")):
        ServerVLLMPolicy(worker.fake_generation(None), ONE_PROCESS, worker.FakeTokenizer(), [EOS], max_wait_s=-1)


def test_from_trainer_reads_the_trainer():
    client = worker.FakeClient()
    trainer = SimpleNamespace(
        vllm_generation=worker.fake_generation(client),
        accelerator=ONE_PROCESS,
        processing_class=worker.FakeTokenizer(),
        eos_token_ids=[EOS, 11],
        args=SimpleNamespace(vllm_max_model_length=2048),
    )
    policy = ServerVLLMPolicy.from_trainer(trainer, batch_wait_s=0.0)
    assert policy.eos_token_ids == {EOS, 11} and policy.batch_wait_s == 0.0
    assert policy.generation.vllm_client is client
    assert policy.max_prompt_tokens == 2047  # room for one token in the server's context


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_stay_in_lockstep(tmp_path):
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    command += [str(REPO / "train" / "accelerate" / "cpu_2.yaml"), "--main_process_port", str(free_port())]
    command += [str(WORKER_PATH), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["num_processes"] for r in ranks] == [2, 2]

    for name in ("uneven", "rank1_idle", "rank0_idle", "server_error", "rank1_raises"):
        zero, one = ranks[0][name], ranks[1][name]
        # Lockstep: both processes saw the same rounds, each the sum of both processes' requests, the last empty.
        assert zero["round_sizes"] == one["round_sizes"], name
        assert zero["round_sizes"] == [a + b for a, b in zip(zero["batch_sizes"], one["batch_sizes"], strict=True)]
        assert len(zero["round_sizes"]) > 0 and zero["round_sizes"][-1] == 0, name
        assert 0 not in zero["server_calls"], name  # no server call without prompts
        assert one["server_calls"] == [], name  # only the main process talks to the server
        assert zero["metrics"]["vllm_server/server_calls"] == one["metrics"]["vllm_server/server_calls"], name

    # Different numbers of episodes and turns: each episode checked every reply against its own prompt.
    uneven = ranks[0]["uneven"], ranks[1]["uneven"]
    assert uneven[0]["episodes"] == [{"index": i, "turns": 5} for i in range(3)]
    assert uneven[1]["episodes"] == [{"index": 0, "turns": 2}]
    assert sum(uneven[0]["server_calls"]) == 17
    assert max(uneven[0]["round_sizes"]) == 4  # rank 1's turns rode in the same server calls as rank 0's

    assert ranks[0]["rank1_idle"]["episodes"] == [{"index": 0, "turns": 3}, {"index": 1, "turns": 2}]
    assert ranks[1]["rank1_idle"]["episodes"] == []
    assert ranks[0]["rank0_idle"]["episodes"] == []
    assert ranks[1]["rank0_idle"]["episodes"] == [{"index": 0, "turns": 4}]
    assert ranks[0]["rank0_idle"]["server_calls"] == [1, 1, 1, 1]  # the idle main process served rank 1

    # The second server call fails: every episode of both processes fails with the cause, none is retried.
    for rank, count in ((0, 2), (1, 1)):
        episodes = ranks[rank]["server_error"]["episodes"]
        assert len(episodes) == count and all(CAUSE in e and e.startswith("PolicyError: ") for e in episodes)
    assert len(ranks[0]["server_error"]["server_calls"]) == 2
    assert ranks[1]["server_error"]["metrics"]["vllm_server/server_errors"] == 1.0

    # Rank 1's rollout raises after its one turn: it kept joining rounds until rank 0's 5 turns were done.
    assert ranks[1]["rank1_raises"]["error"] == "ValueError: rollout on rank 1 failed"
    assert ranks[0]["rank1_raises"]["episodes"] == [{"index": 0, "turns": 5}]
    assert len(ranks[1]["rank1_raises"]["round_sizes"]) >= 6


class ReplyClient(worker.FakeClient):
    """A server that answers every prompt with the same reply (real tokenizer ids) and records the prompts."""

    def __init__(self, reply_ids: list[int]):
        super().__init__()
        self.reply_ids = reply_ids

    def generate(self, prompts, *args, **kwargs):
        self.calls.append({"prompts": [list(p) for p in prompts]})
        completions = [list(self.reply_ids) for _ in prompts]
        return {"prompt_ids": prompts, "completion_ids": completions, "logprobs": [[[-0.5]] * 2 for _ in prompts]}


def test_engine_episodes_run_inside_the_driver(tiny_model_dir):
    from transformers import AutoTokenizer

    from rllm_gym.agents.frozenlake import FrozenLakeAgent
    from rllm_gym.engine import AgentExecutionEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    client = ReplyClient([*tokenizer.encode("up", add_special_tokens=False), tokenizer.eos_token_id])
    assert len(client.reply_ids) == 2
    generation = worker.fake_generation(client)
    policy = ServerVLLMPolicy(generation, ONE_PROCESS, tokenizer, [tokenizer.eos_token_id])
    engine = AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=FrozenLakeAgent, policy=policy, max_turns=2)

    episodes = asyncio.run(policy.run(engine.run(list(range(8)))))
    assert len(client.calls[0]["prompts"]) == 8  # every episode's first turn in one round
    assert all(e.termination_reason.value != "error" for e in episodes), episodes[0].metadata.get("error")
    steps = [step for e in episodes for step in e.trajectories[0].steps]
    assert sum(len(call["prompts"]) for call in client.calls) == len(steps) > 8  # some episodes took a 2nd turn
    step = steps[-1]
    assert step.model_output.text == "up" and step.model_output.finish_reason == "stop"
    assert step.logprobs == [-0.5, -0.5]
    assert step.prompt_ids == tokenizer.apply_chat_template(
        step.chat_completions[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
    )


class BoundedClient(ReplyClient):
    """A `trl vllm-serve` with --max_model_len ``context``: a prompt of that length or more fails the whole call."""

    def __init__(self, reply_ids: list[int], context: int):
        super().__init__(reply_ids)
        self.context = context

    def generate(self, prompts, *args, **kwargs):
        if any(len(p) >= self.context for p in prompts):
            raise RuntimeError("Request failed: 500, The decoder prompt is longer than the maximum model length")
        return super().generate(prompts, *args, **kwargs)


def test_a_prompt_too_long_for_the_server_ends_its_episode_and_not_the_round(tiny_model_dir):
    from transformers import AutoTokenizer

    from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    reply = [*tokenizer.encode("up", add_special_tokens=False), tokenizer.eos_token_id]
    small = {"id": "small", "map": ["SF", "FG"]}
    big = {"id": "big", "map": ["SFFFFFFF", *["FFFFFFFF"] * 6, "FFFFFFFG"]}
    prompts = [encode_prompt("rllm/FrozenLake-v0", task) for task in (small, big, small)]

    def trainer(client, context):
        return SimpleNamespace(
            use_vllm=True, vllm_generation=worker.fake_generation(client), accelerator=ONE_PROCESS,
            processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id],
            args=SimpleNamespace(
                vllm_mode="server", seed=0, temperature=1.0, top_p=1.0, top_k=0, max_completion_length=4,
                vllm_max_model_length=context,
            ),
        )  # fmt: skip

    rollout = EpisodeRollout([EnvSetup("rllm/FrozenLake-v0")], max_turns=1)
    first = rollout.collect(prompts, rollout.generation_for(trainer(ReplyClient(reply), None)))
    lengths = [len(e.trajectories[0].steps[0].prompt_ids) for e in first.episodes]
    assert lengths[0] < lengths[1]
    client = BoundedClient(reply, context=lengths[1])  # the big map's prompt fills the server's context
    # vllm_max_model_length set to the server's --max_model_len
    batch = rollout.collect(prompts, rollout.generation_for(trainer(client, lengths[1])))
    reasons = [e.termination_reason.value for e in batch.episodes]
    assert reasons[1] == "max_prompt_length_exceeded" and reasons[0] == reasons[2] != "error"
    assert [len(p) for call in client.calls for p in call["prompts"]] == [lengths[0], lengths[0]]
    assert batch.metrics["vllm_server/prompts_too_long"] == 1
    rollout.close()


def test_a_lone_gpu_named_cuda_gets_the_calling_threads_index_for_set_device():
    # accelerate names the one GPU of a run without `accelerate launch` "cuda"; torch.cuda.set_device refuses a device
    # without an index (the colocated vLLM policy failed every episode on an H200 with it).
    assert indexed_cuda_device("cuda", current=lambda: 3) == torch.device("cuda", 3)
    assert indexed_cuda_device(torch.device("cuda", 1), current=lambda: 3) == torch.device("cuda", 1)
    assert indexed_cuda_device("cpu", current=lambda: 3) == torch.device("cpu")
