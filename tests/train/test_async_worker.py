import dataclasses
import importlib
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm_gym.train.async_generation import AsyncGenerator, GeneratorDied, WorkerSettings
from rllm_gym.train.async_worker import Turns
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, encode_prompt
from tests.train.test_async_generation import settings


@pytest.fixture
def gate(monkeypatch):
    """tests/train/gate_env.py, importable by the spawned worker too."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return importlib.import_module("gate_env")


def gate_generator(gate, tiny_model_dir, rollouts: int) -> AsyncGenerator:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollout = EpisodeRollout([EnvSetup(gate.ENV_ID, agent=gate.AGENT)], max_turns=1)
    worker_settings = dataclasses.replace(settings(tokenizer), rollouts=rollouts)
    return AsyncGenerator(rollout, model, tokenizer, worker_settings, timeout_s=300)


def two_steps(gate, folder: Path) -> list[list[str]]:
    """Two steps' prompts, two episodes each (the same question: only the call tells them apart)."""
    return [[encode_prompt(gate.ENV_ID, gate.gate_task(folder, f"{step}{i}")) for i in range(2)] for step in "ab"]


def wait_until(condition, what: str, within_s: float = 120.0) -> None:
    """A bound on a wait that a broken worker would make endless (not a timing assertion)."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def seeds_and_replies(folder: Path, batches) -> tuple[dict[str, str], list[list[list[int]]]]:
    """The reset seed each task's env got, and each step's sampled reply ids."""
    seeds = {name: (folder / name).read_text() for step in "ab" for name in (f"{step}0", f"{step}1")}
    replies = [[e.trajectories[0].steps[0].response_ids for e in batch.episodes] for batch in batches]
    return seeds, replies


def test_two_steps_rollouts_run_at_once_answer_in_order_with_the_ids_seeds_and_samples_of_one_at_a_time(
    gate, tiny_model_dir, tmp_path
):
    steps = two_steps(gate, tmp_path)
    (tmp_path / gate.OPEN).touch()  # one step at a time first, the gate open
    sequential = gate_generator(gate, tiny_model_dir, rollouts=1)
    try:
        for prompts in steps:
            sequential.submit(prompts)
        expected = [sequential.result(prompts) for prompts in steps]
    finally:
        sequential.close()
    expected_seeds, expected_replies = seeds_and_replies(tmp_path, expected)
    for path in tmp_path.iterdir():
        path.unlink()

    generator = gate_generator(gate, tiny_model_dir, rollouts=2)
    try:
        for prompts in steps:
            generator.submit(prompts)
        # Step b's env calls start while step a's are held at the closed gate: both rollouts are in flight.
        wait_until(lambda: gate.started(tmp_path, ["a0", "a1", "b0", "b1"]), "step b did not start beside step a")
        (tmp_path / gate.OPEN).touch()
        batches = [generator.result(prompts) for prompts in steps]
    finally:
        generator.close()
    assert [[e.id for e in batch.episodes] for batch in batches] == [
        ["a0:p0s0e0", "a1:p0s0e1"],
        ["b0:p0s1e0", "b1:p0s1e1"],
    ]
    assert [e.id for batch in expected for e in batch.episodes] == [e.id for b in batches for e in b.episodes]
    assert all(batch.rewards == [1.0, 1.0] for batch in batches)
    seeds, replies = seeds_and_replies(tmp_path, batches)
    assert seeds == expected_seeds and len(set(seeds.values())) == 4
    # Each call samples from a stream of its own: the same as one at a time, and not the other call's.
    assert replies == expected_replies and replies[0] != replies[1]


def test_a_worker_killed_with_two_rollouts_in_flight_is_restarted_and_answers_both_in_order(
    gate, tiny_model_dir, tmp_path
):
    steps = two_steps(gate, tmp_path)
    generator = gate_generator(gate, tiny_model_dir, rollouts=2)
    try:
        first = generator.process
        for prompts in steps:
            generator.submit(prompts)
        wait_until(lambda: gate.started(tmp_path, ["a0", "a1", "b0", "b1"]), "the two rollouts did not start")
        os.kill(first.pid, signal.SIGKILL)
        first.join(30)
        (tmp_path / gate.OPEN).touch()
        batches = [generator.result(prompts) for prompts in steps]
        assert generator.restarts == 1 and generator.process is not first
    finally:
        generator.close()
    assert [[e.id for e in batch.episodes] for batch in batches] == [
        ["a0:p0s0e0", "a1:p0s0e1"],
        ["b0:p0s1e0", "b1:p0s1e1"],
    ]
    assert all(batch.rewards == [1.0, 1.0] for batch in batches)


def test_a_rollout_that_raises_beside_one_in_flight_stops_the_run_with_its_traceback_at_once(
    gate, tiny_model_dir, tmp_path
):
    held = two_steps(gate, tmp_path)[0]
    generator = gate_generator(gate, tiny_model_dir, rollouts=2)
    try:
        generator.submit(held)
        wait_until(lambda: gate.started(tmp_path, ["a0", "a1"]), "the first rollout did not start")
        generator.submit([encode_prompt("rllm/Math-v0", 0)])  # an env the rollout was not set up for: it raises
        # The held step never finishes (the gate stays closed): the failure is answered without waiting for it.
        with pytest.raises(GeneratorDied, match=r"the generation worker failed:\n(.|\n)*not set up for"):
            generator.result(held)
        generator.process.join(60)
        assert generator.process.exitcode == 0 and generator.restarts == 0
    finally:
        generator.close()


def test_ctrl_c_leaves_the_worker_running_and_close_stops_it_with_two_rollouts_held(gate, tiny_model_dir, tmp_path):
    generator = gate_generator(gate, tiny_model_dir, rollouts=2)
    try:
        for prompts in two_steps(gate, tmp_path):
            generator.submit(prompts)
        wait_until(lambda: gate.started(tmp_path, ["a0", "a1", "b0", "b1"]), "the two rollouts did not start")
        os.kill(generator.process.pid, signal.SIGINT)  # the trainer's to handle
        generator.process.join(1.0)
        assert generator.process.is_alive()
    finally:
        generator.close()
    assert generator.process.exitcode == 0  # it stopped when asked, not terminated, its env calls still held


def test_the_trainer_gives_up_the_workers_threads_while_it_runs_a_step_and_takes_them_back_while_it_waits(
    gate, tiny_model_dir, tmp_path
):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the trainer has no thread to give up")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer_gives_up_threads(gate, tiny_model_dir, tmp_path)
    finally:
        torch.set_num_threads(threads)


def trainer_gives_up_threads(gate, tiny_model_dir, tmp_path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollout = EpisodeRollout([EnvSetup(gate.ENV_ID, agent=gate.AGENT)], max_turns=1)
    seen: list[int] = []  # the trainer's torch threads at each module's forward and backward

    def backward(_):
        seen.append(torch.get_num_threads())

    def forward(_module, _args, output):
        seen.append(torch.get_num_threads())
        output.register_hook(backward)

    def train_once() -> set[int]:
        seen.clear()
        model(torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()
        return set(seen)

    generator = AsyncGenerator(rollout, model, tokenizer, settings(tokenizer), timeout_s=300)
    hook = model.lm_head.register_forward_hook(forward)  # after the generator's: sees what they set
    try:
        wait_until(lambda: generator.running == 0, "the worker did not start")
        assert train_once() == {2}  # the worker waits for a step: every thread is the trainer's
        prompts = two_steps(gate, tmp_path)[0]
        generator.submit(prompts)
        wait_until(lambda: gate.started(tmp_path, ["a0", "a1"]), "the step did not start")
        assert generator.running == 1
        assert train_once() == {1}  # one thread is the worker's, forward and backward
        (tmp_path / gate.OPEN).touch()
        generator.result(prompts)
        wait_until(lambda: generator.running == 0, "the worker did not count its step done")
        assert train_once() == {2}
    finally:
        generator.close()
        hook.remove()
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    train_once()
    assert torch.get_num_threads() == 1  # the generator's hooks are gone: nothing sets them any more


def test_turns_go_one_at_a_time_to_the_lowest_priority_waiting():
    turns, order = Turns(), []

    def take(priority: int) -> None:
        with turns.turn(priority):
            order.append(priority)

    with turns.turn(5):
        threads = [threading.Thread(target=take, args=(priority,)) for priority in (3, 1, 2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: turns.waiting == 3, "the three did not queue for a turn")
        assert order == []  # none while a turn is taken
    for thread in threads:
        thread.join(30)
    assert order == [1, 2, 3] and turns.waiting == 0


def test_after_a_batch_its_call_keeps_the_turn_against_younger_calls_until_it_is_done():
    turns, order = Turns(hold_s=600.0), []
    with turns.turn(1):
        order.append("1a")

    def younger() -> None:
        with turns.turn(2):
            order.append("2")

    thread = threading.Thread(target=younger)
    thread.start()
    wait_until(lambda: turns.waiting == 1, "the younger call did not queue for a turn")
    with turns.turn(1):  # the older call's next batch (its episodes were in their envs) goes first
        order.append("1b")
    assert order == ["1a", "1b"] and turns.waiting == 1
    turns.done(1)  # its rollout ended
    thread.join(30)
    assert order == ["1a", "1b", "2"]


def test_worker_settings_refuse_a_rollout_count_below_one(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=re.escape(f"WorkerSettings rollouts must be an int >= 1, got {bad!r}")):
            dataclasses.replace(settings(tokenizer), rollouts=bad)
    assert WorkerSettings.__dataclass_fields__["rollouts"].default == 1  # one at a time unless asked
