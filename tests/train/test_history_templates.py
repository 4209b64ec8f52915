"""Chat templates that rewrite history (Qwen3 drops the reasoning of earlier assistant turns): by default (token in,
token out) the model keeps seeing what it sampled and a trajectory is one row; with ``token_history="template"``
every turn is still trained, each from the prompt the model saw, and the mismatches are counted."""

from __future__ import annotations

import itertools
import shutil

import gymnasium as gym
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from rllm_gym.envs.base import MultiTurnEnv
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, encode_prompt
from rllm_gym.types import RewardOutput

# Like Qwen3's: an earlier assistant turn is rendered without its <think> block.
FORGETFUL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def forgetful_model(tiny_model_dir, tmp_path):
    folder = tmp_path / "forgetful"
    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = FORGETFUL_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def long_answer(task_info, action):
    # The MathAgent's action is the whole reply: what follows its reasoning is graded.
    right = len(action.rpartition("</think>")[2]) > 2
    return RewardOutput(reward=float(right), is_correct=right)


class TwoTurnEnv(MultiTurnEnv):
    """Two turns per episode, rewarded by the length of the last reply (scripted replies give mixed rewards)."""

    def __init__(self):
        tasks = [{"id": f"t{i}", "question": f"Say something {i}."} for i in range(2)]
        super().__init__(long_answer, tasks=tasks, max_turns=2)


gym.register(id="test/TwoTurn-v0", entry_point=TwoTurnEnv)


def train_one_step(tiny_model_dir, tmp_path, mode, token_history, train_and_record, make_trainer):
    """One training step on TwoTurn-v0 with the forgetful template: the loss's batch, the rollout's and the trainer."""
    folder = forgetful_model(tiny_model_dir, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    # Task t0 thinks at its first turn in 3 of its 4 rollouts (the template then rewrites that turn, so those
    # trajectories split in two rows); t1 never thinks (one row each). 4 + 3 x 2 + 1 = 11 rows, padded to 12.
    thoughts, answers = [], itertools.count()

    def reply(messages):
        first_turn = sum(m["role"] == "assistant" for m in messages) == 0
        if first_turn and "Say something 0" in messages[-1]["content"] and len(thoughts) < 3:
            thoughts.append(1)
            return "<think>let me see</think>ok"
        return "ok" if first_turn else ["ok", "sure thing"][next(answers) % 2]  # mixed last-turn rewards

    policy = ScriptedPolicy(reply, tokenizer=tokenizer, token_history=token_history)
    rollout = EpisodeRollout(
        [EnvSetup("test/TwoTurn-v0", agent="rllm_gym.agents.math:MathAgent")],
        max_turns=2,
        policy_factory=lambda trainer: policy,
    )
    prompts = [encode_prompt("test/TwoTurn-v0", {"id": f"t{i}", "question": f"Say something {i}."}) for i in (0, 1)]
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4, max_steps=1,
        max_completion_length=12, learning_rate=1e-2, beta=0.0, report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True, logging_steps=1, shuffle_dataset=False,
    )  # fmt: skip
    rows = [{"prompt": p} for p in prompts]
    trainer = make_trainer(model, tokenizer, args, rows, rollout, estimator="drgrpo", mode=mode)
    batches = train_and_record(trainer)
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())  # one real step ran
    [(output, seen)] = batches
    return output, seen, trainer, tokenizer


def test_by_default_the_model_keeps_what_it_sampled_and_a_trajectory_is_one_row(
    tiny_model_dir, tmp_path, train_and_record, make_trainer
):
    output, seen, trainer, tokenizer = train_one_step(
        tiny_model_dir, tmp_path, "broadcast", "sampled", train_and_record, make_trainer
    )
    sequences, episodes = seen.sequences, seen.episodes
    assert len(sequences) == 8 == output["completion_ids"].size(0) and not any(s.prefix_mismatch for s in sequences)
    thought = 0
    for sequence in sequences:
        first, second = episodes[sequence.source].trajectories[0].steps
        # The second turn's prompt is the first prompt and reply, token for token, then the new message.
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == [
            *first.prompt_ids,
            *first.response_ids,
        ]
        row_ids = sequence.prompt_ids + sequence.completion_ids
        assert row_ids == second.prompt_ids + second.response_ids  # the row is the episode's tokens
        assert sequence.spans == [
            (0, len(first.response_ids)),
            (len(second.prompt_ids) - len(first.prompt_ids), len(sequence.completion_ids)),
        ]
        thought += "<think>" in tokenizer.decode(second.prompt_ids)  # the reasoning the model wrote stays in view
    assert thought == 3
    logged = next(entry for entry in trainer.state.log_history if "rollout/prefix_mismatch" in entry)
    assert logged["rollout/prefix_mismatch"] == 0 and logged["rollout/rows_per_trajectory"] == 1.0
    assert logged["rollout/text_rendered"] == 0


@pytest.mark.parametrize("mode", ["broadcast", "per_step"])
def test_with_template_history_turns_are_each_trained_from_their_own_prompt(
    tiny_model_dir, tmp_path, mode, train_and_record, make_trainer
):
    output, seen, trainer, tokenizer = train_one_step(
        tiny_model_dir, tmp_path, mode, "template", train_and_record, make_trainer
    )
    sequences, episodes = seen.sequences, seen.episodes
    assert len(episodes) == 8 and len(sequences) == 12 == output["completion_ids"].size(0)
    assert [s.source for s in sequences].count(-1) == 1  # one padding row, nothing of it trained
    mask = output["tool_mask"] * output["completion_mask"]  # what the loss trains
    completion_ids, prompt_ids = output["completion_ids"], output["prompt_ids"]
    advantages = output["advantages"]
    # drgrpo: a trajectory's reward minus its task group's mean, one entry per trajectory however many rows it has
    # (per_step compares each step's return-to-go, which is the final reward at both turns here: the same values).
    rewards = {task: [e.trajectories[0].reward for e in episodes if e.task_id == task] for task in ("t0", "t1")}
    assert all(len(values) == 4 for values in rewards.values()) and len(set(rewards["t0"] + rewards["t1"])) == 2

    def expected(episode):
        return episode.trajectories[0].reward - sum(rewards[episode.task_id]) / 4

    trained_steps = 0
    for row, sequence in enumerate(sequences):
        if sequence.source < 0:
            assert mask[row].sum() == 0 and not advantages[row].any()
            continue
        trajectory = episodes[sequence.source].trajectories[0]
        # Each row starts with the full prompt of its first step, as the model saw it (left padded by TRL).
        step = trajectory.steps[sequence.first_step]
        assert prompt_ids[row, -len(step.prompt_ids) :].tolist() == step.prompt_ids
        for (start, end), index in zip(sequence.spans, range(sequence.first_step, 2), strict=False):
            response = trajectory.steps[index].response_ids
            assert completion_ids[row, start:end].tolist() == response  # the turn's own reply ...
            assert mask[row, start:end].tolist() == [1] * len(response)  # ... is trained
            if mode == "per_step":  # ... with its own step's advantage
                assert advantages[row, start:end].tolist() == [expected(episodes[sequence.source])] * len(response)
            trained_steps += 1
        assert int(mask[row].sum()) == sum(sequence.env_mask)  # and nothing else (observations stay masked)
        if mode == "broadcast":  # each row has its trajectory's advantage
            assert float(advantages[row]) == expected(episodes[sequence.source])
    assert trained_steps == sum(len(e.trajectories[0].steps) for e in episodes) == 16  # no turn dropped

    split = [s for s in sequences if s.prefix_mismatch]
    assert len(split) == 3 and all(s.first_step == 1 for s in split)
    for sequence in split:  # the re-rendered prompt lost the reasoning the model wrote at turn 1
        first = episodes[sequence.source].trajectories[0].steps[0]
        assert "<think>" in tokenizer.decode(first.response_ids)
        assert "<think>" not in tokenizer.decode(sequence.prompt_ids)
    assert any(expected(e) != 0 for e in episodes)

    logged = next(entry for entry in trainer.state.log_history if "rollout/prefix_mismatch" in entry)
    assert logged["rollout/prefix_mismatch"] == 3 / 8
    assert logged["rollout/rows_per_trajectory"] == 11 / 8 and logged["rollout/padding_rows"] == 1 / 12
