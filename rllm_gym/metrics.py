"""Evaluation metrics over Episodes: pass@k (unbiased, Chen et al. 2021), pass^k, rewards, turns, tokens.

``pass@k`` is the chance that at least one of k samples of a task is correct, estimated without bias from ``n``
samples with ``c`` correct as ``1 - C(n-c, k) / C(n, k)`` (Chen et al., "Evaluating Large Language Models Trained on
Code", 2021). ``pass^k`` is the chance that all k samples are correct, ``C(c, k) / C(n, k)`` (Yao et al., tau-bench,
2024): a measure of reliability rather than of reach. Both are averaged over tasks.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from math import comb
from typing import Any

from rllm_gym.types import Episode

__all__ = ["pass_at_k", "pass_hat_k", "summarize"]


def _check(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with ``n`` samples of which ``c`` are correct."""
    _check(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k for one task: the chance that k samples drawn without replacement are all correct."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


def _ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def summarize(episodes: Iterable[Episode]) -> dict[str, Any]:
    """The eval table's numbers: pass@k and pass^k for k = 1, 2, 4, ... n (n = the smallest number of rollouts of
    any task), mean reward, turns and response tokens, and the count of each termination reason."""
    episodes = list(episodes)
    if not episodes:
        return {"episodes": 0, "tasks": 0}
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_task[episode.task_id].append(episode)
    n = min(len(group) for group in by_task.values())
    summary: dict[str, Any] = {"episodes": len(episodes), "tasks": len(by_task), "n": n}
    for k in _ks(n):
        at_k = [pass_at_k(len(g), sum(e.is_correct for e in g), k) for g in by_task.values()]
        hat_k = [pass_hat_k(len(g), sum(e.is_correct for e in g), k) for g in by_task.values()]
        summary[f"pass@{k}"] = sum(at_k) / len(at_k)
        summary[f"pass^{k}"] = sum(hat_k) / len(hat_k)
    rewards = [sum(t.reward or 0.0 for t in e.trajectories) for e in episodes]
    summary["mean_reward"] = sum(rewards) / len(rewards)
    summary["mean_turns"] = sum(e.metrics.get("turns", 0.0) for e in episodes) / len(episodes)
    summary["mean_response_tokens"] = sum(e.metrics.get("response_tokens", 0.0) for e in episodes) / len(episodes)
    reasons = Counter(e.termination_reason.value if e.termination_reason else "unknown" for e in episodes)
    summary["termination_reasons"] = dict(sorted(reasons.items()))
    return summary
