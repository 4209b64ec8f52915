"""The ``search`` tool: BM25 retrieval over a local document corpus, offline.

The project ships a small corpus (``corpus.jsonl`` next to this module: encyclopedia-style articles about a
fictional province, so that questions about it can only be answered by searching). Users pass their own corpus as a
JSONL file with one ``{"id", "text"}`` object per line (``title`` optional), or as a list of such dicts. Ranking is
Okapi BM25 from the ``rank-bm25`` package over lower-cased word tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from rank_bm25 import BM25Okapi

from rllm_gym.tools.base import Tool, ToolOutput

__all__ = ["Document", "SearchTool", "load_corpus", "shipped_corpus", "tokenize"]

Document = dict[str, str]
_TOKEN = re.compile(r"\w+", re.UNICODE)
_MAX_K = 20


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore), the unit BM25 scores."""
    return _TOKEN.findall(text.lower())


def _validate_document(record: Any, where: str) -> Document:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: each corpus record must be a JSON object with 'id' and 'text', got {record!r}")
    for key in ("id", "text"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise ValueError(f"{where}: corpus record needs a non-empty string {key!r}, got {record.get(key)!r}")
    title = record.get("title", "")
    if not isinstance(title, str):
        raise ValueError(f"{where}: corpus record 'title' must be a string, got {title!r}")
    return {"id": record["id"], "title": title, "text": record["text"]}


def load_corpus(path: str | Path) -> list[Document]:
    """Read a JSONL corpus (one ``{"id", "text", "title"?}`` per line; blank lines skipped), validating every line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist: pass a JSONL file of {{'id', 'text'}}")
    documents = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: invalid JSON ({error.msg})") from None
            documents.append(_validate_document(record, f"{path}:{number}"))
    return documents


def shipped_corpus() -> list[Document]:
    """The corpus that ships with rllm-gym (24 articles about the fictional province of Ostrana)."""
    with resources.as_file(resources.files("rllm_gym.tools").joinpath("corpus.jsonl")) as path:
        return load_corpus(path)


class SearchTool(Tool):
    """``search(query, k=3)``: the ``k`` best BM25 matches in the corpus, as numbered ``[id] title: text`` blocks.

    ``corpus`` is a JSONL path, a list of ``{"id", "text", "title"?}`` dicts, or None for the shipped corpus.
    Documents with a score of zero (no query word in common) are never returned.
    """

    def __init__(self, corpus: str | Path | Sequence[Document] | None = None, *, k: int = 3, **kwargs: Any):
        if corpus is None:
            documents = shipped_corpus()
        elif isinstance(corpus, (str, Path)):
            documents = load_corpus(corpus)
        else:
            documents = [_validate_document(record, f"corpus[{i}]") for i, record in enumerate(corpus)]
        if not documents:
            raise ValueError("SearchTool corpus is empty: give at least one {'id', 'text'} document")
        ids = [document["id"] for document in documents]
        if len(set(ids)) != len(ids):
            duplicates = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"SearchTool corpus ids must be unique, duplicated: {duplicates}")
        if not isinstance(k, int) or not 1 <= k <= _MAX_K:
            raise ValueError(f"SearchTool k must be an int in [1, {_MAX_K}], got {k!r}")
        super().__init__(
            "search",
            "Search the reference corpus and return the most relevant passages.",
            {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Keywords to search for."},
                    "k": {"type": "integer", "minimum": 1, "maximum": _MAX_K, "description": "Passages to return."},
                },
                "required": ["query"],
            },
            **kwargs,
        )
        self.documents = documents
        self.k = k
        self._bm25 = BM25Okapi([tokenize(f"{d['title']} {d['text']}") or ["\0"] for d in documents])

    def rank(self, query: str, k: int | None = None) -> list[tuple[Document, float]]:
        """The best ``k`` documents with positive BM25 score, best first (ties keep corpus order)."""
        terms = tokenize(query)
        if not terms:
            return []
        scores = self._bm25.get_scores(terms)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [(self.documents[i], float(scores[i])) for i in order[: k or self.k] if scores[i] > 0]

    def forward(self, query: str, k: int | None = None) -> ToolOutput:
        hits = self.rank(query, k)
        if not hits:
            return ToolOutput(name=self.name, output=f"No results for {query!r}.", metadata={"ids": []})
        blocks = [
            f"[{rank}] {doc['title'] or doc['id']} ({doc['id']}): {doc['text']}"
            for rank, (doc, _) in enumerate(hits, 1)
        ]
        return ToolOutput(name=self.name, output="\n\n".join(blocks), metadata={"ids": [doc["id"] for doc, _ in hits]})
