"""Stand-ins for TRL's vLLM server path, and the worker that tests/train/test_vllm_server.py launches on 2 processes.

:class:`FakeClient` takes ``VLLMClient.generate``'s arguments (bound to its signature) and returns its shape; its
completion for a prompt is ``[prompt_code(prompt), EOS]``, so a caller can check that it got the completion of ITS
prompt. Run as a script (under ``accelerate launch``) it plays scenarios in which the processes make different numbers
of requests and turns through ``ServerVLLMPolicy.run`` and writes ``<out>/rank<i>.json`` for the test to check.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

EOS = 2


def prompt_code(prompt: list[int]) -> int:
    """A token standing for the whole prompt (order-sensitive), so a completion names the prompt it answers."""
    return 100 + sum((i + 1) * token for i, token in enumerate(prompt)) % 9973


class FakeClient:
    """``VLLMClient.generate`` without a server: records its calls; ``fail_on`` call numbers raise ConnectionError.

    Logprobs come as vLLM's top-2, sorted by probability, with the sampled token SECOND, as happens when vLLM samples
    a token that is not the most likely one.
    """

    def __init__(self, fail_on: tuple[int, ...] = (), delay_s: float = 0.0):
        self.calls: list[dict[str, Any]] = []
        self.fail_on = fail_on
        self.delay_s = delay_s
        self.threads: set[int] = set()

    def generate(self, prompts: list[str] | list[list[int]], *args: Any, **kwargs: Any) -> dict[str, list[list[int]]]:
        # Bound against TRL's own signature (not a copy of it): a caller's unknown or misspelled argument fails here
        # as it would on the real client, and every recorded call holds all its arguments, defaults included.
        from trl.generation.vllm_client import VLLMClient

        bound = inspect.signature(VLLMClient.generate).bind(self, prompts, *args, **kwargs)
        bound.apply_defaults()
        call = {name: value for name, value in bound.arguments.items() if name != "self"}
        n = call["n"]
        self.calls.append(call)
        self.threads.add(threading.get_ident())
        if self.delay_s:
            time.sleep(self.delay_s)
        if len(self.calls) in self.fail_on:
            raise ConnectionError("vLLM server at http://127.0.0.1:8000 refused the connection")
        completions = [[prompt_code(list(p)), EOS] for p in prompts for _ in range(n)]
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": completions,
            "logprobs": [[[-0.5, -1.0 - k] for k in range(len(c))] for c in completions],
            "logprob_token_ids": [[[7, token] for token in c] for c in completions],
        }


class FakeTokenizer:
    """Token ids as text: enough for decoding completions and rendering a chat as ``len(content)`` per message."""

    eos_token_id = EOS

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i == EOS))

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> list[int]:
        return [len(m["content"]) for m in messages]


def fake_generation(client: Any, mode: str = "server", **overrides: Any) -> SimpleNamespace:
    """The attributes of TRL's ``VLLMGeneration`` that its server branch reads."""
    settings = dict(
        mode=mode,
        vllm_client=client,
        repetition_penalty=1.1,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=None,
        max_completion_length=12,
        logprobs=1,
        structured_outputs_regex=None,
        generation_kwargs={"seed": 3},
    )
    settings.update(overrides)
    return SimpleNamespace(**settings)


async def episode(policy: Any, rank: int, index: int, turns: int, rng: random.Random) -> dict:
    """A multi-turn stand-in episode: each turn's prompt is the previous one plus the reply and an observation."""
    prompt = [10 + rank, 20 + index]
    checked = 0
    for turn in range(turns):
        output = await policy.generate(prompt_ids=prompt)
        assert output.prompt_ids == prompt, (output.prompt_ids, prompt)
        assert output.completion_ids == [prompt_code(prompt), EOS], (output.completion_ids, prompt)
        assert output.finish_reason == "stop" and output.logprobs == [-1.0, -2.0]
        checked += 1
        prompt = prompt + output.completion_ids + [30 + turn]
        await asyncio.sleep(rng.uniform(0.0, 0.03))  # the env steps
    return {"index": index, "turns": checked}


async def play(policy: Any, plan: list[int], rank: int, fail: bool = False) -> list[Any]:
    """The episodes of one process; a failed episode becomes its error's text (as the engine records it)."""
    rng = random.Random(rank)
    runs = [episode(policy, rank, i, turns, rng) for i, turns in enumerate(plan)]
    results = await asyncio.gather(*runs, return_exceptions=True)
    if fail:  # the rollout itself fails (after its episodes, while the other process still runs its own)
        raise ValueError(f"rollout on rank {rank} failed")
    return [r if isinstance(r, dict) else f"{type(r).__name__}: {r}" for r in results]


def main() -> None:
    from accelerate import Accelerator

    from rllm_gym.policies.base import PolicyError
    from rllm_gym.train.vllm_server import ServerVLLMPolicy

    out = Path(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    # Per scenario: each rank's episodes (turns per episode), the server calls that fail, whether rank 1's rollout
    # raises.
    scenarios: dict[str, dict[str, Any]] = {
        "uneven": {"plans": [[5, 5, 5], [2]]},
        "rank1_idle": {"plans": [[3, 2], []]},
        "rank0_idle": {"plans": [[], [4]]},
        "server_error": {"plans": [[3, 3], [3]], "fail_on": (2,)},
        "rank1_raises": {"plans": [[5], [1]], "fail": True},
    }
    report: dict[str, Any] = {"rank": rank, "num_processes": accelerator.num_processes}
    for name, scenario in scenarios.items():
        client = FakeClient(fail_on=scenario.get("fail_on", ()))
        generation = fake_generation(client if accelerator.is_main_process else None)
        policy = ServerVLLMPolicy(generation, accelerator, FakeTokenizer(), [EOS])
        plan = scenario["plans"][rank]
        fail = scenario.get("fail", False) and rank == 1
        result: dict[str, Any] = {}
        started = time.monotonic()
        try:
            result["episodes"] = asyncio.run(policy.run(play(policy, plan, rank, fail)))
        except (PolicyError, ValueError) as error:
            result["error"] = f"{type(error).__name__}: {error}"
        result["seconds"] = time.monotonic() - started
        result["metrics"] = policy.metrics()
        result["batch_sizes"] = policy.batch_sizes
        result["round_sizes"] = policy.round_sizes
        result["server_calls"] = [len(call["prompts"]) for call in client.calls] if accelerator.is_main_process else []
        report[name] = result
    (out / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
