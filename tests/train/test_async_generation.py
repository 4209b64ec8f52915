import copy
import dataclasses
import importlib
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig

from rllm_gym.policies.base import SamplingParams
from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.async_generation import (
    AsyncGenerator,
    GeneratorDied,
    WorkerSettings,
    sandbox_runs,
)
from rllm_gym.train.off_policy import OffPolicyCorrection
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, encode_prompt

LAKE = "rllm/FrozenLake-v0"


def lake_rollout() -> EpisodeRollout:
    # Replies of 4 random tokens are rarely a move: the env says so and the episode goes on, several turns each.
    return EpisodeRollout([EnvSetup(LAKE)], max_turns=3, stop_on_truncation=False)


def settings(tokenizer) -> WorkerSettings:
    sampling = SamplingParams(temperature=1.0, max_tokens=4)
    return WorkerSettings(sampling, run_seed=0, filler_id=tokenizer.eos_token_id, chat_template_kwargs={},
                          token_history="sampled")  # fmt: skip


def test_the_worker_stamps_each_step_with_the_published_version_ignores_ctrl_c_and_is_joined(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [encode_prompt(LAKE, seed) for seed in (0, 0, 1, 1)]
    threads = torch.get_num_threads()
    generator = AsyncGenerator(lake_rollout(), model, tokenizer, settings(tokenizer), version=3, timeout_s=300)
    try:
        # The worker's thread comes out of the trainer's (spinning torch threads on shared cores), until close().
        assert torch.get_num_threads() == max(1, min(threads, (os.cpu_count() or 1) - 1))
        generator.submit(prompts)
        first = generator.result(prompts)
        steps = [step for episode in first.episodes for step in episode.trajectories[0].steps]
        assert len(steps) > len(first.episodes)  # multi-turn episodes
        assert {step.model_output.policy_version for step in steps} == {3}
        assert all(len(step.logprobs) == len(step.response_ids) for step in steps)  # behaviour log-probabilities
        os.kill(generator.process.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group: the trainer's
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01)
        generator.publish(model, 4)
        assert all(
            torch.equal(mine, shared)
            for mine, shared in zip(model.parameters(), generator.model.parameters(), strict=True)
        )
        generator.submit(prompts)
        second = generator.result(prompts)
        assert generator.process.is_alive()
        versions = {s.model_output.policy_version for e in second.episodes for s in e.trajectories[0].steps}
        assert versions == {4}
        assert [e.id for e in second.episodes] != [e.id for e in first.episodes]  # numbered per call, as in sync
        with pytest.raises(RuntimeError, match="prompts the generator was not given next"):
            generator.result(prompts)
    finally:
        generator.close()
    assert torch.get_num_threads() == threads
    assert not generator.process.is_alive() and generator.process.exitcode == 0


def test_a_killed_worker_is_restarted_once_and_its_steps_in_flight_are_generated_again(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    steps = [[encode_prompt(LAKE, seed)] * 2 for seed in (0, 1)]
    generator = AsyncGenerator(lake_rollout(), model, tokenizer, settings(tokenizer), versions=2, timeout_s=300)
    try:
        first = generator.process
        for prompts in steps:
            generator.submit(prompts)
        os.kill(first.pid, signal.SIGKILL)  # whatever it was doing: generating, answering
        first.join(30)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.5)
        generator.publish(model, 1)  # into the other copy: the steps in flight were handed over at version 0
        batches = [generator.result(prompts) for prompts in steps]
        assert generator.restarts == 1 and generator.process is not first and generator.process.is_alive()
        # Both steps generated again by the new worker, numbered and pinned as the first worker had them.
        assert [[e.id for e in batch.episodes] for batch in batches] == [
            ["seed-0:p0s0e0", "seed-0:p0s0e1"],
            ["seed-1:p0s1e0", "seed-1:p0s1e1"],
        ]
        steps = [s for batch in batches for e in batch.episodes for s in e.trajectories[0].steps]
        assert {s.model_output.policy_version for s in steps} == {0}
    finally:
        generator.close()


def test_a_worker_that_dies_again_within_the_step_stops_the_wait_with_its_exit_code(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    generator = AsyncGenerator(lake_rollout(), model, tokenizer, settings(tokenizer), timeout_s=300)
    stop = threading.Event()

    def kill_every_worker():  # each worker killed as soon as it is started: none lives to answer
        killed = set()
        while not stop.is_set():
            pid = generator.process.pid  # None while it is being started
            if pid is not None and pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_every_worker)
    killer.start()
    try:
        prompts = [encode_prompt(LAKE, 0)]
        generator.submit(prompts)
        message = "the generation worker exited with code -9, again after a restart within the same step"
        with pytest.raises(GeneratorDied, match=re.escape(message)):
            generator.result(prompts)
        assert generator.restarts == 1
    finally:
        stop.set()
        killer.join()
        generator.close()


class _Recorded:
    """The RolloutBatch the trainer got from its generator at each step, and the step it trained at."""

    def __init__(self):
        self.batches = []

    def __enter__(self):
        result = AsyncGenerator.result
        record = self.batches

        def recorded(generator, prompts):
            record.append(result(generator, prompts))
            return record[-1]

        self._patch = patch.object(AsyncGenerator, "result", recorded)
        self._patch.start()
        return self

    def __exit__(self, *exc):
        self._patch.stop()


def trainer_for(tiny_model_dir, tmp_path, max_steps, max_staleness, temperature=1.0, accumulation=1, threads="share"):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [{"prompt": encode_prompt(LAKE, seed)} for seed in range(2 * max_steps)]
    args = GRPOConfig(
        output_dir=str(tmp_path), max_completion_length=4, learning_rate=1e-2, beta=0.0, report_to=[], use_cpu=True,
        bf16=False, save_strategy="no", disable_tqdm=True, logging_steps=1, num_generations=4, max_steps=max_steps,
        per_device_train_batch_size=8 // accumulation, gradient_accumulation_steps=accumulation, seed=0,
        temperature=temperature,
    )  # fmt: skip
    return RLLMGRPOTrainer(
        model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows), rollout=lake_rollout(),
        advantage_config=AdvantageConfig(), max_staleness=max_staleness, async_trainer_threads=threads,
    )  # fmt: skip


def test_k2_trains_on_multi_turn_rows_at_most_two_versions_old_and_logs_the_correction(tiny_model_dir, tmp_path):
    trainer = trainer_for(tiny_model_dir, tmp_path, max_steps=4, max_staleness=2)
    with _Recorded() as recorded:
        trainer.train()
    assert trainer.generator is None  # stopped with the training
    assert len(recorded.batches) == 4
    # Steps 0-2 were handed over before any optimizer step; step 3 when step 1 began, after version 1 was published.
    steps = [[s for e in b.episodes for s in e.trajectories[0].steps] for b in recorded.batches]
    versions = [{s.model_output.policy_version for s in batch} for batch in steps]
    assert versions == [{0}, {0}, {0}, {1}]
    logged = [entry for entry in trainer.state.log_history if "async/staleness_max" in entry]
    assert [entry["async/staleness_max"] for entry in logged] == [0, 1, 2, 2]
    assert all(entry["async/dropped_rows"] == 0 for entry in logged)
    assert all(0 <= entry["async/is_clipped"] <= 1 and entry["async/mismatch"] >= 0 for entry in logged)
    assert all(entry["rollout/turns"] > 1 for entry in logged)


def test_a_k2_run_samples_and_trains_the_same_whether_its_worker_runs_ahead_and_whatever_the_trainers_threads(
    tiny_model_dir, tmp_path
):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the trainer has no thread to give up")

    class WorkerAhead(TrainerCallback):  # each step trains once the worker is done with what it was handed
        def on_step_begin(self, args, state, control, **kwargs):
            deadline = time.monotonic() + 120  # a bound on a broken worker's wait, not a timing assertion
            while trainer.generator.running and time.monotonic() < deadline:
                time.sleep(0.02)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    runs = []
    try:
        # Kept to the one thread the worker leaves, whenever it runs; then with both (the worker waits), shared.
        for ahead, mode in ((False, "fixed"), (True, "share")):
            trainer = trainer_for(tiny_model_dir, tmp_path / mode, max_steps=4, max_staleness=2, threads=mode)
            if ahead:
                trainer.add_callback(WorkerAhead())
            seen = set()  # the trainer's torch threads in its forwards (after the generator's hooks set them)
            embed = trainer.model.get_input_embeddings()
            hook = embed.register_forward_hook(lambda *_, seen=seen: seen.add(torch.get_num_threads()))
            with _Recorded() as recorded:
                trainer.train()
            hook.remove()
            sampled = [[(s.response_ids, s.model_output.logprobs) for e in b.episodes for s in e.trajectories[0].steps]
                       for b in recorded.batches]  # fmt: skip
            runs.append((seen, sampled, [p.detach().clone() for p in trainer.model.parameters()]))
    finally:
        torch.set_num_threads(threads)
    assert runs[0][0] == {1} and 2 in runs[1][0]  # the loss's forwards (those before a step begins may share)
    assert runs[0][1] == runs[1][1]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][2], runs[1][2], strict=True))


def test_with_gradient_accumulation_k1_trains_every_row_at_most_one_version_old(tiny_model_dir, tmp_path):
    # A step takes several batches: the look-ahead handed over a step one too far ahead at each of them, and every
    # row of that step was then dropped as two versions old (found on an H200 with qwen_math_1gpu.yaml).
    trainer = trainer_for(tiny_model_dir, tmp_path, max_steps=4, max_staleness=1, accumulation=2)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "async/staleness_max" in entry]
    assert [entry["async/staleness_max"] for entry in logged] == [0, 1, 1, 1]
    assert all(entry["async/dropped_rows"] == 0 for entry in logged)


def test_rows_of_the_trained_version_match_the_loss_at_a_sampling_temperature(tiny_model_dir, tmp_path):
    # Step 0 trains rows sampled by the weights it starts from: at T=0.5 the worker's behaviour log-probabilities
    # (HFPolicy(logprobs_mode="temperature")) equal the loss's, which scores logits / T; raw ones were ~1 nat off.
    trainer = trainer_for(tiny_model_dir, tmp_path, max_steps=1, max_staleness=1, temperature=0.5)
    trainer.train()
    [logged] = [entry for entry in trainer.state.log_history if "async/staleness_max" in entry]
    assert logged["async/staleness_max"] == 0 and logged["async/mismatch"] < 1e-4


def test_a_worker_killed_mid_run_is_restarted_and_the_run_goes_on(tiny_model_dir, tmp_path):
    class KillWorker(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:  # step 2's episodes in flight or sent, step 3's to come
                os.kill(trainer.generator.process.pid, signal.SIGKILL)

    trainer = trainer_for(tiny_model_dir, tmp_path, max_steps=3, max_staleness=1)
    trainer.add_callback(KillWorker())  # after the trainer's own, which publishes the weights
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "async/restarts" in entry]
    restarts = [entry["async/restarts"] for entry in logged]
    assert len(restarts) == 3 and restarts[0] == 0 and restarts[-1] == 1  # found at step 2, or 3 if 2 was sent
    assert trainer.generator is None


def test_combinations_it_cannot_run_are_refused_by_the_trainer(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=8,
                      num_generations=4, num_iterations=2)  # fmt: skip
    dataset = Dataset.from_list([{"prompt": encode_prompt(LAKE, 0)}] * 4)
    with pytest.raises(ValueError, match=re.escape("max_staleness=1 is not supported with num_iterations > 1 yet")):
        RLLMGRPOTrainer(model, args=args, processing_class=tokenizer, train_dataset=dataset, rollout=lake_rollout(),
                        advantage_config=AdvantageConfig(), max_staleness=1)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("async_trainer_threads must be 'share' or 'fixed', got 'fix'")):
        RLLMGRPOTrainer(model, args=args, processing_class=tokenizer, train_dataset=dataset, rollout=lake_rollout(),
                        advantage_config=AdvantageConfig(), max_staleness=1, async_trainer_threads="fix")  # fmt: skip


def test_clip_is_refused_where_trls_loss_no_longer_reads_the_old_log_probabilities(tiny_model_dir, tmp_path):
    from rllm_gym.train import trainer as trainer_module

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=8,
                      num_generations=4)  # fmt: skip
    dataset = Dataset.from_list([{"prompt": encode_prompt(LAKE, 0)}] * 4)
    moved = {"old_per_token_logps"}  # as train/trl_adapter.py's check answers for a TRL that moved it
    with patch.object(trainer_module, "available", lambda name: name not in moved):
        with pytest.raises(ValueError, match=re.escape("use async_is_mode truncate")):
            RLLMGRPOTrainer(model, args=args, processing_class=tokenizer, train_dataset=dataset,
                            rollout=lake_rollout(), advantage_config=AdvantageConfig(), max_staleness=1)  # fmt: skip
        truncated = RLLMGRPOTrainer(
            model, args=args, processing_class=tokenizer, train_dataset=dataset, rollout=lake_rollout(),
            advantage_config=AdvantageConfig(), max_staleness=1, off_policy=OffPolicyCorrection(mode="truncate"),
        )  # fmt: skip
    assert truncated.off_policy.mode == "truncate"


def group_ends(group: int, within_s: float) -> bool:
    """Whether every process of the process ``group`` is gone within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_its_worker_and_a_resume_goes_on_asynchronously(tmp_path):
    import subprocess
    import sys

    from tests.conftest import QUIET_ENV, REPO

    output_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(REPO / "train/configs/test_tiny.yaml"),
        "--output_dir", str(output_dir), "--max_staleness", "1", "--save_steps", "1000",
    ]  # fmt: skip
    # Its own process group, which the terminal's Ctrl-C reaches as a whole: the trainer and its worker.
    process = subprocess.Popen(
        [*command, "--max_steps", "200"], env=QUIET_ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    metrics = output_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert process.poll() is None and time.monotonic() < deadline, "training did not get going"
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert sum("Ctrl-C" in line for line in (stdout + stderr).splitlines()) == 1  # the trainer's one notice
    assert group_ends(process.pid, within_s=60)  # the worker (and multiprocessing's resource tracker) stopped too
    stopped_at = max(int(path.name.removeprefix("checkpoint-")) for path in output_dir.glob("checkpoint-*"))
    resumed = subprocess.run(
        [*command, "--max_steps", str(stopped_at + 2), "--resume", "true"], env=QUIET_ENV, cwd=REPO,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    logged = [line for line in metrics.read_text().splitlines() if "async/staleness_max" in line]
    assert len(logged) >= stopped_at + 2  # every step of both parts logged its staleness


def logprobs_under(model, steps) -> list[float]:
    """The log-probabilities ``model`` gives each step's sampled reply tokens after its prompt."""
    found = []
    with torch.no_grad():
        for step in steps:
            ids = torch.tensor([step.model_output.prompt_ids + step.model_output.completion_ids])
            logits = model(input_ids=ids).logits[0, len(step.model_output.prompt_ids) - 1 : -1]
            chosen = torch.tensor(step.model_output.completion_ids)
            found += torch.log_softmax(logits.float(), -1)[torch.arange(len(chosen)), chosen].tolist()
    return found


@pytest.mark.parametrize("lora", [False, True])
def test_after_a_publish_the_worker_samples_from_the_trainers_policy(tiny_model_dir, lora):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    if lora:  # the trainer's model as TRL wraps it for a LoRA run; only the adapter's weights change in training
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    trained = [parameter for parameter in model.parameters() if parameter.requires_grad]
    generator = AsyncGenerator(lake_rollout(), model, tokenizer, settings(tokenizer), timeout_s=300)
    try:
        before = copy.deepcopy(model)
        with torch.no_grad():  # an "optimizer step" that changes the policy a lot
            for parameter in trained:
                parameter.add_(torch.randn_like(parameter) * 0.5)
        generator.publish(model, 1)
        prompts = [encode_prompt(LAKE, seed) for seed in (0, 1)]
        generator.submit(prompts)
        steps = [step for episode in generator.result(prompts).episodes for step in episode.trajectories[0].steps]
        behaviour = [logprob for step in steps for logprob in step.model_output.logprobs]
        assert {step.model_output.policy_version for step in steps} == {1}
        assert behaviour == pytest.approx(logprobs_under(model.eval(), steps), abs=2e-3)
        assert behaviour != pytest.approx(logprobs_under(before.eval(), steps), abs=2e-3)  # the published ones
    finally:
        generator.close()


def pinned_run(tiny_model_dir, publish_while_generating: bool) -> list:
    """Two steps through a worker holding two versions: step A handed over at version 0, version 1 published (while
    A generates, or once it is back), step B handed over at version 1; each step's (version, reply ids, log-probs)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    generator = AsyncGenerator(lake_rollout(), model, tokenizer, settings(tokenizer), versions=2, timeout_s=300)
    steps = [[encode_prompt(LAKE, seed)] * 4 for seed in (0, 1)]
    try:
        generator.submit(steps[0])
        batches = [] if publish_while_generating else [generator.result(steps[0])]
        with torch.no_grad():  # an "optimizer step" that changes the policy a lot
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.5)
        generator.publish(model, 1)
        generator.submit(steps[1])
        if publish_while_generating:  # A (version 0) and B (version 1) in flight: neither copy may be overwritten
            with pytest.raises(RuntimeError, match=re.escape("version 2 has no copy to go to")):
                generator.publish(model, 2)
        batches = batches + [generator.result(prompts) for prompts in steps[len(batches) :]]
    finally:
        generator.close()
    steps = [[s for e in batch.episodes for s in e.trajectories[0].steps] for batch in batches]
    return [[(s.model_output.policy_version, s.response_ids, s.model_output.logprobs) for s in b] for b in steps]


def test_each_step_samples_with_the_version_it_was_handed_over_at_whenever_the_worker_gets_to_it(tiny_model_dir):
    eager = pinned_run(tiny_model_dir, publish_while_generating=True)
    waited = pinned_run(tiny_model_dir, publish_while_generating=False)
    assert [{version for version, _, _ in batch} for batch in eager] == [{0}, {1}]
    assert eager == waited  # a publish during step A's generation changes nothing of what it samples


@pytest.mark.slow  # ~30 s on 2 cores
def test_a_multi_agent_run_trains_every_role_from_the_workers_shared_episodes(tmp_path):
    from rllm_gym.train.grpo import main
    from tests.conftest import REPO

    output_dir = tmp_path / "run"
    summary = main(
        [
            "--config", str(REPO / "train/configs/test_tiny.yaml"), "--output_dir", str(output_dir),
            "--env", "rllm/SolverJudge-v0", "--tasks", "seeds:4", "--agent_args", "{}", "--env_args",
            '{"n_solvers": 2}', "--prompts_per_step", "3", "--max_turns", "3", "--max_steps", "2",
            "--max_staleness", "1",
        ]
    )  # fmt: skip
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]
    assert [record["async/staleness_max"] for record in records] == [0, 1]  # step 2 sampled while step 1 trained
    assert all({"train/reward/role/solver", "train/reward/role/judge"} <= set(record) for record in records)
    # A task's 3 slots (2 solvers, the judge) x 2 generations: 6 rows a step, trained from the same 2 episodes.
    assert all(record["trajectories/total"] == 6 for record in records)
    assert summary["termination_reasons"] == {"env_done": 4}


@pytest.mark.slow  # ~60 s on 2 cores
def test_an_agent_program_runs_through_a_gateway_in_the_worker(tmp_path):
    from rllm_gym.train.grpo import main
    from tests.conftest import REPO

    output_dir = tmp_path / "run"
    program = "rllm_gym.agents.openai_calculator"
    summary = main(
        [
            "--config", str(REPO / "train/configs/test_tiny.yaml"), "--output_dir", str(output_dir),
            "--tasks", "seeds:8", "--agent_program", f"{program}:solve", "--reward_fn", f"{program}:reward",
            "--max_steps", "2", "--max_staleness", "1",
        ]
    )  # fmt: skip
    assert summary["termination_reasons"] == {"env_done": 2 * 2 * 2} and not summary["errors"]
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    # The program's calls through the worker's gateway carry the version that answered them.
    assert [record["async/staleness_max"] for record in records] == [0, 1]
    assert all(record["rollout/turns"] >= 1 and record["async/restarts"] == 0 for record in records)


def test_the_worker_samples_by_the_runs_seed(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [encode_prompt(LAKE, 0)]  # one episode of one turn: one LLM call, whatever the machine's timing

    def first_reply(run_seed: int) -> list[int]:
        worker_settings = dataclasses.replace(settings(tokenizer), run_seed=run_seed)
        rollout = EpisodeRollout([EnvSetup(LAKE)], max_turns=1)
        generator = AsyncGenerator(rollout, model, tokenizer, worker_settings, timeout_s=300)
        try:
            generator.submit(prompts)
            return generator.result(prompts).episodes[0].trajectories[0].steps[0].response_ids
        finally:
            generator.close()

    seed_0 = first_reply(0)
    assert first_reply(0) == seed_0  # a run is reproduced by its seed
    assert first_reply(1) != seed_0  # and another seed samples its own (a spawned worker began at torch's default)


def test_a_worker_whose_rollout_raised_stops_the_next_submit_with_its_traceback_not_a_restart(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    generator = AsyncGenerator(lake_rollout(), model, tokenizer, settings(tokenizer), timeout_s=300)
    try:
        generator.submit([encode_prompt("rllm/Math-v0", 0)])  # an env this rollout was not set up for: collect raises
        generator.process.join(120)  # it answers with the traceback and stops
        assert generator.process.exitcode == 0
        with pytest.raises(GeneratorDied, match=r"the generation worker failed:\n(.|\n)*not set up for"):
            generator.submit([encode_prompt(LAKE, 0)])
        assert generator.restarts == 0
    finally:
        generator.close()


def test_the_worker_runs_as_many_env_calls_at_once_as_its_settings_say(tiny_model_dir, monkeypatch):
    # Each grading waits until barrier_env.PARTIES of them run at once (and the worker's sandbox admits as many): the
    # trainer's own default on 2 cores (4 env calls) would break the barrier and reward 0.
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the spawned worker imports barrier_env too
    monkeypatch.delenv("RLLM_GYM_SANDBOX_MAX_PARALLEL", raising=False)
    barrier = importlib.import_module("barrier_env")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollout = EpisodeRollout([EnvSetup(barrier.ENV_ID, agent=barrier.AGENT)], max_turns=1)
    prompts = [encode_prompt(barrier.ENV_ID, seed) for seed in range(barrier.PARTIES)]
    calls = dataclasses.replace(settings(tokenizer), env_calls=barrier.PARTIES)
    generator = AsyncGenerator(rollout, model, tokenizer, calls, timeout_s=300)
    try:
        generator.submit(prompts)
        assert generator.result(prompts).rewards == [1.0] * barrier.PARTIES
    finally:
        generator.close()
    assert rollout.env_workers is None  # the worker's own copy was set, not the trainer's rollout


def test_worker_settings_refuse_an_env_call_count_out_of_range(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for bad in (0, 257, True, "8"):
        expected = f"WorkerSettings env_calls must be an int in [1, 256], got {bad!r}"
        with pytest.raises(ValueError, match=re.escape(expected)):
            dataclasses.replace(settings(tokenizer), env_calls=bad)


def test_worker_settings_refuse_a_core_count_below_one(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for bad in (0, -2, True, 2.0):
        expected = f"WorkerSettings cores must be None or an int >= 1, got {bad!r}"
        with pytest.raises(ValueError, match=re.escape(expected)):
            dataclasses.replace(settings(tokenizer), cores=bad)


@pytest.mark.parametrize(("cores", "shared"), [(4, 3), (8, 4), (1, 1)])
def test_the_trainer_keeps_beside_its_worker_only_the_threads_its_share_of_the_cores_leaves(
    tiny_model_dir, cores, shared
):
    # Two training processes on 8 cores each get 4 (the trainer's cores=): 4 trainer threads beside a worker's one
    # would put 10 threads on 8 cores.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        generator = AsyncGenerator(lake_rollout(), model, tokenizer, dataclasses.replace(settings(tokenizer),
                                   cores=cores), timeout_s=300)  # fmt: skip
        try:
            assert torch.get_num_threads() == shared  # the worker starts: it counts as running
        finally:
            generator.close()
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(threads)


def test_the_workers_sandbox_runs_no_more_at_once_than_half_the_memory_holds_at_their_limit():
    floor = max(4, 2 * (os.cpu_count() or 1))
    gib = 2**30
    assert sandbox_runs(32, 64 * gib) == 32  # 64 runs' worth of memory: env_calls decides
    assert sandbox_runs(32, 8 * gib) == max(8, floor)  # 8 GiB: 8 runs of 512 MB fill half of it
    assert sandbox_runs(32, 1 * gib) == floor  # never fewer than the sandbox's own default
    assert sandbox_runs(2, 64 * gib) == 2  # nor more than asked
    assert sandbox_runs(32, None) == floor  # memory unknown: the sandbox's default
