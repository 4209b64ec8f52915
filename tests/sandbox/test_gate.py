"""Runs whose output reaches the model never share the CPU or the clock with runs that hold hidden inputs.

The attacks here are the timing channel of issue 43: a run of hidden tests (a "verdict" run) loads the CPU or not by a
hidden bit while a run whose output the model sees (a "visible" run) times itself, or reads the clock after the
verdict run. Whether a bit gets through is statistical and is measured by ``benchmarks/sandbox_channels.py``; these
tests assert what makes it impossible, on observables that do not depend on the machine's speed: the intervals the
runs themselves print (one wall clock for all), and the host gate's own records (one sequence number per admission
and release in the process).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import sys
import threading
import time

import pytest

from rllm_gym.engine import EnvThreadPool
from rllm_gym.envs.code import CodeEnv
from rllm_gym.rewards.code import CodeReward
from rllm_gym.sandbox import ExecutionStatus, Sandbox, _gate, run_python
from rllm_gym.sandbox._gate import GRID_S, RunGate, Ticket, bits_per_run, release_level
from rllm_gym.tools.builtins import PythonTool


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(max_parallel=8) as box:
        yield box


# What a run prints: when it started and ended, by the wall clock every run reads the same (time.time, the vDSO).
_SPAN = "import json, time\nstart = time.time()\n{work}\nprint(json.dumps([start, time.time()]))\n"
_BUSY = "end = time.time() + {s}\nwhile time.time() < end:\n    pass"  # the hidden bit's "1": the CPU is loaded
_SLEEP = "time.sleep({s})"


def _span(result) -> tuple[float, float]:
    assert result.status is ExecutionStatus.OK, result
    return tuple(json.loads(result.stdout.strip().splitlines()[-1]))


def _crossing(a: dict, b: dict) -> bool:
    """Whether two runs were in the gate at the same time (its records' admission and release numbers)."""
    return a["admitted_seq"] < b["released_seq"] and b["admitted_seq"] < a["released_seq"]


def _class_overlaps(records: list[dict]) -> list[tuple[dict, dict]]:
    visible = [r for r in records if r["run_class"] == "visible"]
    others = [r for r in records if r["run_class"] != "visible"]
    return [(v, o) for v in visible for o in others if _crossing(v, o)]


# The attack on the CPU: verdict runs modulate it while visible runs time themselves


def test_a_visible_run_never_runs_while_a_verdict_run_loads_the_cpu(sandbox):
    verdicts = [sandbox.submit(_SPAN.format(work=_BUSY.format(s=0.4)), run_class="verdict") for _ in range(2)]
    visibles = [sandbox.submit(_SPAN.format(work=_SLEEP.format(s=0.2)), run_class="visible") for _ in range(3)]
    more_verdicts = [sandbox.submit(_SPAN.format(work=_BUSY.format(s=0.2)), run_class="verdict") for _ in range(2)]
    verdict_spans = [_span(f.result()) for f in verdicts + more_verdicts]
    visible_spans = [_span(f.result()) for f in visibles]
    for v_start, v_end in visible_spans:  # by the runs' own clocks: no instant when both classes ran
        for d_start, d_end in verdict_spans:
            assert v_end <= d_start or d_end <= v_start, (visible_spans, verdict_spans)
    assert not _class_overlaps(sandbox.schedule[-7:])
    # Runs of one class still run together: all the visible runs started before the first of them ended.
    assert max(start for start, _ in visible_spans) < min(end for _, end in visible_spans)


def test_runs_without_a_class_run_alone(sandbox):
    futures = [sandbox.submit(_SPAN.format(work=_SLEEP.format(s=0.1))) for _ in range(3)]
    futures.append(sandbox.submit(_SPAN.format(work=_SLEEP.format(s=0.1)), run_class="visible"))
    spans = sorted(_span(f.result()) for f in futures)
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans)), spans
    records = sandbox.schedule[-4:]
    assert [r["run_class"] for r in records].count("exclusive") == 3
    assert all(r["level_s"] is not None for r in records if r["run_class"] == "exclusive")  # it may be a verdict
    assert not any(_crossing(a, b) for i, a in enumerate(records) for b in records[i + 1 :])


def test_phases_are_fair_a_waiting_class_is_not_overtaken(sandbox):
    first = sandbox.submit(_SPAN.format(work=_SLEEP.format(s=0.4)), run_class="visible")
    _until(lambda: _gate.GATE.phase == "visible", "the first run's phase began")
    verdict = sandbox.submit(_SPAN.format(work=""), run_class="verdict")
    later = sandbox.submit(_SPAN.format(work=""), run_class="visible")  # arrives while the verdict waits
    for future in (first, verdict, later):
        future.result()
    by_order = {r["id"]: r for r in sandbox.schedule[-3:]}
    first_r, verdict_r, later_r = (by_order[k] for k in sorted(by_order))
    assert first_r["released_seq"] < verdict_r["admitted_seq"] < verdict_r["released_seq"] < later_r["admitted_seq"]


def test_sandboxes_of_one_process_share_the_gate(sandbox):
    with Sandbox(max_parallel=2) as other:
        verdict = other.submit(_SPAN.format(work=_BUSY.format(s=0.3)), run_class="verdict")
        visible = sandbox.submit(_SPAN.format(work=_SLEEP.format(s=0.1)), run_class="visible")
        (d_start, d_end), (v_start, v_end) = _span(verdict.result()), _span(visible.result())
        assert v_end <= d_start or d_end <= v_start
        assert not _crossing(other.schedule[-1], sandbox.schedule[-1])


# The wall clock: a verdict run's duration shows only as its release level


def test_release_levels_double_from_the_grid():
    assert GRID_S == 0.1
    seconds = (0.0, 0.05, GRID_S, 0.11, 0.2, 0.21, 3.0, 3.2, 30.0)
    assert [release_level(s) for s in seconds] == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.2, 0.4, 3.2, 3.2, 51.2])
    assert bits_per_run(5.0) == pytest.approx(2.807, abs=1e-3)  # 0.1, 0.2, ... 6.4 s: seven levels
    assert bits_per_run(0.05) == 0.0


def test_a_verdict_result_waits_for_its_release_level(sandbox):
    quick = sandbox.run("print(1)", run_class="verdict")
    slow = sandbox.run("import time\ntime.sleep(0.3)", run_class="verdict")
    assert quick.ok and slow.ok
    for record in sandbox.schedule[-2:]:
        took = record["finished_at"] - record["admitted_at"]
        assert record["level_s"] == release_level(took)
        assert record["released_at"] >= record["admitted_at"] + record["level_s"]
    visible = sandbox.run("print(2)", run_class="visible")
    assert visible.ok and sandbox.schedule[-1]["level_s"] is None  # what the model sees is not held back


def test_a_later_visible_run_starts_no_earlier_than_the_verdict_runs_release(sandbox):
    verdict = sandbox.submit(_SPAN.format(work=_SLEEP.format(s=0.05)), run_class="verdict")
    visible = sandbox.submit(_SPAN.format(work=""), run_class="visible")
    (_, verdict_end), (visible_start, _) = _span(verdict.result()), _span(visible.result())
    verdict_r, visible_r = sandbox.schedule[-2:]
    assert verdict_r["run_class"] == "verdict" and visible_r["admitted_seq"] > verdict_r["released_seq"]
    assert visible_r["admitted_at"] >= verdict_r["admitted_at"] + verdict_r["level_s"]
    assert visible_start > verdict_end


def test_an_env_call_waiting_for_a_release_level_lends_its_place_in_the_engine_pool(sandbox, monkeypatch, tmp_path):
    """A verdict run's result waits for its level after the run is over: the engine's pool starts the next env call
    meanwhile (one worker: without the loan the second run would be admitted only after the first was released),
    and each result still comes at its own level. A grid of 2 s leaves the second call time to be admitted."""
    monkeypatch.setattr(_gate, "GATE", RunGate(grid_s=2.0, host_folder=str(tmp_path / "gate")))
    pool = EnvThreadPool(max_workers=1, thread_name_prefix="verdicts")

    async def main() -> list:
        calls = [pool.call(sandbox.run, f"print({i})", run_class="verdict") for i in range(2)]
        return await asyncio.gather(*calls)

    try:
        results = asyncio.run(main())
    finally:
        pool.shutdown()
    assert [r.stdout for r in results] == ["0\n", "1\n"] and pool.lending == 0
    first, second = sandbox.schedule[-2:]
    assert second["admitted_seq"] < first["released_seq"]  # admitted while the first result was held
    for record in (first, second):
        assert record["level_s"] == 2.0 and record["released_at"] >= record["admitted_at"] + 2.0


def test_a_held_verdict_result_is_no_longer_in_flight(sandbox, monkeypatch, tmp_path):
    """``in_flight`` (what backpressure bounds) counts runs waiting for their turn or running, not a result held for
    its release level; the future is still not done then."""
    monkeypatch.setattr(_gate, "GATE", RunGate(grid_s=2.0, host_folder=str(tmp_path / "gate")))
    future = sandbox.submit("print(1)", run_class="verdict")
    assert sandbox.in_flight == 1
    assert future.ended.wait(30)
    assert sandbox.in_flight == 0 and not future.done()
    assert future.result(timeout=30).stdout == "1\n" and sandbox.schedule[-1]["level_s"] == 2.0


@pytest.mark.parametrize("run_class", ["verdict", "visible"])
def test_an_env_call_lends_its_place_from_submission_only_for_a_held_result(sandbox, run_class):
    """A verdict run's env call lends its place in the engine's pool from its submission (a moment of its own, not the
    run's end, which its hidden input decides): the next call of a one-worker pool starts while the run still runs. A
    visible run's call keeps its place: the next call starts after the run ended."""
    pool = EnvThreadPool(max_workers=1, thread_name_prefix="running")
    started: list[float] = []

    async def main() -> None:
        running = pool.call(sandbox.run, "import time\ntime.sleep(2)", run_class=run_class)
        await asyncio.gather(running, pool.call(lambda: started.append(time.monotonic())))

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    finished_at = sandbox.schedule[-1]["finished_at"]
    assert started[0] < finished_at if run_class == "verdict" else started[0] >= finished_at


# The gate alone: phases, fairness, exclusive runs, and the phases of several processes


def _until(predicate, what: str) -> None:
    """Wait for the gate's threads to do what they must (a bound on a hang, not a timing assertion)."""
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _ticket(gate: RunGate, run_class: str, started: list[str], name: str) -> Ticket:
    ticket = Ticket(run_class, lambda: started.append(name))
    gate.enter(ticket)
    return ticket


def _finish(gate: RunGate, ticket: Ticket) -> None:
    done = threading.Event()
    gate.finish(ticket, done.set)
    assert done.wait(10)


def test_gate_phases_alternate_in_arrival_order(tmp_path):
    gate, started = RunGate(grid_s=0.01, host_folder=str(tmp_path)), []
    v1 = _ticket(gate, "visible", started, "v1")
    _until(lambda: started == ["v1"], started)
    v2 = _ticket(gate, "visible", started, "v2")  # joins the phase in progress: nothing waits
    assert started == ["v1", "v2"]
    d1 = _ticket(gate, "verdict", started, "d1")
    v3 = _ticket(gate, "visible", started, "v3")  # a verdict waits: the visible phase takes no one new
    d2 = _ticket(gate, "verdict", started, "d2")
    _finish(gate, v1)
    time.sleep(0.05)
    assert started == ["v1", "v2"]
    _finish(gate, v2)
    _until(lambda: started == ["v1", "v2", "d1", "d2"], started)  # every waiting verdict starts together
    _finish(gate, d1)
    _finish(gate, d2)
    _until(lambda: started == ["v1", "v2", "d1", "d2", "v3"], started)
    _finish(gate, v3)
    assert [r["run_class"] for r in gate.history] == ["visible", "visible", "verdict", "verdict", "visible"]
    assert gate.host is not None


def test_gate_runs_exclusive_tickets_one_at_a_time(tmp_path):
    gate, started = RunGate(grid_s=0.01, host_folder=str(tmp_path)), []
    e1 = _ticket(gate, "exclusive", started, "e1")
    e2 = _ticket(gate, "exclusive", started, "e2")
    _ticket(gate, "visible", started, "v")
    _until(lambda: started == ["e1"], started)
    _finish(gate, e1)
    _until(lambda: started == ["e1", "e2"], started)
    _finish(gate, e2)
    _until(lambda: started == ["e1", "e2", "v"], started)


def test_gates_sharing_a_host_folder_take_turns(tmp_path):
    """Two gates on one folder are two processes' gates: flock locks of two open files conflict in one process too."""
    first, second, started = RunGate(grid_s=0.01, host_folder=str(tmp_path)), RunGate(host_folder=str(tmp_path)), []
    second.grid_s = 0.01
    v1 = _ticket(first, "visible", started, "first/v1")
    _until(lambda: started == ["first/v1"], started)
    d1 = _ticket(second, "verdict", started, "second/d1")  # waits for the other gate's visible phase to end
    _until(lambda: first.host.contended(), "the waiting gate holds the turnstile")
    v2 = _ticket(first, "visible", started, "first/v2")  # another process waits: no new member
    time.sleep(0.05)
    assert started == ["first/v1"]
    _finish(first, v1)
    _until(lambda: started == ["first/v1", "second/d1"], started)
    time.sleep(0.05)
    assert started == ["first/v1", "second/d1"]  # the verdict phase of the other gate is in progress
    _finish(second, d1)
    _until(lambda: started == ["first/v1", "second/d1", "first/v2"], started)
    _finish(first, v2)


_OTHER_PROCESS = """
import json, sys
from rllm_gym.sandbox import Sandbox
program = sys.argv[1]
with Sandbox(max_parallel=2) as box:
    box.run("pass", run_class="verdict")
    print("ready", flush=True)
    futures = [box.submit(program, run_class="verdict") for _ in range(4)]
    print(json.dumps([f.result().stdout for f in futures]), flush=True)
"""


def test_a_visible_run_never_runs_beside_another_process_verdict_run(sandbox):
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROCESS, _SPAN.format(work=_BUSY.format(s=0.3))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "ready"
        visible = [_span(sandbox.run(_SPAN.format(work=_SLEEP.format(s=0.05)), run_class="visible")) for _ in range(8)]
        verdict = [tuple(json.loads(out)) for out in json.loads(other.stdout.readline())]
    finally:
        other.kill()
        other.wait()
    for v_start, v_end in visible:
        for d_start, d_end in verdict:
            assert v_end <= d_start or d_end <= v_start, (visible, verdict)


def test_run_class_is_checked_by_name():
    message = "sandbox run_class must be 'visible' (the output may reach the model), 'verdict'"
    with pytest.raises(ValueError, match=re.escape(message)):
        run_python("pass", sandbox=Sandbox(max_parallel=1), run_class="hidden")
    with pytest.raises(ValueError, match="got 1"):
        Sandbox(max_parallel=1).submit("pass", run_class=1)
    with pytest.raises(ValueError, match="CodeReward hidden_run_class must be 'verdict' or 'visible'"):
        CodeReward(hidden_run_class="exclusive")


def test_a_zygote_death_fails_the_runs_waiting_for_their_turn_and_the_gate_goes_on():
    with Sandbox(max_parallel=2) as box:
        running = box.submit("import time\ntime.sleep(10)", timeout=20, run_class="visible")
        waiting = [box.submit("print(1)", run_class="verdict") for _ in range(2)]
        time.sleep(0.5)
        box._proc.kill()  # our own child, started by this Sandbox
        results = [running.result(timeout=30), *(f.result(timeout=30) for f in waiting)]
        assert all(r.status is ExecutionStatus.SANDBOX_ERROR and "zygote exited" in r.error for r in results)
        assert box.run("print(2)", run_class="visible").stdout == "2\n"
        assert box.in_flight == 0


# The callers say which class a run is


_TASK = {
    "id": "hidden-bit",
    "prompt": "Return x.",
    "fn_name": "f",
    "tests": {"inputs": [[0], [1], [0], [1]], "outputs": [0, 1, 0, 1]},
    "public_tests": 1,
}


def test_code_reward_runs_public_tests_as_visible_and_hidden_ones_as_verdict(sandbox):
    reply = "```python\ndef f(x):\n    return x\n```"
    assert CodeReward(sandbox=sandbox)(_TASK, reply).reward == 1.0
    assert [r["run_class"] for r in sandbox.schedule[-2:]] == ["visible", "verdict"]
    stdio = {"id": "io", "prompt": "Echo.", "tests": {"inputs": ["1\n", "2\n"], "outputs": ["1", "2"]}}
    stdio["public_tests"] = 1
    assert CodeReward(sandbox=sandbox, fraction=True)(stdio, "```python\nprint(input())\n```").reward == 1.0
    assert sorted(r["run_class"] for r in sandbox.schedule[-2:]) == ["verdict", "visible"]
    CodeEnv(tasks=[_TASK], sandbox=sandbox, feedback="full").grader(_TASK, reply)
    assert [r["run_class"] for r in sandbox.schedule[-2:]] == ["visible", "visible"]  # "full" shows hidden tests


def test_the_python_tool_runs_visible():
    tool = PythonTool(timeout=5)
    assert tool.forward("print(3)").output == "3"
    from rllm_gym.sandbox import default_sandbox

    assert default_sandbox().schedule[-1]["run_class"] == "visible"


# A GRPO group: episodes of one task, side by side, each with a revision


# The solution's hidden-test calls burn the CPU when the hidden input is 1; its public run times itself and prints
# it, which revision feedback quotes (the public test passes, the first hidden one fails). Under the gate the two
# never overlap, whatever the episodes' interleaving.
_ATTACK = """```python
import time
def f(x):
    if x:
        end = time.time() + 0.15
        while time.time() < end:
            pass
    t = time.perf_counter()
    for _ in range(20000):
        pass
    print(time.time(), time.perf_counter() - t)
    return 0
```"""


def test_concurrent_episodes_public_runs_never_overlap_hidden_runs(sandbox):
    errors: list[BaseException] = []

    def episode(seed: int) -> None:
        try:
            env = CodeEnv(tasks=[_TASK], sandbox=sandbox, max_revisions=1)
            env.reset(seed=seed)
            for _ in range(2):
                *_, done, _truncated, info = env.step(_ATTACK)
                assert info["graded"], info
                if done:
                    break
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=episode, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    records = sandbox.schedule[-16:]  # 4 episodes x 2 replies x (public run, hidden run: stopped at its first)
    assert sorted(r["run_class"] for r in records).count("visible") == 8
    assert not _class_overlaps(records)
