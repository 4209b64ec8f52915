"""The format warm start of a run (``warm_start_steps``): supervised steps on replies drawn at random from
``warm_start_replies``, in the agent's chat format, before RL. It teaches the reply FORMAT only (random valid moves,
not solutions), so that the first GRPO steps have parseable replies to compare."""

from __future__ import annotations

import random
from typing import Any

import torch

from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.train.config import TrainConfig
from rllm_gym.train.console import progress_bar
from rllm_gym.train.evaluation import run_episodes

__all__ = ["warm_start"]


def warm_start(
    model: Any, tokenizer: Any, config: TrainConfig, tasks: dict[str, list[Any]], *, show: bool = True
) -> float:
    """Supervised steps on random replies in the agent's chat format, under a bar; returns the last loss."""
    rng = random.Random(config.seed)
    policy = ScriptedPolicy(lambda messages: rng.choice(config.warm_start_replies), tokenizer=tokenizer)
    examples: list[tuple[list[dict[str, Any]], str]] = []  # (the chat sent, the reply)
    for env_id, env_tasks in tasks.items():
        for episode in run_episodes(config, env_id, policy, env_tasks[:64], n_rollouts=4):
            # The reply format is the same at every turn: the first turns (short prompts) teach it cheaply.
            for trajectory in episode.trajectories:
                for step in trajectory.steps[:2]:
                    examples.append((list(step.chat_completions[:-1]), step.chat_completions[-1]["content"]))
    template_kwargs = config.chat_template_kwargs
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.warm_start_lr)
    model.train()
    loss = torch.tensor(0.0)
    bar = progress_bar(config, config.warm_start_steps, "warm start", "step", show=show)
    for _ in range(config.warm_start_steps):
        batch = rng.sample(examples, min(16, len(examples)))
        inputs, labels = [], []
        for messages, reply in batch:
            prompt = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
            )
            answer = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
            inputs.append([*prompt, *answer])
            labels.append([-100] * len(prompt) + answer)
        width = max(len(ids) for ids in inputs)
        pad = tokenizer.pad_token_id or 0
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in inputs], device=model.device)
        label_ids = torch.tensor([ids + [-100] * (width - len(ids)) for ids in labels], device=model.device)
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in inputs], device=model.device)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        bar.update()
        if not bar.disable:
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    bar.close()
    return float(loss.detach())
