"""Small pieces every benchmark script of ``benchmarks/`` would otherwise write again: clocking a call in
milliseconds after a warm-up, and writing the ``--json`` results that ``run_all.py`` reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timings_ms(function: Callable[[], Any], repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` calls of ``function``, sorted, after one untimed warm-up call (imports, a
    sandbox's first start, an index built on first use: costs paid once, not per call)."""
    function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(1e3 * (time.perf_counter() - start))
    return sorted(samples)


def write_json(path: str | Path | None, results: dict[str, Any]) -> None:
    """Write ``results`` to ``path`` as indented JSON (what ``--json PATH`` asks for); nothing when it is None."""
    if path:
        Path(path).write_text(json.dumps(results, indent=2) + "\n")
