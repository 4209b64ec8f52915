"""Property tests for code extraction (``extract_code``) on arbitrary and adversarial model replies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.rewards.code import extract_code

_fragments = st.sampled_from(
    [
        "```",
        "```python\n",
        "```py",
        "```python3 extra\n",
        "\n",
        "`",
        "``",
        "~~~",
        "print(1)\n",
        "def f():\n",
        " ",
        "\t",
    ]
)
_adversarial = st.lists(_fragments | st.text(max_size=8), max_size=40).map("".join)
_replies = st.text(max_size=300) | _adversarial
# Code a fence can hold: anything without three backticks in a row.
_code = st.text(max_size=200).filter(lambda code: "```" not in code and "``" not in code[-2:])


@settings(max_examples=400, deadline=None)
@given(text=_replies)
def test_extract_code_never_raises_and_returns_a_piece_of_the_reply(text):
    code = extract_code(text)
    assert code is None or (isinstance(code, str) and code in text)
    if "```" not in text:
        assert code is None


@settings(max_examples=300, deadline=None)
@given(
    code=_code,
    language=st.sampled_from(["", "python", "py", "python3", "c++"]),
    before=st.lists(
        st.text(max_size=30).filter(lambda text: "`" not in text) | st.just("```\nearlier\n```"), max_size=4
    ).map("\n".join),
    after=st.text(max_size=100).filter(lambda text: "```" not in text),
)
def test_the_last_fenced_block_round_trips(code, language, before, after):
    body = code if code.endswith("\n") or not code else code + "\n"
    assert extract_code(f"{before}\n```{language}\n{body}```{after}") == body


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 3000), fence=st.sampled_from(["```", "```python\n", "`"]))
def test_fence_spam_is_parsed_in_linear_time_and_an_unclosed_fence_is_ignored(n, fence):
    code = extract_code(fence * n)
    assert code is None or "```" not in code
    # A closed block followed by an unclosed fence: the closed block is the answer.
    assert extract_code("```python\nprint(1)\n```\nand then ```python\n" + "x" * n) == "print(1)\n"
