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


@pytest.mark.parametrize(("index", "min_claims"), [(0, 4), (1, 2), (3, 1)], ids=["tour", "custom-env", "multi-agent"])
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
