"""rllm/ReasoningGym-v0 under attack: answers that try to run code on the host, hang it, or farm the reward.

Each attack here passed on the code before the sandboxed scoring (the answer ran as Python in the test process, or a
constant answer was paid): a file appeared, the host's reward code was replaced, the step hung, or the reward was
1.0. Honest answers next to them still score 1.0.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import pytest

import rllm_gym  # noqa: F401 - registers the envs

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason='reasoning-gym is an optional extra: pip install -e ".[reasoning-gym]"'
)

from rllm_gym.envs import reasoning_gym as rg_env  # noqa: E402
from rllm_gym.rewards import math as math_rewards  # noqa: E402
from rllm_gym.rewards import reasoning_gym as scoring  # noqa: E402
from rllm_gym.rewards.reasoning_gym_checks import UNSOUND_DATASETS, oracle_problem, wrapper_check  # noqa: E402
from rllm_gym.sandbox import ExecutionStatus, SandboxResult  # noqa: E402

ENV_ID = "rllm/ReasoningGym-v0"
ALL_DATASETS = sorted(set(reasoning_gym.factory.DATASETS) - {"composite"})


@pytest.fixture(scope="module", autouse=True)
def _strict_scoring_sandbox():
    try:
        scoring.scoring_sandbox()
    except RuntimeError as exc:
        pytest.skip(f"the strict sandbox refuses this machine: {exc}")


def _payloads(marker: str) -> list[str]:
    """Answers that, evaluated as Python, would write files, set a variable and replace the host's reward code."""
    return [
        f"__import__('os').system('touch {marker}-system')",
        f"open('{marker}-open', 'w').write('pwned')",
        "__import__('os').environ.__setitem__('RLLM_P36_PWNED', '1')",
        "setattr(__import__('rllm_gym.rewards.math').rewards.math, 'math_reward_fn', lambda *a: 1.0)",
        f"[__import__('os').system('touch {marker}-list'), 1]",
    ]


def _host_untouched(marker: str, reward_fn_before: object) -> None:
    leftovers = [p for p in os.listdir(os.path.dirname(marker)) if p.startswith(os.path.basename(marker))]
    assert leftovers == []
    assert "RLLM_P36_PWNED" not in os.environ
    assert math_rewards.math_reward_fn is reward_fn_before


def _scorer_and_task(name: str) -> tuple[rg_env.ReasoningGymScorer, dict]:
    dataset = reasoning_gym.create_dataset(name, size=1, seed=0)
    entry = dataset[0]
    task = {
        "question": entry["question"],
        "ground_truth": entry["answer"],
        "dataset": name,
        "metadata": entry["metadata"],
    }
    return rg_env.ReasoningGymScorer({name: dataset.score_answer}, configs={name: {}}), task


def test_no_answer_reaches_the_host_from_any_dataset(tmp_path):
    """Every dataset the env offers (allow-listed string scorers in process, the rest in the sandbox) gets the same
    code-shaped answers: none runs on the host and none is paid."""
    marker = str(tmp_path / "pwned")
    before = math_rewards.math_reward_fn
    for name in ALL_DATASETS:
        scorer, task = _scorer_and_task(name)
        for payload in _payloads(marker)[::2] if name not in scoring.EVAL_LITERAL_DATASETS else _payloads(marker):
            output = scorer(task, f"\\boxed{{{payload}}}")
            if name not in UNSOUND_DATASETS:  # refused by default: their scorer pays anything
                assert output.reward == 0.0, (name, payload, output.metadata)
    _host_untouched(marker, before)


@pytest.mark.parametrize("name", sorted(scoring.EVAL_LITERAL_DATASETS | scoring.EVAL_SYMPY_DATASETS))
def test_code_that_gets_past_the_answer_check_still_cannot_reach_the_host(name, tmp_path, monkeypatch):
    """With the host's answer check switched off, the scorers that eval the answer do run it: in the sandbox, where
    the host's files, environment and rllm-gym do not exist."""
    monkeypatch.setattr(rg_env, "unsafe_answer_reason", lambda dataset, answer: None)
    marker = str(tmp_path / "pwned")
    before = math_rewards.math_reward_fn
    scorer, task = _scorer_and_task(name)
    for payload in _payloads(marker):
        output = scorer(task, f"\\boxed{{{payload}}}")
        assert output.reward == 0.0 and not output.is_correct, (payload, output.metadata)
    _host_untouched(marker, before)
    assert scorer(task, f"\\boxed{{{task['ground_truth']}}}").reward == 1.0


@pytest.mark.parametrize("name", sorted(scoring.EVAL_LITERAL_DATASETS | scoring.EVAL_SYMPY_DATASETS))
def test_answers_that_would_run_as_code_are_refused_before_scoring(name):
    env = gym.make(ENV_ID, dataset=name, size=3, seed=0)
    _, info = env.reset(seed=0)
    assert env.step(f"\\boxed{{{info['task']['ground_truth']}}}")[1] == 1.0  # the honest answer
    for payload in ["__import__('os').getcwd()", "getattr(x, 'y')", "eval(chr(49))", "(lambda: 1)()", "x.y"]:
        env.reset(seed=0)
        _, reward, _, _, step = env.step(f"\\boxed{{{payload}}}")
        assert (reward, step["grading_path"]) == (0.0, "unsafe_answer"), payload
        assert step["grading_error"]


@pytest.mark.parametrize(
    ("dataset", "answer"),
    [
        ("polynomial_multiplication", "3*x**2 - 4*x + 1"),
        ("simple_integration", "x**3/3 + sin(x) - 2*exp(x) + C"),
        ("countdown", "(8 - 4) * (3 + 3)"),
        ("puzzle24", "8/(3-8/3)"),
        ("spiral_matrix", "[1, 2, 3, -4]"),
        ("string_insertion", "['a', 'b']"),
        ("n_queens", "1 2 3\n4 5 6"),  # not Python at all: eval raises before running anything
    ],
)
def test_plain_data_answers_pass_the_check(dataset, answer):
    assert scoring.unsafe_answer_reason(dataset, answer) is None


def test_a_hanging_scorer_is_a_timeout_verdict_and_the_env_goes_on():
    env = gym.make(ENV_ID, dataset="puzzle24", size=3, seed=0)
    _, info = env.reset(seed=0)
    start = time.monotonic()
    _, reward, terminated, _, step = env.step("\\boxed{9**9**9**9}")  # sympy computes the integer: forever
    assert time.monotonic() - start < scoring.SCORE_TIMEOUT_S + 5
    assert (reward, terminated, step["grading_path"], step["is_correct"]) == (0.0, True, "timeout", False)
    env.reset(seed=0)
    assert env.step(f"\\boxed{{{info['task']['ground_truth']}}}")[1] == 1.0


def test_reasoning_gym_is_preloaded_in_the_scoring_sandbox_and_the_project_is_not_there():
    code = (
        "import sys\nprint('reasoning_gym' in sys.modules)\n"
        "try:\n    import rllm_gym\n    print('project visible')\nexcept ImportError:\n    print('project hidden')\n"
    )
    result = scoring.scoring_sandbox().run(code, timeout=10, memory_mb=scoring.SCORE_MEMORY_MB)
    assert result.ok and result.stdout.split() == ["True", "project", "hidden"]
    assert "seccomp" in result.isolation and "minimal_fs" in result.isolation


@pytest.mark.parametrize(
    ("stdout", "path"),
    [
        ('{"score": 1.0}', "score_answer"),
        ('{"score": NaN}', "invalid_score"),
        ('{"score": Infinity}', "invalid_score"),
        ('{"score": 2}', "invalid_score"),
        ('{"score": -0.5}', "invalid_score"),
        ('{"score": true}', "invalid_score"),
        ('{"score": "1.0"}', "invalid_score"),
        ('{"score": 1.0, "also": 1}', "invalid_score"),
        ('{"score": 1.0}{"score": 1.0}', "invalid_score"),
        ("", "invalid_score"),
    ],
)
def test_only_a_finite_number_in_0_1_comes_back_as_a_score(stdout, path):
    verdict = scoring.verdict_of(SandboxResult(ExecutionStatus.OK, stdout=stdout, exit_code=0))
    assert verdict.path == path
    assert (verdict.score is not None) == (path == "score_answer")


@pytest.mark.parametrize(
    ("status", "path"),
    [
        (ExecutionStatus.TIMEOUT, "timeout"),
        (ExecutionStatus.MEMORY_LIMIT, "memory_limit"),
        (ExecutionStatus.RUNTIME_ERROR, "scorer_error"),
        (ExecutionStatus.KILLED, "scorer_error"),
        (ExecutionStatus.OUTPUT_LIMIT, "scorer_error"),
        (ExecutionStatus.SANDBOX_ERROR, "sandbox_error"),
    ],
)
def test_a_failed_scoring_run_is_a_verdict_of_its_own(status, path):
    verdict = scoring.verdict_of(SandboxResult(status, stdout='{"score": 1.0}', stderr="Boom: x"))
    assert (verdict.path, verdict.score) == (path, None)


def test_an_in_process_scorer_is_the_base_string_scorer_or_it_moves_to_the_sandbox(monkeypatch):
    from reasoning_gym.dataset import ProceduralDataset

    for name in scoring.IN_PROCESS_DATASETS:
        dataset = reasoning_gym.create_dataset(name, size=1, seed=0)
        assert type(dataset).score_answer is ProceduralDataset.score_answer, name
        assert scoring.runs_in_process(name, dataset.score_answer)
    dataset = reasoning_gym.create_dataset("gcd", size=1, seed=0)
    monkeypatch.setattr(type(dataset), "score_answer", lambda self, answer, entry: 1.0)
    assert not scoring.runs_in_process("gcd", dataset.score_answer)  # an override is not audited: sandboxed
    assert not scoring.runs_in_process("chain_sum", reasoning_gym.create_dataset("chain_sum", size=1).score_answer)
    assert not scoring.runs_in_process("not_a_dataset", None)


@pytest.mark.parametrize(
    ("answer", "rejected"),
    [
        ("24 + 0x0", True),  # hex: the regex sees four numbers
        ("0x18", True),
        ("(1 + 2) * 8 + 1/2", True),  # 24.5 truncated to 24 by the scorer
        ("24*1*1*1", True),  # numbers that are not the puzzle's
    ],
)
def test_puzzle24_pays_only_the_puzzles_numbers_making_exactly_24(answer, rejected):
    entry = {"question": "", "answer": "", "metadata": {"numbers": [1, 2, 8, 1]}}
    verdict = scoring.Verdict("score_answer", 1.0)  # what the dataset's own scorer says for these
    checked = wrapper_check("puzzle24", answer, entry, verdict)
    assert (checked.path == "rejected_by_check") is rejected
    honest = wrapper_check("puzzle24", "(1 + 2) * 8 * 1", entry, verdict)
    assert honest == verdict


def test_puzzle24_pays_nothing_for_24_made_of_other_numbers_end_to_end():
    env = gym.make(ENV_ID, dataset="puzzle24", size=3, seed=0)
    _, info = env.reset(seed=0)
    numbers = sorted(info["task"]["metadata"]["numbers"])
    trick = "6*4*1*1" if numbers != [1, 1, 4, 6] else "8*3*1*1"  # four numbers in range: the old scorer paid 1.0
    _, reward, _, _, step = env.step(f"\\boxed{{{trick}}}")
    assert (reward, step["grading_path"]) == (0.0, "rejected_by_check")
    env.reset(seed=0)
    assert env.step(f"\\boxed{{{info['task']['ground_truth']}}}")[1] == 1.0


@pytest.mark.parametrize(("dataset", "answer"), [("coin_flip", "1e9"), ("complex_arithmetic", "nan")])
def test_scorer_bugs_that_paid_constants_are_closed(dataset, answer):
    env = gym.make(ENV_ID, dataset=dataset, size=6, seed=0)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        _, reward, _, _, step = env.step(f"\\boxed{{{answer}}}")
        assert reward == 0.0, step
        env.reset(seed=seed)
        assert env.step(f"\\boxed{{{info['task']['ground_truth']}}}")[1] == 1.0


def test_game_of_life_halting_is_refused_unless_opted_in():
    with pytest.raises(ValueError, match="never reads the answer"):
        gym.make(ENV_ID, dataset="game_of_life_halting", size=2)
    env = gym.make(ENV_ID, dataset="game_of_life_halting", size=2, allow_unsound=True)
    env.reset(seed=0)
    assert env.step("\\boxed{anything}")[1] == 1.0  # what the opt-in accepts: the scorer pays anything


def test_multi_turn_returns_never_exceed_answering_correctly_at_once():
    """Hedging for partial credit over turns used to add up past 1.0; now a step pays only an improvement."""
    env = gym.make(ENV_ID, dataset="countdown", size=4, seed=0, max_turns=4, reward="partial")
    _, info = env.reset(seed=0)
    gold = info["task"]["ground_truth"]
    rewards = []
    for reply in ["\\boxed{1 + 1}", "\\boxed{2 + 2}", "\\boxed{3 + 3}", "\\boxed{4 + 4}"]:
        observation, reward, terminated, _, _ = env.step(reply)
        rewards.append(reward)
        assert "score" not in observation and "0.05" not in observation
    assert terminated and sum(rewards) == pytest.approx(0.05)  # the best partial score, once
    env.reset(seed=0)
    wrong_then_right = [env.step("\\boxed{1 + 1}")[1], env.step(f"\\boxed{{{gold}}}")[1]]
    assert sum(wrong_then_right) == pytest.approx(1.0)
    env = gym.make(ENV_ID, dataset="countdown", size=4, seed=0, max_turns=4)  # binary
    env.reset(seed=0)
    assert sum(env.step(f"\\boxed{{{n} + {n}}}")[1] for n in range(4)) == 0.0


@pytest.mark.parametrize("dataset", ["simple_integration", "intermediate_integration"])
def test_an_answer_that_asks_the_scorer_to_do_the_task_pays_nothing(dataset):
    """The scorer differentiates the answer: ``Integral(f, x)`` restates the question and was paid 1.0."""
    env = gym.make(ENV_ID, dataset=dataset, size=40, seed=0)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        task = info["task"]
        assert "Integral" not in task["ground_truth"]  # a task whose oracle restates it is not posed
        variable, integrand = task["metadata"]["variable"], task["metadata"]["integrand"]
        for restated in (
            f"Integral({integrand}, {variable}) + C",
            f"Derivative(Integral({integrand}, {variable}), {variable}, 0) + C",
            f"integrate({integrand}, {variable}) + C",
            f"Sum({integrand}, ({variable}, 0, 0))",
        ):
            env.reset(seed=seed)
            _, reward, _, _, step = env.step(f"\\boxed{{{restated}}}")
            assert (reward, step["grading_path"]) == (0.0, "unsafe_answer"), (restated, step)
        env.reset(seed=seed)
        assert env.step(f"\\boxed{{{task['ground_truth']}}}")[1] == 1.0


@pytest.mark.parametrize(
    ("dataset", "answer"),
    [
        ("countdown", "solve(x - 24, x)"),
        ("puzzle24", "limit(24 + x, x, 0)"),
        ("puzzle24", "x"),
        ("polynomial_multiplication", "expand((x + 1)*(x - 1))"),
        ("polynomial_multiplication", "sqrt(x**2)"),
        ("simple_integration", "Integral(x, x)"),
        ("intermediate_integration", "Derivative(x**3, x)"),
    ],
)
def test_only_the_forms_a_datasets_answers_take_are_admitted(dataset, answer):
    assert scoring.unsafe_answer_reason(dataset, answer) is not None


def test_propositional_logic_is_refused_unless_opted_in_its_scorer_pays_the_premises():
    with pytest.raises(ValueError, match="the premises themselves, one of them or all joined with ∧"):
        gym.make(ENV_ID, dataset="propositional_logic", size=2)
    env = gym.make(ENV_ID, dataset="propositional_logic", size=4, allow_unsound=True)
    for seed in range(2):
        _, info = env.reset(seed=seed)
        premises = info["task"]["metadata"]["premises"]
        joined = " ∧ ".join(f"({premise})" for premise in premises)
        assert env.step(f"\\boxed{{{joined}}}")[1] == 1.0  # what the opt-in accepts: a restatement


def test_polynomial_equations_pays_only_every_real_root():
    """The oracle of ``-7*n**4 + 97*n**2 - 31*n = 0`` is ``0.0`` (sympy.solve missed three real roots), so the
    dataset paid ``0``: the wrapper checks every real root, and tasks with such an oracle are not posed."""
    metadata = {"polynomial_expr": "-7*n**4 + 97*n**2 - 31*n", "variable": "n"}
    entry = {"question": "Solve -7*n**4 + 97*n**2 - 31*n = 0", "answer": "0.0", "metadata": metadata}
    paid = scoring.Verdict("score_answer", 1.0)
    assert wrapper_check("polynomial_equations", "0", entry, paid).path == "rejected_by_check"
    assert oracle_problem("polynomial_equations", entry) == "the equation has 4 real solution(s), the answer gives 1"
    full = "-3.8731, 0.0, 0.322, 3.5511"
    assert wrapper_check("polynomial_equations", full, entry, paid) == paid
    assert wrapper_check("polynomial_equations", "-3.8731, 0.0, 0.322, x", entry, paid).path == "rejected_by_check"
    env = gym.make(ENV_ID, dataset="polynomial_equations", size=30, seed=0, config={"min_degree": 4, "max_degree": 4})
    for seed in range(6):
        _, info = env.reset(seed=seed)
        task = info["task"]
        assert (
            oracle_problem("polynomial_equations", {"answer": task["ground_truth"], "metadata": task["metadata"]})
            is None
        )
        assert env.step(f"\\boxed{{{task['ground_truth']}}}")[1] == 1.0
        env.reset(seed=seed)
        assert env.step("\\boxed{0}")[1] == 0.0 or task["ground_truth"] in ("0.0", "0")


def test_a_scoring_sandbox_that_cannot_run_is_an_infrastructure_failure():
    class Unavailable(rg_env.ReasoningGymScorer):
        def dataset_verdict(self, dataset, answer, entry):
            return scoring.Verdict("sandbox_error", error="zygote cannot start")

    scorer, task = _scorer_and_task("puzzle24")
    graded = scorer(task, f"\\boxed{{{task['ground_truth']}}}")
    assert graded.reward == 1.0 and graded.metadata["infra_failed"] is False
    broken = Unavailable(scorer.score_fns, configs=scorer.configs)
    failed = broken(task, f"\\boxed{{{task['ground_truth']}}}")
    assert (failed.reward, failed.metadata["path"], failed.metadata["infra_failed"]) == (0.0, "sandbox_error", True)
    assert broken(task, "\\boxed{__import__('os')}").metadata["infra_failed"] is False  # refused: the model's
