import random
import re

import gymnasium as gym
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from rllm_gym.envs.base import MultiTurnEnv
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.trl_rollout import (
    EnvSetup,
    EpisodeRollout,
    RLLMGRPOTrainer,
    decode_prompt,
    encode_prompt,
    trajectory_to_sequence,
)
from rllm_gym.types import RewardOutput, Step, Trajectory


def test_prompts_round_trip_and_bad_prompts_are_named():
    prompt = encode_prompt("rllm/Math-v0", {"id": "q1", "question": "1+1?"}, slot=1)
    assert decode_prompt(prompt) == ("rllm/Math-v0", {"id": "q1", "question": "1+1?"}, 1)
    with pytest.raises(ValueError, match=re.escape("a training prompt must be made by")):
        decode_prompt("What is 1+1?")


def test_multi_turn_trajectory_is_one_sequence_with_observations_masked():
    steps = [
        Step(prompt_ids=[1, 2], response_ids=[3, 4], logprobs=[-0.1, -0.2]),
        Step(prompt_ids=[1, 2, 3, 4, 7, 8], response_ids=[5], logprobs=[-0.3]),
        Step(prompt_ids=[1, 2, 3, 4, 7, 8, 5, 9], response_ids=[6, 2], logprobs=[-0.4, -0.5]),
    ]
    sequence = trajectory_to_sequence(Trajectory(steps=steps))
    assert sequence.prompt_ids == [1, 2]
    assert sequence.completion_ids == [3, 4, 7, 8, 5, 9, 6, 2]
    assert sequence.env_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert sequence.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3, 0.0, -0.4, -0.5]
    assert sequence.spans == [(0, 2), (4, 5), (6, 8)] and not sequence.prefix_mismatch


def test_a_template_that_does_not_re_tokenize_as_a_prefix_stops_the_sequence():
    steps = [Step(prompt_ids=[1], response_ids=[3]), Step(prompt_ids=[1, 4, 9], response_ids=[5])]  # 3 became 4
    sequence = trajectory_to_sequence(Trajectory(steps=steps))
    assert sequence.prefix_mismatch
    assert sequence.completion_ids == [3] and sequence.spans == [(0, 1)]


def test_a_trajectory_without_steps_is_an_untrained_placeholder():
    sequence = trajectory_to_sequence(Trajectory(), filler_id=2)
    assert (sequence.prompt_ids, sequence.completion_ids, sequence.env_mask) == ([2], [2], [0])


def parity(task_info, action):
    even = len(action) % 2 == 0
    return RewardOutput(reward=float(even), is_correct=even)


class ParityEnv(MultiTurnEnv):
    """Two turns; a reply of even length is 'right': random text gets mixed rewards, so advantages are not zero."""

    def __init__(self):
        super().__init__(
            parity, tasks=[{"id": f"p{i}", "question": f"Say something {i}."} for i in range(4)], max_turns=2
        )


gym.register(id="test/Parity-v0", entry_point=ParityEnv)


def test_a_few_grpo_steps_change_the_model_and_never_train_env_tokens(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tasks = [{"id": f"p{i}", "question": f"Say something {i}."} for i in range(4)]
    dataset = Dataset.from_list([{"prompt": encode_prompt("test/Parity-v0", task)} for task in tasks] * 3)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=3,
        max_completion_length=6,
        learning_rate=1e-2,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        gradient_checkpointing=False,
        logging_steps=1,
    )
    # Scripted replies with real token ids: their text re-tokenizes as a prefix (random text from an untrained
    # model mostly does not, which stops its sequences at the first turn by design), and parity gives mixed rewards.
    replies = random.Random(0)
    policy = ScriptedPolicy(lambda messages: replies.choice(["yes", "no", "maybe", "ok"]), tokenizer=tokenizer)
    rollout = EpisodeRollout(
        [EnvSetup("test/Parity-v0", agent="rllm_gym.agents.math:MathAgent")],
        max_steps=2,
        policy_factory=lambda trainer: policy,
    )
    trainer = RLLMGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=dataset,
        rollout=rollout,
        advantage_config=AdvantageConfig(estimator="drgrpo"),
    )
    batches = []
    original = RLLMGRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        output = original(self, inputs)
        batches.append((output, list(self.rollout.last_sequences), list(self.rollout.last_episodes)))
        return output

    RLLMGRPOTrainer._generate_and_score_completions = spy
    try:
        trainer.train()
    finally:
        RLLMGRPOTrainer._generate_and_score_completions = original
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())
    saw_observations = False
    for output, sequences, episodes in batches:
        mask = output["tool_mask"]
        for row, sequence in enumerate(sequences):
            for position, flag in enumerate(sequence.env_mask):
                if flag == 0:  # an observation token: never trained
                    saw_observations = True
                    assert mask[row, position] == 0
        # Our advantages are the ones the loss sees: one per sequence, 0 mean within each 4-rollout group.
        advantages = output["advantages"]
        assert advantages.shape == (len(sequences),)
        for group in advantages.view(-1, 4):
            assert abs(float(group.sum())) < 1e-5
        assert all(e.termination_reason.value != "error" for e in episodes), episodes[0].metadata.get("error")
        rewards = [e.trajectories[0].reward for e in episodes]
        assert len(set(rewards)) > 1 or float(advantages.abs().sum()) == 0.0
    assert saw_observations, "two-turn episodes should have observation tokens in their sequences"


class StandInVLLMGeneration:
    """TRL's VLLMGeneration interface (generate(prompts, images, num_generations) -> ids and top logprobs)."""

    def __init__(self, tokenizer, mode="colocate", tensor_parallel_size=1):
        self.mode, self.tensor_parallel_size, self.tokenizer = mode, tensor_parallel_size, tokenizer
        self.calls = []

    def generate(self, prompts, images, num_generations):
        self.calls.append(len(prompts))
        reply = [*self.tokenizer.encode("up", add_special_tokens=False), self.tokenizer.eos_token_id]
        completions = [reply] * len(prompts)
        logprobs = [[[-0.5] for _ in ids] for ids in completions]
        return prompts, completions, logprobs, None


class StandInTrainer:
    def __init__(self, tokenizer, **kwargs):
        self.vllm_generation = StandInVLLMGeneration(tokenizer, **kwargs)
        self.processing_class = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]


async def test_trainer_vllm_policy_batches_episodes_into_one_generate_call(tiny_model_dir):
    from rllm_gym.agents.frozenlake import FrozenLakeAgent
    from rllm_gym.engine import AgentExecutionEngine
    from rllm_gym.train.trl_rollout import TrainerVLLMPolicy

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = StandInTrainer(tokenizer)
    policy = TrainerVLLMPolicy(trainer)
    engine = AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=FrozenLakeAgent, policy=policy, max_steps=2)
    episodes = await engine.run(list(range(8)))
    assert trainer.vllm_generation.calls[0] == 8  # every episode's first turn in one vLLM call
    step = episodes[0].trajectories[0].steps[0]
    assert step.model_output.text == "up" and step.model_output.finish_reason == "stop"
    assert step.logprobs == [-0.5, -0.5] and step.response_ids[-1] == tokenizer.eos_token_id
    assert step.prompt_ids == tokenizer.apply_chat_template(
        step.chat_completions[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    with pytest.raises(ValueError, match=re.escape("multi-turn rollouts need vllm_mode='colocate'")):
        TrainerVLLMPolicy(StandInTrainer(tokenizer, mode="server"))
