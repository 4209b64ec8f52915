"""What a benchmark is (:class:`Benchmark`, its :class:`HubSource`) and how its rows are read: from the Hugging Face
hub at a pinned revision, or from a local copy in the hub's own layout (a snapshot folder, one data file, or a
``save_to_disk`` folder), each row checked against the columns the benchmark's layout has."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DATA_SUFFIXES", "Benchmark", "BenchmarkDataError", "HubSource", "read_rows"]

DATA_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")


class BenchmarkDataError(ValueError):
    """A benchmark's data that is missing or not in the layout its source has; the message names what was expected."""


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark's rows live on the Hugging Face hub: ``repo`` (a data set), ``config``, ``split`` and the
    ``revision`` (a commit) the reference numbers were computed on. ``files``: the repository's files to read
    instead of its data set configs (LiveCodeBench's releases are sets of JSONL files)."""

    repo: str
    split: str
    revision: str
    config: str | None = None
    files: tuple[str, ...] = ()

    def describe(self) -> str:
        """``repo[config]:split@revision`` with the revision shortened, as ``rllm-gym benchmarks`` prints it."""
        config = f"[{self.config}]" if self.config else ""
        files = f" ({', '.join(self.files)})" if self.files else ""
        return f"{self.repo}{config}:{self.split}@{self.revision[:7]}{files}"

    def expected_layout(self) -> str:
        """The local files a copy of this source may hold, in words (for error messages)."""
        if self.files:
            return "the files " + ", ".join(self.files)
        folder = f"{self.config}/" if self.config else ""
        return (
            f"{folder}{self.split}-*.parquet or data/{self.split}-*.parquet (the hub's layout), {self.split}.jsonl, "
            f"{self.split}.parquet, or a datasets.save_to_disk folder with a {self.split!r} split"
        )


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: the env and grader that score it, the rows it is made of, the prompt its reference numbers use.

    ``to_task(row, index)`` turns a row of the source's layout (``columns``) into a task dict of ``env``;
    ``prompt`` is the prompt format as the model sees it (recorded with every result). ``subsets``: task fields whose
    values the results are also broken down by (MATH-500's ``level``). ``agent_args`` (or a function that returns
    them, for a prompt read from an optional package when the benchmark runs) configure the env's default agent.
    ``builtin``: rows that ship with a package (HumanEval's), read when no data folder is given and it is installed;
    ``generate``: tasks made offline (reasoning-gym), for benchmarks that have no rows to read.
    """

    name: str
    title: str
    env: str
    answer_format: str
    grader: str
    metric: str
    source: HubSource | str
    size: int
    prompt: str
    columns: tuple[str, ...] = ()
    to_task: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    env_args: dict[str, Any] = field(default_factory=dict)
    agent_args: dict[str, Any] | Callable[[], dict[str, Any]] = field(default_factory=dict)
    subsets: tuple[str, ...] = ()
    builtin: Callable[[], list[dict[str, Any]] | None] | None = None
    generate: Callable[[], list[dict[str, Any]]] | None = None

    def resolved_agent_args(self) -> dict[str, Any]:
        """The agent arguments a run uses (``agent_args``, called when it is a function)."""
        return dict(self.agent_args() if callable(self.agent_args) else self.agent_args)

    def card(self) -> dict[str, Any]:
        """The benchmark as ``rllm-gym benchmarks --json`` lists it and the results JSON records it."""
        source = self.source
        return {
            "name": self.name,
            "title": self.title,
            "env": self.env,
            "env_args": self.env_args,
            "answer_format": self.answer_format,
            "grader": self.grader,
            "metric": self.metric,
            "source": source.describe() if isinstance(source, HubSource) else source,
            "hub": (
                {"repo": source.repo, "config": source.config, "split": source.split, "revision": source.revision}
                | ({"files": list(source.files)} if source.files else {})
                if isinstance(source, HubSource)
                else None
            ),
            "size": self.size,
            "prompt": self.prompt,
            "subsets": list(self.subsets),
        }


# Reading rows


def read_rows(source: HubSource, name: str, data: Path | None) -> tuple[list[dict[str, Any]], str]:
    """The rows of ``source`` and where they came from: from ``data`` (a folder or file in the hub's layout) when
    given, else from the hub at the pinned revision."""
    if data is None:
        try:
            return _hub_rows(source), f"{source.repo}@{source.revision}"
        except Exception as error:  # no network, no such revision, a hub outage: say what to do offline
            raise BenchmarkDataError(
                f"{name}: cannot read {source.describe()} from the Hugging Face hub ({type(error).__name__}: "
                f"{str(error)[:200]}); offline, pass --data-dir with a local copy ({source.expected_layout()})"
            ) from error
    if data.is_file():
        return _file_rows(data), str(data)
    if not data.is_dir():
        raise BenchmarkDataError(f"{name}: --data-dir {data} does not exist; expected {source.expected_layout()}")
    for folder in (data / name, data / source.repo):  # a folder of several benchmarks' copies
        if folder.is_dir():
            return _folder_rows(source, name, folder), str(folder)
    return _folder_rows(source, name, data), str(data)  # the benchmark's own copy


def _hub_rows(source: HubSource) -> list[dict[str, Any]]:
    if source.files:
        from huggingface_hub import hf_hub_download

        rows = []
        for file in source.files:
            path = hf_hub_download(source.repo, file, repo_type="dataset", revision=source.revision)
            rows += _file_rows(Path(path))
        return rows
    import datasets

    loaded = datasets.load_dataset(source.repo, source.config, split=source.split, revision=source.revision)
    return loaded.to_list()


def _folder_rows(source: HubSource, name: str, folder: Path) -> list[dict[str, Any]]:
    if source.files:
        missing = [file for file in source.files if not (folder / file).is_file()]
        if missing:
            raise BenchmarkDataError(
                f"{name}: {folder} lacks {', '.join(missing)}; expected {source.expected_layout()} "
                f"(from {source.repo}@{source.revision[:7]})"
            )
        return [row for file in source.files for row in _file_rows(folder / file)]
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        return _saved_rows(source, name, folder)
    if source.config and (folder / source.config).is_dir():
        folder = folder / source.config
    files = [path for path in sorted(folder.rglob("*")) if path.is_file() and _data_split(path) == source.split]
    if not files:
        found = sorted({split for path in folder.rglob("*") if path.is_file() and (split := _data_split(path))})
        has = f"it has the split(s) {', '.join(found)}" if found else "it holds no data files"
        raise BenchmarkDataError(
            f"{name}: {folder} has no {source.split!r} split ({has}); expected {source.expected_layout()}"
        )
    return [row for path in files for row in _file_rows(path)]


def _saved_rows(source: HubSource, name: str, folder: Path) -> list[dict[str, Any]]:
    import datasets

    loaded = datasets.load_from_disk(str(folder))
    if isinstance(loaded, datasets.DatasetDict):
        if source.split not in loaded:
            raise BenchmarkDataError(
                f"{name}: {folder} has the split(s) {', '.join(sorted(loaded))}, not {source.split!r}; expected "
                f"{source.expected_layout()}"
            )
        loaded = loaded[source.split]
    return loaded.to_list()


def _data_split(path: Path) -> str | None:
    """The split a data file holds by its name (``test-00000-of-00001.parquet``, ``test.jsonl``), or None."""
    suffix = next((suffix for suffix in DATA_SUFFIXES if path.name.endswith(suffix)), None)
    if suffix is None:
        return None
    return path.name.removesuffix(suffix).split("-")[0]


def _file_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one data file (parquet, JSONL, gzipped JSONL or a JSON list)."""
    if not path.name.endswith(DATA_SUFFIXES):
        raise BenchmarkDataError(f"{path} is not a data file: expected a name ending in {', '.join(DATA_SUFFIXES)}")
    try:
        if path.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as file:
            if path.name.endswith(".json"):
                rows = json.load(file)
                if not isinstance(rows, list):
                    raise BenchmarkDataError(f"{path} must hold a JSON list of rows, got a {type(rows).__name__}")
                return rows
            return [json.loads(line) for line in file if line.strip()]
    except (OSError, ValueError) as error:
        if isinstance(error, BenchmarkDataError):
            raise
        raise BenchmarkDataError(
            f"{path} is not a readable data file ({type(error).__name__}: {error}); expected one of "
            f"{', '.join(DATA_SUFFIXES)}"
        ) from None
