"""The README's tour runs as written and prints what its comments say."""

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def expected_output(block: str) -> list[str]:
    """Comment lines that stand alone or follow a print(...) call: what the block claims to print."""
    expected = []
    for line in block.splitlines():
        comment = line.partition("#")[2].strip() if "print(" in line or line.startswith("#") else ""
        if comment:
            expected.append(comment.removesuffix("...").strip())
    return expected


@pytest.mark.parametrize(
    ("index", "min_claims"), [(0, 4), (1, 2), (3, 1), (5, 3)], ids=["tour", "custom-env", "multi-agent", "interop"]
)
def test_block_runs_and_prints_what_it_says(index, min_claims):
    block = python_blocks()[index]
    assert "make(" in block
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    printed = out.getvalue()
    claims = expected_output(block)
    assert len(claims) >= min_claims
    for claim in claims:
        assert claim in printed, f"README claims {claim!r} but the block printed:\n{printed}"


def test_the_engine_block_runs_as_a_script(tmp_path, monkeypatch):
    """The engine snippet is a script (asyncio.run), not a notebook cell: a top-level await does not compile in a
    script. Run with 2 tasks x 1 rollout instead of 100 x 4, in a folder of its own (it writes episodes.jsonl)."""
    [block] = [block for block in python_blocks() if "AgentExecutionEngine(" in block]
    compile(block, "README.md", "exec")  # a top-level await is a SyntaxError here
    bounded = block.replace("list(range(100))", "list(range(2))").replace("n_rollouts=4", "n_rollouts=1")
    assert bounded != block
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(bounded, "README.md", "exec"), namespace)
    assert [episode.id for episode in namespace["episodes"]] == ["seed-0:0", "seed-1:0"]
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 2
