"""Tests for rllm_gym/tools/search.py: BM25 over the shipped corpus and over user corpora."""

from __future__ import annotations

import json
import re

import pytest

from rllm_gym.envs.tool import builtin_tasks
from rllm_gym.tools.search import SearchTool, load_corpus, shipped_corpus, tokenize


@pytest.fixture(scope="module")
def search() -> SearchTool:
    return SearchTool()


def test_tokenize_lowercases_words():
    assert tokenize("The Halvard-Bridge, 1847!") == ["the", "halvard", "bridge", "1847"]


def test_shipped_corpus_is_valid_and_unique():
    docs = shipped_corpus()
    assert len(docs) == 24
    assert len({d["id"] for d in docs}) == 24
    assert all(d["title"] and d["text"] for d in docs)


def test_every_lookup_task_finds_its_evidence_first(search):
    lookups = [t for t in builtin_tasks() if t["kind"] == "lookup"]
    assert len(lookups) >= 10
    for task in lookups:
        hits = search.rank(task["question"])
        assert hits[0][0]["id"] == task["evidence"], task["question"]
        assert task["ground_truth"] in hits[0][0]["text"]


def test_forward_formats_numbered_hits_and_ids(search):
    out = search(query="Orsk tower watchtower", k=2)
    assert out.output.startswith("[1] Orsk Tower (orsk-tower): The Orsk Tower is a stone watchtower")
    assert out.metadata["ids"][0] == "orsk-tower" and len(out.metadata["ids"]) <= 2
    assert search(query="zebra quasar").output == "No results for 'zebra quasar'."
    assert search(query="!!!").metadata == {"ids": []}
    assert (
        search(query="x", k=0).error == "invalid arguments for tool 'search': 0 is less than the minimum of 1 (at 'k')"
    )


def test_user_corpus_from_jsonl_and_from_dicts(tmp_path):
    path = tmp_path / "corpus.jsonl"
    records = [
        {"id": "a", "title": "Apples", "text": "Apples are red or green fruit."},
        {"id": "b", "text": "Bananas are long and yellow."},
        {"id": "c", "text": "Cherries grow on trees in spring."},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    assert load_corpus(path)[1] == {"id": "b", "title": "", "text": "Bananas are long and yellow."}
    tool = SearchTool(path, k=1)
    assert tool(query="yellow bananas").metadata["ids"] == ["b"]
    assert SearchTool(records).rank("cherries trees")[0][0]["id"] == "c"


def test_bad_corpora_are_rejected_with_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "text": "ok"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: corpus record needs a non-empty string 'text'")):
        load_corpus(path)
    path.write_text('{"id": "a", "text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: invalid JSON")):
        load_corpus(path)
    with pytest.raises(FileNotFoundError, match=re.escape("does not exist")):
        load_corpus(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=re.escape("SearchTool corpus is empty")):
        SearchTool([])
    with pytest.raises(ValueError, match=re.escape("corpus ids must be unique, duplicated: ['a']")):
        SearchTool([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    with pytest.raises(ValueError, match=re.escape("SearchTool k must be an int in [1, 20]")):
        SearchTool(k=0)
