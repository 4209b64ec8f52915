"""What went wrong in a set of episodes: counts per termination reason and the distinct errors behind ERROR episodes.

``rllm-gym eval`` and the trainer put these in their summaries, so that a run whose episodes fail says why instead of
reporting a reward of 0. Errors are grouped by exception type and message; each group keeps one example episode id
(open it with ``rllm-gym view FILE --id ID`` to read its traceback).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from rllm_gym.types import Episode, TerminationReason

__all__ = ["ErrorTally", "all_errored", "describe_errors", "termination_counts"]

MAX_MESSAGE = 500  # characters of an error message kept in a summary


def termination_counts(episodes: Iterable[Episode]) -> dict[str, int]:
    """How many episodes ended for each termination reason, sorted by reason."""
    reasons = Counter(e.termination_reason.value if e.termination_reason else "unknown" for e in episodes)
    return dict(sorted(reasons.items()))


def all_errored(episodes: Iterable[Episode]) -> bool:
    """True when there are episodes and every one of them ended in ERROR."""
    episodes = list(episodes)
    return bool(episodes) and all(e.termination_reason is TerminationReason.ERROR for e in episodes)


class ErrorTally:
    """Distinct ``(type, message)`` errors of ERROR episodes, with counts and the first episode id seen for each.

    Example::

        tally = ErrorTally()
        tally.add(episodes)
        tally.groups()  # [{"type": "ValueError", "message": "...", "count": 12, "example": "seed-3:0"}]
    """

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.examples: dict[tuple[str, str], str] = {}

    def add(self, episodes: Iterable[Episode]) -> None:
        for episode in episodes:
            if episode.termination_reason is not TerminationReason.ERROR:
                continue
            error = episode.metadata.get("error") or {}
            key = (str(error.get("type", "unknown")), str(error.get("message", "no error was recorded"))[:MAX_MESSAGE])
            self.counts[key] += 1
            self.examples.setdefault(key, episode.id)

    def groups(self) -> list[dict[str, Any]]:
        """One dict per distinct error, the most frequent first."""
        return [
            {"type": kind, "message": message, "count": count, "example": self.examples[kind, message]}
            for (kind, message), count in self.counts.most_common()
        ]

    def __bool__(self) -> bool:
        return bool(self.counts)


def describe_errors(groups: list[dict[str, Any]], limit: int = 5) -> str:
    """The groups as lines a person reads: ``12 x ValueError: message (e.g. episode seed-3:0)``."""
    lines = [f"{g['count']} x {g['type']}: {g['message']} (e.g. episode {g['example']})" for g in groups[:limit]]
    if len(groups) > limit:
        lines.append(f"... and {len(groups) - limit} other distinct errors")
    return "\n".join(lines)
