"""vLLM colocate in the trainer's rollout (train/vllm_colocate.py), on the CPU with stand-ins for the engine: a prompt
too long for vLLM ends its own episode, TRL's sleep mode syncs once per rollout, and generation runs on the process's
CUDA device after the weight sync."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, encode_prompt
from rllm_gym.types import TerminationReason

ENV = "rllm/FrozenLake-v0"
SMALL = {"id": "small", "map": ["SF", "FG"]}
BIG = {"id": "big", "map": ["SFFFFFFF", *["FFFFFFFF"] * 6, "FFFFFFFG"]}


def reply_ids(tokenizer) -> list[int]:
    return [*tokenizer.encode("up", add_special_tokens=False), tokenizer.eos_token_id]


class StandInGeneration:
    """TRL's VLLMGeneration in colocate mode, refusing what vLLM refuses: a batch with a prompt of max_model_len
    tokens or more fails as a whole (vLLM's input processor raises ValueError)."""

    mode, tensor_parallel_size, enable_sleep_mode = "colocate", 1, False

    def __init__(self, tokenizer, max_model_length=None):
        self.max_model_length, self.reply = max_model_length, reply_ids(tokenizer)
        self.prompts: list[list[int]] = []
        self.threads: list[threading.Thread] = []

    def generate(self, prompts, images, num_generations):
        self.threads.append(threading.current_thread())
        for prompt in prompts:
            if self.max_model_length is not None and len(prompt) >= self.max_model_length:
                raise ValueError(f"The decoder prompt (length {len(prompt)}) is longer than the maximum model length")
        self.prompts += prompts
        return prompts, [list(self.reply) for _ in prompts], None, None


def trainer_for(generation, tokenizer, device="cpu", max_completion_length=4):
    return SimpleNamespace(
        use_vllm=True,
        vllm_generation=generation,
        args=SimpleNamespace(
            vllm_mode="colocate",
            seed=0,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_completion_length=max_completion_length,
        ),
        accelerator=SimpleNamespace(num_processes=1, process_index=0, device=torch.device(device)),
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
    )


def first_prompt_length(episode) -> int:
    return len(episode.trajectories[0].steps[0].prompt_ids)


def test_a_prompt_too_long_for_vllm_ends_its_episode_and_not_the_batch(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [encode_prompt(ENV, task) for task in (SMALL, BIG, SMALL, BIG)]
    rollout = EpisodeRollout([EnvSetup(ENV)], max_turns=1)
    first = rollout.collect(prompts, rollout.generation_for(trainer_for(StandInGeneration(tokenizer), tokenizer)))
    small, big = (first_prompt_length(e) for e in first.episodes[:2])
    assert small < big
    # An engine whose context the big map's first prompt fills: vLLM would refuse it (and with it the batch).
    generation = StandInGeneration(tokenizer, max_model_length=big)
    batch = rollout.collect(prompts, rollout.generation_for(trainer_for(generation, tokenizer)))
    reasons = [episode.termination_reason for episode in batch.episodes]
    assert reasons[1] == reasons[3] == TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED
    assert reasons[0] == reasons[2] != TerminationReason.ERROR
    for episode in batch.episodes[::2]:  # the small maps' episodes played their turn with vLLM's reply
        assert episode.trajectories[0].steps[0].model_output.text == "up"
    assert all(not episode.trajectories[0].steps for episode in batch.episodes[1::2])
    assert generation.prompts and max(len(p) for p in generation.prompts) < big  # never sent to vLLM
    assert batch.metrics["vllm_colocate/prompts_too_long"] == 2
    assert len(batch.trl_output()["prompt_ids"]) == 4  # every prompt slot has its row (the ended ones a placeholder)
    rollout.close()


class SleepingEngine:
    """vLLM's LLM with sleep mode: sleep(level=2) discards the weights and the KV cache; generating while either is
    asleep fails (on a GPU it reads unmapped memory)."""

    def __init__(self, reply):
        self.reply, self.awake = reply, set()
        self.calls: list[str] = []

    def sleep(self, level):
        assert level == 2
        self.awake.clear()
        self.calls.append("sleep")

    def wake_up(self, tags):
        self.awake.update(tags)
        self.calls.append("wake " + ",".join(tags))

    def generate(self, prompts, sampling_params, use_tqdm):
        assert self.awake == {"weights", "kv_cache"}, f"generate while asleep: {self.awake}"
        self.calls.append("generate")
        sequence = SimpleNamespace(token_ids=list(self.reply), logprobs=None)
        return [SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[sequence]) for p in prompts]


def sleeping_generation(tokenizer, monkeypatch):
    """TRL 1.16's own VLLMGeneration.generate on a SleepingEngine, asleep as TRL leaves it after start-up; the weight
    sync wakes the weights and loads them (TRL's sync_weights, without the parameter walk)."""
    from trl.generation import vllm_generation

    monkeypatch.setattr(vllm_generation, "SamplingParams", lambda **kwargs: kwargs, raising=False)  # no vLLM here
    generation = object.__new__(vllm_generation.VLLMGeneration)
    engine = SleepingEngine(reply_ids(tokenizer))
    settings = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, logprobs=0)
    generation.__dict__.update(
        mode="colocate", tensor_parallel_size=1, enable_sleep_mode=True, _llm_weights_sleeping=True, llm=engine,
        accelerator=SimpleNamespace(device=torch.device("cpu")), max_completion_length=4, generation_kwargs={},
        structured_outputs_regex=None, max_model_length=None, model=torch.nn.Linear(1, 1), **settings,
    )  # fmt: skip
    engine.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096))

    def sync_weights():
        engine.wake_up(tags=["weights"])
        engine.calls.append("sync")
        generation._llm_weights_sleeping = False

    generation.sync_weights = sync_weights
    return generation, engine


def test_sleep_mode_syncs_the_weights_once_per_rollout_and_sleeps_after_it(tiny_model_dir, monkeypatch):
    # TRL's generate sleeps after every call and re-syncs the whole model at the next: once per turn, and under
    # ZeRO-3 in collectives that processes with different numbers of turns would not all join.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    generation, engine = sleeping_generation(tokenizer, monkeypatch)
    rollout = EpisodeRollout([EnvSetup(ENV)], max_turns=3)
    backend = rollout.generation_for(trainer_for(generation, tokenizer))
    for _ in range(2):
        engine.calls.clear()
        batch = rollout.collect([encode_prompt(ENV, seed) for seed in range(4)], backend)
        turns = max(len(e.trajectories[0].steps) for e in batch.episodes)
        assert turns == 3 and all(e.termination_reason != TerminationReason.ERROR for e in batch.episodes)
        assert engine.calls == ["wake weights", "sync", "wake kv_cache", *["generate"] * turns, "sleep"]
        assert generation.enable_sleep_mode and generation._llm_weights_sleeping  # asleep for the training step
    rollout.close()


def test_colocate_generation_runs_on_the_process_device_after_the_weight_sync(tiny_model_dir, monkeypatch):
    # The rollout generates in worker threads, where the current CUDA device is cuda:0 unless set (it is per thread);
    # the weight sync's copies were queued on the trainer thread's stream and must be done before generation starts.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    events: list[tuple[str, object]] = []
    current: dict[threading.Thread, torch.device] = {}

    def set_device(device):
        current[threading.current_thread()] = torch.device(device)

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("synchronize", device)))
    generation = StandInGeneration(tokenizer)
    original = generation.generate

    def generate(prompts, images, num_generations):
        events.append(("generate", current.get(threading.current_thread())))
        return original(prompts, images, num_generations)

    generation.generate = generate
    rollout = EpisodeRollout([EnvSetup(ENV)], max_turns=2)
    trainer = trainer_for(generation, tokenizer, device="cuda:1")
    rollout.collect([encode_prompt(ENV, seed) for seed in range(4)], rollout.generation_for(trainer))
    assert events[0] == ("synchronize", torch.device("cuda:1"))
    generates = events[1:]
    assert len(generates) >= 2 and all(event == ("generate", torch.device("cuda:1")) for event in generates)
    assert threading.main_thread() not in generation.threads  # why the device must be set: a thread of its own
    rollout.close()


@pytest.mark.parametrize("engine_length", [None, 512])
def test_the_prompt_limit_is_the_engines_context_less_one_token(engine_length, tiny_model_dir):
    from rllm_gym.train.vllm_colocate import TrainerVLLMPolicy

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    generation = StandInGeneration(tokenizer, max_model_length=1024)
    if engine_length is not None:  # the engine's own max_model_len wins over TRL's setting
        generation.llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(max_model_len=512)))
    policy = TrainerVLLMPolicy(trainer_for(generation, tokenizer))
    assert policy.max_prompt_tokens == (engine_length or 1024) - 1
