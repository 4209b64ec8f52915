"""Task data sets: a :class:`Dataset` of task dicts, loaders, a local :class:`DatasetRegistry`, and built-in tasks.

Every loader yields plain task dicts. Math tasks share the keys ``{"id", "question", "ground_truth", ...}``; the
column mappings here turn the common public formats into them (GSM8K ``question``/``answer`` with ``#### N``,
MATH ``problem``/``solution`` with ``\\boxed{}``, AIME/AMC/DeepScaleR ``problem``/``answer``). Sources are Python
lists, JSONL and parquet files, and Hugging Face ``datasets`` (a saved folder or local files here; a hub name for
users with a network). :class:`MathTaskGenerator` makes seeded arithmetic, fraction and algebra tasks offline, so
``gym.make("rllm/Math-v0")`` needs no download.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, overload

from rllm_gym.rewards.math import last_boxed

__all__ = [
    "FORMATS",
    "Dataset",
    "DatasetRegistry",
    "JsonlError",
    "MathTaskGenerator",
    "load_dataset",
    "map_math_row",
    "read_jsonl",
]

FORMATS = ("auto", "gsm8k", "math", "deepscaler", "none")


class JsonlError(ValueError):
    """A line of a JSONL file that is not JSON: ``path``, ``line`` (1-based) and the decoder's ``msg``."""

    def __init__(self, path: Path, line: int, msg: str):
        super().__init__(f"{path}:{line} is not valid JSON: {msg}")
        self.path, self.line, self.msg = path, line, msg


def read_jsonl(path: str | os.PathLike[str]) -> list[Any]:
    """The JSON value of every non-blank line of a JSONL file; :class:`JsonlError` names the first bad line."""
    path = Path(path)
    rows = []
    with path.open(encoding="utf-8") as file:
        for line_number, line in enumerate(file, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise JsonlError(path, line_number, error.msg) from None
    return rows


# Column mapping


def _detect_format(row: Mapping[str, Any]) -> str:
    if "ground_truth" in row and "question" in row:
        return "none"
    if "problem" in row and "answer" in row:
        return "deepscaler"
    if "problem" in row and "solution" in row:
        return "math"
    if "question" in row and "answer" in row:
        return "gsm8k"
    raise ValueError(
        f"cannot tell the format of a row with columns {sorted(row)}: expected GSM8K (question, answer), MATH "
        "(problem, solution), DeepScaleR/AIME/AMC (problem, answer) or (question, ground_truth); pass format= or "
        "rename the columns"
    )


def map_math_row(row: Mapping[str, Any], format: str = "auto", *, index: int = 0, source: str = "data") -> dict:
    """One row of a public math data set as a task dict ``{"id", "question", "ground_truth", "data_source", ...}``.

    ``format`` is ``"gsm8k"`` (ground truth after ``####``, commas dropped), ``"math"`` (ground truth = last
    ``\\boxed{}`` of the solution), ``"deepscaler"`` (also AIME/AMC: ``problem``, ``answer``), ``"none"`` (rows that
    already have ``question`` and ``ground_truth``), or ``"auto"`` to tell them apart by their columns. The solution
    text is kept under ``solution``; other columns are kept as they are.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown data format {format!r}: choose one of {', '.join(FORMATS)}")
    kind = _detect_format(row) if format == "auto" else format
    task = dict(row)
    try:
        if kind == "gsm8k":
            solution = str(task.pop("answer"))
            if "####" not in solution:
                raise ValueError(f"GSM8K answer {solution[-80:]!r} has no '#### N' line")
            task.update(solution=solution, ground_truth=solution.rpartition("####")[2].strip().replace(",", ""))
        elif kind == "math":
            task["question"] = task.pop("problem")
            boxed = last_boxed(str(task["solution"]))
            if boxed is None:
                raise ValueError(f"MATH solution {str(task['solution'])[-80:]!r} has no \\boxed{{}} answer")
            task["ground_truth"] = boxed
        elif kind == "deepscaler":
            task["question"] = task.pop("problem")
            task["ground_truth"] = str(task.pop("answer"))
        if not isinstance(task["question"], str) or task.get("ground_truth") is None:
            raise ValueError("'question' must be a string and 'ground_truth' must be set")
    except KeyError as missing:
        raise ValueError(f"row {index} of {source} is missing the column {missing} for format {kind!r}") from None
    except ValueError as error:
        raise ValueError(f"row {index} of {source} ({kind} format): {error}") from None
    task["ground_truth"] = str(task["ground_truth"])
    task["id"] = str(task.get("id", task.get("unique_id", f"{source}-{index}")))
    task.setdefault("data_source", source)
    return task


# Dataset


class Dataset(Sequence[dict]):
    """An ordered, immutable list of task dicts with the operations rollouts and training need.

    Example::

        >>> ds = Dataset([{"id": "a", "question": "1+1?", "ground_truth": "2"}, {"id": "b", "question": "2+2?",
        ...               "ground_truth": "4"}], name="tiny")
        >>> len(ds.repeat(3)), ds.repeat(2)[1]["id"], ds[0]["ground_truth"]
        (6, 'a', '2')
        >>> train, test = ds.split(test_size=0.5, seed=0); len(train), len(test)
        (1, 1)

    Indexing with an int gives a copy of the task dict (so callers may not mutate the data set); a slice gives a
    Dataset.
    """

    def __init__(self, data: Iterable[Mapping[str, Any]], name: str = "data"):
        if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
            raise TypeError(f"Dataset data must be an iterable of task dicts (e.g. a list), got {type(data).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"Dataset name must be a str, got {name!r}")
        rows = list(data)
        for index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise TypeError(f"Dataset rows must be dicts, row {index} is a {type(row).__name__}")
        self._rows = [dict(row) for row in rows]
        self.name = name

    @overload
    def __getitem__(self, index: int) -> dict: ...
    @overload
    def __getitem__(self, index: slice) -> Dataset: ...
    def __getitem__(self, index: int | slice) -> dict | Dataset:
        if isinstance(index, slice):
            return Dataset(self._rows[index], name=self.name)
        return dict(self._rows[index])

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict]:
        return (dict(row) for row in self._rows)

    def __repr__(self) -> str:
        return f"Dataset(name={self.name!r}, len={len(self)})"

    def repeat(self, n: int) -> Dataset:
        """Each task ``n`` times in a row (``[a, a, b, b]``), so the rollouts of one task stay together for GRPO."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"Dataset.repeat n must be a positive int, got {n!r}")
        return Dataset((row for row in self._rows for _ in range(n)), name=self.name)

    def shuffle(self, seed: int | None = None) -> Dataset:
        """A shuffled copy; the same seed gives the same order."""
        rows = list(self._rows)
        random.Random(seed).shuffle(rows)
        return Dataset(rows, name=self.name)

    def split(self, test_size: float | int = 0.1, seed: int | None = None) -> tuple[Dataset, Dataset]:
        """``(train, test)``: ``test_size`` is a fraction in (0, 1) or a count; ``seed`` shuffles first."""
        if isinstance(test_size, float) and 0.0 < test_size < 1.0:
            n_test = round(len(self) * test_size)
        elif isinstance(test_size, int) and not isinstance(test_size, bool) and 0 <= test_size <= len(self):
            n_test = test_size
        else:
            raise ValueError(
                "Dataset.split test_size must be a fraction in (0, 1) or a count in "
                f"[0, {len(self)}], got {test_size!r}"
            )
        rows = self.shuffle(seed)._rows if seed is not None else self._rows
        cut = len(rows) - n_test
        return Dataset(rows[:cut], name=self.name), Dataset(rows[cut:], name=self.name)

    def select(self, indices: Iterable[int]) -> Dataset:
        return Dataset((self._rows[index] for index in indices), name=self.name)

    def to_list(self) -> list[dict]:
        return [dict(row) for row in self._rows]

    def to_jsonl(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as file:
            for row in self._rows:
                file.write(json.dumps(row, ensure_ascii=False) + "\n")
        return path

    # Loaders

    @classmethod
    def from_list(cls, rows: Iterable[Mapping[str, Any]], format: str = "none", name: str = "data") -> Dataset:
        """Rows as they are (``format="none"``) or mapped from a public math format (see :func:`map_math_row`)."""
        rows = list(rows)
        if format == "none":
            return cls(rows, name=name)
        return cls((map_math_row(row, format, index=i, source=name) for i, row in enumerate(rows)), name=name)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], format: str = "auto", name: str | None = None) -> Dataset:
        path = Path(path)
        return cls.from_list(read_jsonl(path), format, name=name or path.stem)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike[str], format: str = "auto", name: str | None = None) -> Dataset:
        import pyarrow.parquet as pq

        path = Path(path)
        return cls.from_list(pq.read_table(path).to_pylist(), format, name=name or path.stem)

    @classmethod
    def from_hf(
        cls, name_or_path: str, split: str = "train", subset: str | None = None, format: str = "auto"
    ) -> Dataset:
        """A Hugging Face data set: a folder written by ``save_to_disk``, a local data folder, or a hub name.

        ``Dataset.from_hf("openai/gsm8k", subset="main", split="test")`` downloads (users with a network);
        ``Dataset.from_hf("/data/gsm8k_saved")`` reads a local copy.
        """
        import datasets

        path = Path(name_or_path)
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise ValueError(f"{name_or_path} has splits {sorted(loaded)}, not {split!r}: pass split=")
                loaded = loaded[split]
        else:
            loaded = datasets.load_dataset(name_or_path, subset, split=split)
        label = path.name if path.exists() else name_or_path.replace("/", "_")
        return cls.from_list(loaded.to_list(), format, name=label)


# The built-in task generator


def _frac(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _level_1(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", str(a + b)
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", str(a - b)


def _level_2(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.randint(2, 25), rng.randint(2, 25), rng.randint(1, 50)
    kind = rng.randrange(3)
    if kind == 0:
        return f"What is {a} \\times {b}?", str(a * b)
    if kind == 1:
        return f"What is {a * b} \\div {a}?", str(b)
    return f"Compute ({a} + {c}) \\times {b} - {c}.", str((a + c) * b - c)


def _level_3(rng: random.Random) -> tuple[str, str]:
    x = Fraction(rng.randint(1, 9), rng.randint(2, 9))
    y = Fraction(rng.randint(1, 9), rng.randint(2, 9))
    op = rng.choice(["+", "-", "\\times"])
    value = x + y if op == "+" else x - y if op == "-" else x * y
    return (
        f"Compute {_frac(x)} {op} {_frac(y)}. Give the answer as a fraction in lowest terms.",
        _frac(value),
    )


def _level_4(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.3:
        percent, base = rng.choice([5, 10, 15, 20, 25, 40, 50, 75]), rng.randint(1, 40) * 20
        return f"What is {percent}\\% of {base}?", _frac(Fraction(percent * base, 100))
    a, x, b = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, -2, -3]), rng.randint(-12, 12), rng.randint(-30, 30)
    c = a * x + b
    sign = "+" if b >= 0 else "-"
    return f"Solve for $x$: ${a}x {sign} {abs(b)} = {c}$.", str(x)


def _level_5(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        r, s = rng.randint(-9, 9), rng.randint(-9, 9)
        b, c = -(r + s), r * s
        return (
            f"The equation $x^2 {'+' if b >= 0 else '-'} {abs(b)}x {'+' if c >= 0 else '-'} {abs(c)} = 0$ has roots "
            "$r$ and $s$ (possibly equal). What is $r^2 + s^2$?",
            str(r * r + s * s),
        )
    x, y = rng.randint(-9, 9), rng.randint(-9, 9)
    a, b, c, d = rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 5), -rng.randint(1, 5)
    if a * d - b * c == 0:
        d -= 1
    return (
        f"Solve $\\begin{{cases}} {a}x + {b}y = {a * x + b * y} \\\\ {c}x {d:+}y = {c * x + d * y} \\end{{cases}}$. "
        "What is $x + y$?",
        str(x + y),
    )


_LEVELS = (_level_1, _level_2, _level_3, _level_4, _level_5)


class MathTaskGenerator(Sequence[dict]):
    """A deterministic, offline, indexable stream of math tasks: ``generator[i]`` is the same task on every run.

    Difficulty 1 is two-digit addition and subtraction, 2 multiplication, division and brackets, 3 fractions,
    4 percentages and linear equations, 5 quadratics (via Vieta) and 2x2 linear systems. ``difficulty=None`` mixes
    all five levels. Tasks are made on demand, so a large ``size`` costs nothing.

    Example::

        >>> tasks = MathTaskGenerator(seed=0, difficulty=1, size=100)
        >>> sorted(tasks[3]), tasks[3] == MathTaskGenerator(seed=0, difficulty=1)[3]
        (['data_source', 'difficulty', 'ground_truth', 'id', 'question'], True)
    """

    def __init__(self, seed: int = 0, difficulty: int | None = None, size: int = 100_000):
        if difficulty is not None and (not isinstance(difficulty, int) or not 1 <= difficulty <= len(_LEVELS)):
            raise ValueError(
                f"MathTaskGenerator difficulty must be an int in [1, {len(_LEVELS)}] or None, got {difficulty!r}"
            )
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"MathTaskGenerator seed must be an int, got {seed!r}")
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"MathTaskGenerator size must be a positive int, got {size!r}")
        self.seed, self.difficulty, self.size = seed, difficulty, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:  # type: ignore[override]
        if not isinstance(index, int):
            raise TypeError("MathTaskGenerator indices must be ints; use to_dataset(n) for a sliceable Dataset")
        if not -self.size <= index < self.size:
            raise IndexError(f"task index {index} out of range for a generator of size {self.size}")
        index %= self.size
        rng = random.Random(f"rllm-math:{self.seed}:{self.difficulty}:{index}")  # str seeds hash stably
        level = self.difficulty or rng.randint(1, len(_LEVELS))
        question, answer = _LEVELS[level - 1](rng)
        return {
            "id": f"synthetic-math-s{self.seed}-d{self.difficulty or 0}-{index}",
            "question": question,
            "ground_truth": answer,
            "difficulty": level,
            "data_source": "synthetic_math",
        }

    def to_dataset(self, n: int | None = None) -> Dataset:
        """The first ``n`` tasks (all of them by default) as a :class:`Dataset`."""
        count = self.size if n is None else min(n, self.size)
        return Dataset((self[i] for i in range(count)), name="synthetic_math")


# Registry and the one entry point


def _default_root() -> Path:
    return Path(os.environ.get("RLLM_GYM_DATA_DIR", Path.home() / ".cache" / "rllm_gym" / "datasets"))


class DatasetRegistry:
    """Named data sets cached as JSONL under ``root/<name>/<split>.jsonl``.

    ``root`` defaults to ``$RLLM_GYM_DATA_DIR`` or ``~/.cache/rllm_gym/datasets``. Register once (from any loader),
    then load by name anywhere, including ``gym.make("rllm/Math-v0", dataset="gsm8k")``::

        registry = DatasetRegistry()
        registry.register("gsm8k", Dataset.from_hf("openai/gsm8k", subset="main", split="test"), split="test")
        tasks = registry.load("gsm8k", split="test")
    """

    _NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

    def __init__(self, root: str | os.PathLike[str] | None = None):
        if root is not None and (not isinstance(root, (str, os.PathLike)) or not str(root)):
            raise TypeError(f"DatasetRegistry root must be a folder path (str or Path) or None, got {root!r}")
        self.root = Path(root) if root is not None else _default_root()

    def _path(self, name: str, split: str) -> Path:
        for label, value in (("name", name), ("split", split)):
            if not isinstance(value, str) or not self._NAME.match(value) or ".." in value:
                raise ValueError(
                    f"dataset {label} {value!r} must be letters, digits, '_', '-' or '.', e.g. 'gsm8k' or 'test'"
                )
        return self.root / name / f"{split}.jsonl"

    def register(self, name: str, data: Dataset | Iterable[Mapping[str, Any]], split: str = "train") -> Dataset:
        """Write ``data`` (a Dataset or task dicts) to the cache, replacing an earlier split of that name."""
        dataset = data if isinstance(data, Dataset) else Dataset(data, name=name)
        dataset.to_jsonl(self._path(name, split))
        return Dataset(dataset, name=name)

    def load(self, name: str, split: str = "train") -> Dataset:
        path = self._path(name, split)
        if not path.exists():
            known = self.splits(name)
            hint = f"it has splits {known}" if known else f"registered: {self.names() or 'none'}"
            raise KeyError(f"dataset {name!r} split {split!r} is not registered under {self.root} ({hint})")
        return Dataset.from_jsonl(path, format="none", name=name)

    def exists(self, name: str, split: str = "train") -> bool:
        return self._path(name, split).exists()

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.exists() else []

    def splits(self, name: str) -> list[str]:
        folder = self.root / name
        return sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []

    def remove(self, name: str) -> None:
        self._path(name, "train")  # validates the name
        shutil.rmtree(self.root / name, ignore_errors=True)


def load_dataset(
    source: Dataset | Sequence[Mapping[str, Any]] | str | os.PathLike[str],
    split: str = "train",
    format: str = "auto",
    registry: DatasetRegistry | None = None,
) -> Sequence[dict]:
    """Tasks from any source: a Dataset or list (as is), a ``.jsonl``/``.parquet`` file, a Hugging Face folder, a
    name registered in ``registry``, ``"synthetic_math"`` (the built-in generator), or a Hugging Face hub name."""
    if isinstance(source, (Dataset, MathTaskGenerator)):
        return source
    if isinstance(source, Sequence) and not isinstance(source, str):
        return Dataset(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"dataset must be a Dataset, a list of task dicts, a path or a name, got {type(source).__name__}"
        )
    path = Path(source)
    if path.suffix == ".jsonl" and path.is_file():
        return Dataset.from_jsonl(path, format=format)
    if path.suffix == ".parquet" and path.is_file():
        return Dataset.from_parquet(path, format=format)
    if path.is_dir():
        return Dataset.from_hf(str(path), split=split, format=format)
    name = str(source)
    if name == "synthetic_math":
        return MathTaskGenerator()
    registry = registry or DatasetRegistry()
    if DatasetRegistry._NAME.match(name) and registry.exists(name, split):
        return registry.load(name, split)
    if path.suffix in (".jsonl", ".parquet", ".json") or (os.sep in name and not re.match(r"^[\w.-]+/[\w.-]+$", name)):
        raise FileNotFoundError(f"no data file at {name!r}: check the path")
    return Dataset.from_hf(name, split=split, format=format)
