"""Shared fixtures for the policy tests: the tiny model folder and a real `transformers serve` process on it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest


@pytest.fixture(scope="session")
def served_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, server_process):
    """`transformers serve` on the tiny model, on a free loopback port; yields its base URL."""
    hf_home = tmp_path_factory.mktemp("hf_home")
    # Offline, with its own HF cache dir (its /v1/models needs one), one torch thread so it shares the CPUs politely.
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def command(port: int) -> list[str]:
        serve = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(tiny_model_dir)]
        return [*serve, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]

    with server_process(command, hf_home / "serve.log", env=env, start_s=90, stop_s=10) as url:
        yield url


# VLLMPolicy's engine driving, with a stand-in for vLLM: its async engine, like the real AsyncLLM, belongs to the
# event loop it runs on and fails from any other.


class _StandInAsyncLLM:
    def __init__(self, args):
        self.args = args
        self.loop = None  # bound on first use, like AsyncLLM's output handler
        self.cancelled: list[str] = []
        self.shut_down = False
        self.prompts: list[list[int]] = []  # the prompt ids of every request, in order

    @classmethod
    def from_engine_args(cls, args):
        return cls(args)

    async def generate(self, prompt, params, request_id, lora_request=None):
        self.loop = self.loop or asyncio.get_running_loop()
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("the engine's output handler is attached to a different loop")
        ids = prompt.prompt_token_ids
        self.prompts.append(list(ids))
        try:
            await asyncio.sleep(params.delay if hasattr(params, "delay") else 0.01 * (ids[0] % 3))
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        if getattr(params, "output_kind", None) == "cumulative":  # streamed: the completion so far, then the rest
            partial = SimpleNamespace(text="echo", token_ids=(ids[0],), logprobs=None, finish_reason=None)
            yield SimpleNamespace(request_id=request_id, prompt_token_ids=ids, outputs=[partial])
        completion = SimpleNamespace(text=f"echo {ids[0]}", token_ids=(ids[0], 2), logprobs=None, finish_reason="stop")
        yield SimpleNamespace(request_id=request_id, prompt_token_ids=ids, outputs=[completion])

    def shutdown(self):
        self.shut_down = True


@pytest.fixture
def standin_vllm(monkeypatch):
    modules = {name: ModuleType(name) for name in ("vllm", "vllm.lora", "vllm.lora.request", "vllm.sampling_params")}
    modules |= {name: ModuleType(name) for name in ("vllm.v1", "vllm.v1.engine", "vllm.v1.engine.async_llm")}
    modules["vllm"].AsyncEngineArgs = lambda **kwargs: SimpleNamespace(**kwargs)
    modules["vllm"].SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    modules["vllm"].TokensPrompt = lambda prompt_token_ids: SimpleNamespace(prompt_token_ids=prompt_token_ids)
    modules["vllm.lora.request"].LoRARequest = lambda *args: args
    modules["vllm.sampling_params"].RequestOutputKind = SimpleNamespace(
        FINAL_ONLY="final_only", CUMULATIVE="cumulative"
    )
    modules["vllm.v1.engine.async_llm"].AsyncLLM = _StandInAsyncLLM
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
