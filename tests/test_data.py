from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rllm_gym.data import Dataset, DatasetRegistry, MathTaskGenerator, load_dataset, map_math_row
from rllm_gym.rewards.math import math_reward_fn

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A shop sells 1,200 pens a day. How many in 2 days?", "answer": "1200*2=2400\n#### 2,400"},
]
MATH_ROWS = [
    {
        "problem": "Simplify $\\sqrt{28}$.",
        "solution": "We get $\\boxed{2\\sqrt{7}}$.",
        "level": "Level 2",
        "type": "Algebra",
        "unique_id": "test/algebra/1.json",
    },
    {
        "problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?",
        "solution": "It is $\\boxed{\\frac{3}{4}}$.",
        "level": "Level 1",
        "type": "Prealgebra",
        "unique_id": "test/prealgebra/2.json",
    },
]
DEEPSCALER_ROWS = [
    {"problem": "Find the remainder when $2^{10}$ is divided by 7.", "answer": "2", "solution": "1024 = 7*146+2"},
    {"problem": "AIME: compute $1+2+\\dots+10$.", "answer": 55},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_column_mapping_for_each_public_format() -> None:
    gsm = Dataset.from_list(GSM8K_ROWS, format="auto", name="gsm8k")
    assert [t["ground_truth"] for t in gsm] == ["7", "2400"]
    assert gsm[0]["id"] == "gsm8k-0" and gsm[0]["solution"].endswith("#### 7") and "answer" not in gsm[0]
    math = Dataset.from_list(MATH_ROWS, format="math", name="math")
    assert [t["ground_truth"] for t in math] == ["2\\sqrt{7}", "\\frac{3}{4}"]
    assert math[0]["id"] == "test/algebra/1.json" and math[0]["level"] == "Level 2"
    assert math[0]["question"] == "Simplify $\\sqrt{28}$."
    deep = Dataset.from_list(DEEPSCALER_ROWS, format="auto", name="aime")
    assert [t["ground_truth"] for t in deep] == ["2", "55"]
    assert deep[1]["question"].startswith("AIME") and deep[0]["data_source"] == "aime"
    # The mapped tasks grade with the math reward.
    assert math_reward_fn(math[0], "\\boxed{2\\sqrt{7}}").is_correct is True
    assert math_reward_fn(math[0], "\\boxed{\\sqrt{28}}").is_correct is False  # "Simplify $\\sqrt{28}$" restated
    assert math_reward_fn(gsm[1], "#### 2400").is_correct is True


def test_column_mapping_errors_name_the_row_and_the_fix() -> None:
    with pytest.raises(ValueError, match=re.escape("row 0 of data (gsm8k format): GSM8K answer 'no marker' has no")):
        map_math_row({"question": "q", "answer": "no marker"}, "gsm8k")
    with pytest.raises(ValueError, match=re.escape("row 3 of x is missing the column 'solution' for format 'math'")):
        map_math_row({"problem": "q"}, "math", index=3, source="x")
    with pytest.raises(ValueError, match=re.escape("cannot tell the format of a row with columns ['text']")):
        map_math_row({"text": "q"})
    with pytest.raises(ValueError, match=re.escape("unknown data format 'csv': choose one of auto, gsm8k")):
        map_math_row({"question": "q", "answer": "#### 1"}, "csv")


def test_dataset_repeat_shuffle_split_len_and_indexing() -> None:
    ds = Dataset([{"id": str(i), "question": f"q{i}", "ground_truth": str(i)} for i in range(10)], name="toy")
    assert len(ds) == 10 and ds[3]["id"] == "3" and ds[-1]["id"] == "9"
    assert [t["id"] for t in ds[2:4]] == ["2", "3"] and isinstance(ds[2:4], Dataset)
    assert [t["id"] for t in ds[:2].repeat(3)] == ["0", "0", "0", "1", "1", "1"]
    shuffled = ds.shuffle(seed=1)
    assert [t["id"] for t in shuffled] == [t["id"] for t in ds.shuffle(seed=1)]
    assert [t["id"] for t in shuffled] != [t["id"] for t in ds]
    assert sorted(t["id"] for t in shuffled) == sorted(t["id"] for t in ds)
    train, test = ds.split(test_size=0.3, seed=0)
    assert (len(train), len(test)) == (7, 3)
    assert {t["id"] for t in train} | {t["id"] for t in test} == {str(i) for i in range(10)}
    train, test = ds.split(test_size=2)
    assert [t["id"] for t in test] == ["8", "9"]
    ds[0]["question"] = "mutated"
    assert ds[0]["question"] == "q0"  # indexing hands out copies
    with pytest.raises(ValueError, match=re.escape("Dataset.repeat n must be a positive int, got 0")):
        ds.repeat(0)
    with pytest.raises(ValueError, match=re.escape("Dataset.split test_size must be a fraction in (0, 1) or a count")):
        ds.split(test_size=1.5)
    with pytest.raises(TypeError, match=re.escape("Dataset rows must be dicts, row 1 is a str")):
        Dataset([{}, "x"])


def test_jsonl_and_parquet_loaders(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = _write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K_ROWS)
    ds = Dataset.from_jsonl(jsonl)
    assert ds.name == "gsm8k_test" and [t["ground_truth"] for t in ds] == ["7", "2400"]
    parquet = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist(MATH_ROWS), parquet)
    ds = Dataset.from_parquet(parquet)
    assert [t["ground_truth"] for t in ds] == ["2\\sqrt{7}", "\\frac{3}{4}"]
    assert load_dataset(str(parquet))[1]["ground_truth"] == "\\frac{3}{4}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "ground_truth": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=re.escape(f"{bad}:2 is not valid JSON")):
        Dataset.from_jsonl(bad)


def test_hugging_face_datasets_from_a_local_folder(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_list([*DEEPSCALER_ROWS[:1], {"problem": "p", "answer": "3", "solution": None}]).save_to_disk(
        str(tmp_path / "saved")
    )
    ds = Dataset.from_hf(str(tmp_path / "saved"))
    assert [t["ground_truth"] for t in ds] == ["2", "3"]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(GSM8K_ROWS)}).save_to_disk(str(tmp_path / "dict"))
    assert [t["ground_truth"] for t in load_dataset(str(tmp_path / "dict"), split="test")] == ["7", "2400"]
    with pytest.raises(ValueError, match=re.escape("has splits ['test'], not 'train': pass split=")):
        Dataset.from_hf(str(tmp_path / "dict"))
    # A folder of plain data files goes through datasets.load_dataset, offline.
    folder = tmp_path / "files"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", MATH_ROWS)
    assert [t["ground_truth"] for t in Dataset.from_hf(str(folder))] == ["2\\sqrt{7}", "\\frac{3}{4}"]


def test_registry_registers_and_loads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = DatasetRegistry(root=tmp_path / "cache")
    assert registry.names() == []
    registry.register("gsm8k", Dataset.from_list(GSM8K_ROWS, format="gsm8k"), split="test")
    assert (tmp_path / "cache" / "gsm8k" / "test.jsonl").exists()
    loaded = registry.load("gsm8k", split="test")
    assert loaded.to_list() == Dataset.from_list(GSM8K_ROWS, format="gsm8k").to_list()
    assert registry.names() == ["gsm8k"] and registry.splits("gsm8k") == ["test"]
    with pytest.raises(KeyError, match=re.escape("dataset 'gsm8k' split 'train' is not registered under")):
        registry.load("gsm8k")
    with pytest.raises(ValueError, match=re.escape("dataset name '../evil' must be letters, digits")):
        registry.register("../evil", [])
    # load_dataset resolves registered names, and the default root follows RLLM_GYM_DATA_DIR.
    assert len(load_dataset("gsm8k", split="test", registry=registry)) == 2
    monkeypatch.setenv("RLLM_GYM_DATA_DIR", str(tmp_path / "cache"))
    assert DatasetRegistry().load("gsm8k", split="test")[0]["ground_truth"] == "7"
    registry.remove("gsm8k")
    assert registry.names() == []


def test_math_task_generator_is_seeded_and_graded_by_its_own_answers() -> None:
    for level in range(1, 6):
        tasks = MathTaskGenerator(seed=3, difficulty=level, size=50)
        again = MathTaskGenerator(seed=3, difficulty=level, size=50)
        assert [tasks[i] for i in range(50)] == [again[i] for i in range(50)]
        assert all(tasks[i]["difficulty"] == level for i in range(50))
        assert all(
            math_reward_fn(tasks[i], f"\\boxed{{{tasks[i]['ground_truth']}}}").is_correct for i in range(0, 50, 7)
        )
    assert MathTaskGenerator(seed=1)[0] != MathTaskGenerator(seed=2)[0]
    mixed = MathTaskGenerator(seed=0).to_dataset(200)
    assert {t["difficulty"] for t in mixed} == {1, 2, 3, 4, 5}
    assert len({t["id"] for t in mixed}) == 200
    assert MathTaskGenerator(difficulty=1)[5]["question"] == MathTaskGenerator(difficulty=1)[5]["question"]
    with pytest.raises(
        ValueError, match=re.escape("MathTaskGenerator difficulty must be an int in [1, 5] or None, got 9")
    ):
        MathTaskGenerator(difficulty=9)
    with pytest.raises(IndexError, match=re.escape("task index 10 out of range for a generator of size 10")):
        MathTaskGenerator(size=10)[10]


def test_level_one_generator_answers_are_correct_arithmetic() -> None:
    tasks = MathTaskGenerator(seed=0, difficulty=1, size=30)
    for i in range(30):
        a, op, b = re.match(r"What is (\d+) ([+-]) (\d+)\?", tasks[i]["question"]).groups()
        assert int(tasks[i]["ground_truth"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
