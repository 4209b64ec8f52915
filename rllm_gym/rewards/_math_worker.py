"""A math-verify worker process: reads JSON grading requests on stdin, writes one JSON verdict per line on stdout.

math-verify times itself out with ``signal.alarm``, which only works in the main thread of a process, and some
inputs (``9^{9^{9^{9}}}``) spend seconds inside sympy. Running it here, as the main thread of a child process that
the parent can kill, makes grading callable from any thread or event loop with a hard wall-clock limit. This file
is run by path (not as a module) so that the child imports only math-verify, not rllm-gym.
"""

from __future__ import annotations

import json
import logging
import sys
from functools import lru_cache
from typing import Any

from math_verify import parse, verify

# math-verify logs a warning per internal timeout; the parent reports timeouts in the RewardOutput instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int) -> list[Any]:
    # Gold answers repeat across the n rollouts of a task, so their parse is cached.
    return parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)


def grade(gold: str, answer: str, timeout: int) -> bool:
    """math-verify's verdict on ``answer`` against ``gold``, both bare LaTeX/plain answers (no ``$`` needed)."""
    parsed_gold = _parse_gold(gold, timeout)
    parsed_answer = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    return bool(verify(parsed_gold, parsed_answer, timeout_seconds=timeout))


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"verdict": grade(request["gold"], request["answer"], int(request["timeout"])), "error": None}
        except Exception as error:  # a grading failure must not end the worker
            reply = {"verdict": False, "error": f"{type(error).__name__}: {error}"[:300]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
