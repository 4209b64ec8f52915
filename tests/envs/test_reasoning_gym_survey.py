"""The survey: constant, garbage, hedging and restating answers over every reasoning-gym dataset the env offers.

A dataset of the default set (all but ``UNSOUND_DATASETS``) must pay none of them more than a plain wrong answer
(0.0 under the default binary reward). The datasets' own scores are computed in the scoring sandbox, one run per
dataset for the whole battery (an answer per run would take minutes); everything after that number (the host's
answer check, the wrapper's checks, the binary reward) is the env's own code.
"""

from __future__ import annotations

import base64
import json
import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason='reasoning-gym is an optional extra: pip install -e ".[reasoning-gym]"'
)

from rllm_gym.envs import reasoning_gym as rg_env  # noqa: E402
from rllm_gym.rewards import reasoning_gym as scoring  # noqa: E402
from rllm_gym.rewards.reasoning_gym_checks import UNSOUND_DATASETS  # noqa: E402

ALL_DATASETS = sorted(set(reasoning_gym.factory.DATASETS) - {"composite"})
BATTERY = [
    *("0", "1", "-1", "2", "24", "0 0 0 0", "1e9", "0x18", "inf", "nan", "None", "[]", "x"),
    *("True", "False", "yes", "no", "TrueFalse", "YesNo", "True False yes no", "A", "ABCD", "A B C D"),
    "\\text{yes}",
]
SAMPLES = 2
_BATCH = """
import base64, json, os, pickle, sys
request = pickle.loads(base64.b64decode(sys.stdin.read()))
verdict = os.dup(1)
os.dup2(2, 1)
import reasoning_gym
dataset = reasoning_gym.create_dataset(request["dataset"], size=1, seed=0)
scores = []
for answer, entry in request["pairs"]:
    try:
        scores.append(float(dataset.score_answer(answer, entry)))
    except Exception as failure:
        scores.append(repr(failure)[:100])
os.write(verdict, json.dumps(scores).encode())
"""


class _SurveyScorer(rg_env.ReasoningGymScorer):
    """The env's scorer with the dataset's scores looked up from one batched sandbox run."""

    scores: dict[tuple[str, str], scoring.Verdict]

    def dataset_verdict(self, dataset, answer, entry):
        score_fn = self.score_fns.get(dataset)
        if scoring.runs_in_process(dataset, score_fn):
            return scoring.score_in_process(score_fn, answer, entry)
        return self.scores[(answer, entry["question"])]


def _normal(text: str) -> object:
    text = text.strip().lower()
    try:
        return float(text)
    except ValueError:
        return text


def _restatements(metadata: dict) -> list[str]:
    """The givens a task states, restated as an answer: each list of them in its metadata (``premises``...) joined
    with ∧, and its first item alone. Lists of answers (n_queens' valid boards, a solution path) are not givens."""
    lists = [value for key, value in metadata.items() if any(word in key for word in ("premise", "given"))]
    lists = [value for value in lists if isinstance(value, list) and value and all(isinstance(i, str) for i in value)]
    return [text for value in lists for text in (" ∧ ".join(f"({item})" for item in value), value[0])]


def _survey(name: str) -> list[tuple[str, float]]:
    dataset = reasoning_gym.create_dataset(name, size=SAMPLES, seed=0)
    tasks = [
        {"question": e["question"], "ground_truth": e["answer"], "dataset": name, "metadata": e["metadata"]}
        for e in (dataset[i] for i in range(SAMPLES))
    ]
    scorer = _SurveyScorer({name: dataset.score_answer}, configs={name: {}})
    cases = []
    for task in tasks:
        others = " ".join(str(t["ground_truth"]) for t in tasks if t["ground_truth"] != task["ground_truth"])
        for text in [*BATTERY, task["question"][:2000], others, *_restatements(task["metadata"])]:
            answer = rg_env.extract_reply_answer(f"\\boxed{{{text}}}")[0]  # what the scorer gets
            if answer is not None and _normal(answer) != _normal(str(task["ground_truth"])):
                cases.append((answer, task))
    scorer.scores = {}
    if not scoring.runs_in_process(name, dataset.score_answer):
        entries = [{"question": t["question"], "answer": t["ground_truth"], "metadata": t["metadata"]} for t in tasks]
        by_question = {entry["question"]: entry for entry in entries}
        pairs = [(answer, by_question[task["question"]]) for answer, task in cases]
        payload = base64.b64encode(pickle.dumps({"dataset": name, "pairs": pairs})).decode()
        result = scoring.scoring_sandbox().run(_BATCH, stdin=payload, timeout=120, memory_mb=scoring.SCORE_MEMORY_MB)
        assert result.ok, (name, result.status, result.stderr[-500:])
        for (answer, task), score in zip(cases, json.loads(result.stdout), strict=True):
            verdict = scoring.checked_score(score) if isinstance(score, float) else scoring.Verdict("scorer_error")
            scorer.scores[(answer, task["question"])] = verdict
    paid = []
    for answer, task in cases:
        output = scorer(task, f"\\boxed{{{answer}}}")
        if output.reward > 0.0:
            paid.append((answer[:40], output.reward))
    return paid


def test_no_dataset_of_the_default_set_pays_a_constant_garbage_or_hedging_answer():
    try:
        scoring.scoring_sandbox()
    except RuntimeError as exc:
        pytest.skip(f"the strict sandbox refuses this machine: {exc}")
    with ThreadPoolExecutor(2) as pool:
        paid = dict(zip(ALL_DATASETS, pool.map(_survey, ALL_DATASETS), strict=True))
    farmed = {name: answers for name, answers in paid.items() if answers and name not in UNSOUND_DATASETS}
    assert farmed == {}
    assert all(paid[name] for name in UNSOUND_DATASETS)  # each refusal is still earned: its scorer pays garbage
