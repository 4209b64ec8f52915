import random
import re
from collections import Counter, defaultdict
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from rllm_gym.engine.common import usable_cpus
from rllm_gym.envs.base import MultiTurnEnv
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.train.trainer import (
    EnvSetup,
    EpisodeRollout,
    decode_prompt,
    encode_prompt,
    process_cores,
    trajectory_to_sequences,
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
    [sequence] = trajectory_to_sequences(Trajectory(steps=steps))
    assert sequence.prompt_ids == [1, 2]
    assert sequence.completion_ids == [3, 4, 7, 8, 5, 9, 6, 2]
    assert sequence.env_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert sequence.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3, 0.0, -0.4, -0.5]
    assert sequence.spans == [(0, 2), (4, 5), (6, 8)] and not sequence.prefix_mismatch


def test_a_template_that_rewrites_history_splits_the_trajectory_into_rows_and_drops_no_turn():
    steps = [
        Step(prompt_ids=[1], response_ids=[3], logprobs=[-0.1]),
        Step(prompt_ids=[1, 4, 9], response_ids=[5], logprobs=[-0.2]),  # the reply 3 was re-rendered as 4
        Step(prompt_ids=[1, 4, 9, 5, 7], response_ids=[6, 2], logprobs=[-0.3, -0.4]),  # this one extends again
    ]
    first, second = trajectory_to_sequences(Trajectory(steps=steps), source=5)
    assert (first.prompt_ids, first.completion_ids, first.env_mask, first.spans) == ([1], [3], [1], [(0, 1)])
    assert (first.first_step, first.source, first.prefix_mismatch) == (0, 5, False)
    # The second row starts at step 1 with its full prompt; step 2 extends it, so it joins that row.
    assert second.prompt_ids == [1, 4, 9] and second.completion_ids == [5, 7, 6, 2]
    assert second.env_mask == [1, 0, 1, 1] and second.logprobs == [-0.2, 0.0, -0.3, -0.4]
    assert second.spans == [(0, 1), (2, 4)] and (second.first_step, second.source, second.prefix_mismatch) == (
        1,
        5,
        True,
    )


def test_a_prompt_that_re_spells_an_earlier_reply_starts_a_row_of_its_own():
    # Policies continue the sampled tokens, so this happens only where the chat was re-rendered (token_history=
    # "template", a text-rendering server): the row then holds what the model saw at that turn, not a patched guess.
    steps = [
        Step(prompt_ids=[1], response_ids=[2, 3], logprobs=[-0.1, -0.2]),  # sampled "le" "ft"
        Step(prompt_ids=[1, 4, 5], response_ids=[6], logprobs=[-0.3]),  # the template re-encoded it as "left"
    ]
    first, second = trajectory_to_sequences(Trajectory(steps=steps))
    assert (first.completion_ids, second.prompt_ids, second.completion_ids) == ([2, 3], [1, 4, 5], [6])
    assert second.prefix_mismatch and not first.prefix_mismatch


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


def grpo_args(tmp_path, **kwargs):
    defaults = dict(
        output_dir=str(tmp_path),
        max_completion_length=12,
        learning_rate=1e-2,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        gradient_checkpointing=False,
        logging_steps=1,
        shuffle_dataset=False,
    )
    return GRPOConfig(**{**defaults, **kwargs})


def test_a_few_grpo_steps_change_the_model_and_never_train_env_tokens(
    tiny_model_dir, tmp_path, train_and_record, make_trainer
):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tasks = [{"id": f"p{i}", "question": f"Say something {i}."} for i in range(4)]
    rows = [{"prompt": encode_prompt("test/Parity-v0", task)} for task in tasks] * 3
    args = grpo_args(
        tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=3, max_completion_length=6,
        shuffle_dataset=True,
    )  # fmt: skip
    # Scripted replies with real token ids (parity gives mixed rewards); the next test trains on the model's own
    # random text, which would re-tokenize differently if the chat were re-rendered.
    replies = random.Random(0)
    policy = ScriptedPolicy(lambda messages: replies.choice(["yes", "no", "maybe", "ok"]), tokenizer=tokenizer)
    rollout = EpisodeRollout(
        [EnvSetup("test/Parity-v0", agent="rllm_gym.agents.math:MathAgent")],
        max_turns=2,
        policy_factory=lambda trainer: policy,
    )
    trainer = make_trainer(model, tokenizer, args, rows, rollout, estimator="drgrpo")
    batches = [(output, batch.sequences, batch.episodes) for output, batch in train_and_record(trainer)]
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


def test_the_trainers_own_model_gives_one_row_of_exactly_its_tokens_per_multi_turn_trajectory(
    tiny_model_dir, tmp_path, train_and_record, make_trainer
):
    # Generation by HFPolicy on the training weights: random replies, many cut by the length limit, whose text the
    # tokenizer would spell with other tokens. Token in, token out keeps each trajectory one row all the same.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = [{"id": f"p{i}", "question": f"Say something {i}."} for i in range(2)]
    rows = [{"prompt": encode_prompt("test/Parity-v0", task)} for task in tasks]
    rollout = EpisodeRollout(
        [EnvSetup("test/Parity-v0", agent="rllm_gym.agents.math:MathAgent")], max_turns=2, stop_on_truncation=False
    )
    args = grpo_args(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=1, max_completion_length=6)
    trainer = make_trainer(model, tokenizer, args, rows, rollout, estimator="drgrpo")
    [(_, seen)] = train_and_record(trainer)
    trajectories = [e.trajectories[0] for e in seen.episodes]
    assert sum(len(t.steps) for t in trajectories) > len(trajectories)  # a right answer ends an episode early
    assert len(seen.sequences) == 8 and not any(s.prefix_mismatch for s in seen.sequences)
    for sequence in seen.sequences:
        last = trajectories[sequence.source].steps[-1]
        assert sequence.prompt_ids + sequence.completion_ids == last.prompt_ids + last.response_ids
    logged = next(entry for entry in trainer.state.log_history if "rollout/rows_per_trajectory" in entry)
    assert logged["rollout/rows_per_trajectory"] == 1.0 and logged["rollout/prefix_mismatch"] == 0


def test_solver_judge_roles_share_episodes_and_get_advantages_within_their_role(
    tiny_model_dir, tmp_path, train_and_record, make_trainer
):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = [{"id": f"q{i}", "question": f"What is {i} + 1?", "ground_truth": str(i + 1)} for i in range(2)]
    # A task's three prompts (solver_0, solver_1, judge_0) side by side, as train/grpo.py's build_prompts lays them.
    rows = [{"prompt": encode_prompt("rllm/SolverJudge-v0", task, slot)} for task in tasks for slot in range(3)]
    replies = random.Random(0)

    def reply(messages):
        if "verdict" in messages[-1]["content"]:
            return replies.choice(["<verdict>1</verdict>", "<verdict>2</verdict>"])
        return replies.choice(["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"])

    policy = ScriptedPolicy(reply, tokenizer=tokenizer)
    rollout = EpisodeRollout([EnvSetup("rllm/SolverJudge-v0")], max_turns=3, policy_factory=lambda trainer: policy)
    args = grpo_args(tmp_path, per_device_train_batch_size=24, num_generations=4, max_steps=2)
    trainer = make_trainer(model, tokenizer, args, rows * 2, rollout, estimator="grpo")
    batches = [(output, batch.episodes, batch.slots) for output, batch in train_and_record(trainer)]
    assert len(batches) == 2
    for output, episodes, slots in batches:
        # 24 rows = 2 tasks x 3 slots x 4 generations, from 8 episodes: each episode trains all three trajectories.
        assert len({id(e) for e in episodes}) == 8
        assert sorted(Counter(id(e) for e in episodes).values()) == [3] * 8
        assert all(len(e.trajectories) == 3 and e.termination_reason.value == "env_done" for e in episodes)
        advantages = output["advantages"].tolist()
        groups = defaultdict(list)
        for episode, slot, advantage in zip(episodes, slots, advantages, strict=True):
            trajectory = episode.trajectories[slot]
            assert trajectory.name == ("judge" if slot == 2 else "solver")
            groups[episode.task_id, trajectory.name].append((float(trajectory.reward), advantage))
        assert sorted(len(g) for g in groups.values()) == [4, 4, 8, 8]  # 8 solvers and 4 judges per task
        for members in groups.values():
            rewards = [r for r, _ in members]
            mean = sum(rewards) / len(rewards)
            assert abs(sum(a for _, a in members)) < 1e-4  # zero mean within the role's own group
            for reward, advantage in members:
                assert (advantage > 0) == (reward > mean) or abs(advantage) < 1e-6


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
        self.accelerator = SimpleNamespace(device=torch.device("cpu"))
        self.processing_class = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]


async def test_trainer_vllm_policy_batches_episodes_into_one_generate_call(tiny_model_dir):
    from rllm_gym.agents.frozenlake import FrozenLakeAgent
    from rllm_gym.engine import AgentExecutionEngine
    from rllm_gym.train.trainer import TrainerVLLMPolicy

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = StandInTrainer(tokenizer)
    policy = TrainerVLLMPolicy(trainer)
    engine = AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=FrozenLakeAgent, policy=policy, max_turns=2)
    episodes = await engine.run(list(range(8)))
    assert trainer.vllm_generation.calls[0] == 8  # every episode's first turn in one vLLM call
    step = episodes[0].trajectories[0].steps[0]
    assert step.model_output.text == "up" and step.model_output.finish_reason == "stop"
    assert step.logprobs == [-0.5, -0.5] and step.response_ids[-1] == tokenizer.eos_token_id
    assert step.prompt_ids == tokenizer.apply_chat_template(
        step.chat_completions[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    with pytest.raises(ValueError, match=re.escape("TrainerVLLMPolicy needs vllm_mode='colocate'")):
        TrainerVLLMPolicy(StandInTrainer(tokenizer, mode="server"))


class StandInServerClient:
    """``VLLMClient.generate`` of a `trl vllm-serve` process that answers "up" to every prompt."""

    def __init__(self, tokenizer):
        self.reply = [*tokenizer.encode("up", add_special_tokens=False), tokenizer.eos_token_id]
        self.calls = []

    def generate(self, prompts, n=1, logprobs=0, **sampling):
        self.calls.append(len(prompts))
        completions = [list(self.reply) for _ in prompts]
        return {
            "prompt_ids": prompts,
            "completion_ids": completions,
            "logprobs": [[[-0.25] for _ in ids] for ids in completions],
            "logprob_token_ids": [[[token] for token in ids] for ids in completions],
        }


def test_server_mode_rollout_goes_through_the_lockstep_policy(tiny_model_dir):

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    client = StandInServerClient(tokenizer)
    generation = SimpleNamespace(
        mode="server", vllm_client=client, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
        min_p=None, max_completion_length=4, logprobs=0, structured_outputs_regex=None, generation_kwargs={},
    )  # fmt: skip
    trainer = SimpleNamespace(
        use_vllm=True,
        vllm_generation=generation,
        args=SimpleNamespace(vllm_mode="server", seed=0, temperature=1.0, top_p=1.0, top_k=0, max_completion_length=4),
        accelerator=SimpleNamespace(
            num_processes=1, process_index=0, is_main_process=True, device=torch.device("cpu")
        ),
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
    )
    rollout = EpisodeRollout([EnvSetup("rllm/FrozenLake-v0")], max_turns=2)
    prompts = [encode_prompt("rllm/FrozenLake-v0", seed) for seed in range(6)]
    batch = rollout.collect(prompts, rollout.generation_for(trainer))
    assert client.calls[0] == 6  # the first turn of all six episodes in one server call
    assert len(batch.trl_output()["completion_ids"]) == 6
    steps = [step for episode in batch.episodes for step in episode.trajectories[0].steps]
    assert steps and all(step.model_output.text == "up" and step.logprobs == [-0.25] * 2 for step in steps)
    assert batch.metrics["vllm_server/server_calls"] == len(client.calls)
    rollout.close()


def test_the_trainers_own_model_keeps_its_policy_and_workflows_from_step_to_step(
    tiny_model_dir, tmp_path, train_and_record, make_trainer, monkeypatch
):
    from rllm_gym.engine import AgentWorkflowEngine
    from rllm_gym.policies.hf import HFPolicy

    built: Counter[str] = Counter()
    init, new_workflow, generate = HFPolicy.__init__, AgentWorkflowEngine._new_workflow, HFPolicy._generate_batch
    training_while_generating = []
    monkeypatch.setattr(HFPolicy, "__init__", lambda self, *a, **k: built.update(["policy"]) or init(self, *a, **k))
    monkeypatch.setattr(
        HFPolicy,
        "_generate_batch",
        lambda self, *a: training_while_generating.append(self.model.training) or generate(self, *a),
    )
    monkeypatch.setattr(
        AgentWorkflowEngine, "_new_workflow", lambda self: built.update(["workflow"]) or new_workflow(self)
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = [{"id": f"m{i}", "question": f"What is {i} + 1?", "ground_truth": str(i + 1)} for i in range(2)]
    rows = [{"prompt": encode_prompt("rllm/Math-v0", task)} for task in tasks] * 3
    args = grpo_args(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=3, max_completion_length=4)
    trainer = make_trainer(model, tokenizer, args, rows, EpisodeRollout([EnvSetup("rllm/Math-v0")], max_turns=1))
    steps = train_and_record(trainer)
    assert len(steps) == 3 and built["policy"] == 1  # one HFPolicy for the run
    assert training_while_generating == [False] * 3  # the model in eval mode for every step's generation
    assert model.training  # and back in training mode after it
    assert 1 <= built["workflow"] <= 8  # the first step's workflows (at most one per episode) serve every step
    for _, batch in steps:
        assert len(batch.episodes) == 8
        assert all(e.termination_reason.value != "error" for e in batch.episodes)


def test_old_module_name_still_works_with_a_warning():
    import importlib
    import sys

    import rllm_gym.train.trainer as trainer

    sys.modules.pop("rllm_gym.train.trl_rollout", None)
    with pytest.warns(FutureWarning, match="rllm_gym.train.trainer"):
        old = importlib.import_module("rllm_gym.train.trl_rollout")
    assert old.RLLMGRPOTrainer is trainer.RLLMGRPOTrainer
    assert set(old.__all__) == set(trainer.__all__)
    assert all(getattr(old, name) is getattr(trainer, name) for name in trainer.__all__)


def test_each_training_process_counts_only_the_processes_on_its_machine_for_its_share_of_the_cores(monkeypatch):
    cpus = usable_cpus()
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert process_cores(1) == cpus
    assert process_cores(2 * cpus) == 1  # never less than one
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # two machines, one process on each: all of this one's cores
    assert process_cores(2) == cpus
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "")  # not a count: the world size stands in
    assert process_cores(2) == max(1, cpus // 2)
