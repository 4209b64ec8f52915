"""Property tests for code grading: extraction (``extract_code``) on arbitrary and adversarial model replies, and
the channel and comparison over any value a solution can return or print."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm_gym.rewards._code_compare import QUOTE, outputs_match, quote, show, values_match
from rllm_gym.rewards.code import CodeReward, extract_code
from rllm_gym.sandbox import channel

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


# The channel and the comparison over any plain value the solution can return (issue 29): big ints, NaN and inf,
# lone surrogates, deep containers. Nothing raises; every value has a bounded, loggable rendering.

_huge = st.builds(lambda digits, sign: sign * 10**digits + 7, st.integers(15, 6000), st.sampled_from([1, -1]))
_ints = st.integers() | st.integers(min_value=2**62, max_value=2**70) | _huge
_texts = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(), max_size=30)
_keys = st.none() | st.booleans() | _ints | st.floats(allow_nan=False) | _texts | st.binary(max_size=10)
_leaves = _keys | st.floats(allow_nan=True, allow_infinity=True)
_values = st.recursive(
    _leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(_keys, children, max_size=4)
        | st.frozensets(_keys, max_size=4)
        | st.sets(_keys, max_size=4)
    ),
    max_leaves=12,
)


def _nested(depth: int, leaf: object) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@settings(max_examples=300, deadline=None)
@given(value=_values | st.builds(_nested, st.integers(0, 80), _huge))
def test_the_channel_carries_any_plain_value_or_refuses_it(value):
    try:
        wire = json.dumps(channel.encode(value))
    except channel.NotPlainData:  # nested past MAX_DEPTH: the solution's reply says so
        return
    assert values_match(channel.loads(wire), value, 0.0)


@settings(max_examples=300, deadline=None)
@given(got=_values, expected=_values)
def test_comparison_and_quoting_are_total(got, expected):
    assert values_match(got, expected) in (True, False)
    assert values_match(got, got) is True or _holds_nan(got)
    for text in (show(got), quote(expected)):
        assert isinstance(text, str) and len(text) <= QUOTE + 3
        text.encode("utf-8")  # loggable


_digits = st.integers(15, 6000).map(lambda n: "-" + "9" * n + " 1e999 " + "3." + "1" * n)


@settings(max_examples=200, deadline=None)
@given(got=_texts | _digits, expected=_texts | _digits | st.just("1.5 nan inf"))
def test_output_comparison_is_total(got, expected):
    assert outputs_match(got, expected) in (True, False)
    assert outputs_match(expected, expected) is True


def _holds_nan(value: object) -> bool:
    if isinstance(value, float):
        return value != value
    if isinstance(value, dict):
        return any(_holds_nan(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_holds_nan(v) for v in value)


def _source(value: object) -> str:
    """Python source that builds ``value`` (ints past the 4300-digit printing limit included)."""
    if type(value) is int:
        return f"int({format(value, 'x')!r}, 16)"
    if type(value) is float:
        return f"float({repr(value)!r})"
    if type(value) in (list, tuple, set, frozenset):
        return f"{type(value).__name__}([{', '.join(_source(v) for v in value)}])"
    if type(value) is dict:
        return "dict([" + ", ".join(f"({_source(k)}, {_source(v)})" for k, v in value.items()) + "])"
    return repr(value)  # None, bool, str (lone surrogates escaped), bytes


@pytest.fixture(scope="module")
def fuzz_grader(strict_sandbox):
    return CodeReward(sandbox=strict_sandbox, timeout=2.0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(got=_values, expected=_values.filter(lambda v: not isinstance(v, (set, frozenset))))
def test_any_returned_value_ends_in_a_per_test_verdict(fuzz_grader, got, expected):
    task = {"fn_name": "f", "tests": {"inputs": [[1]], "outputs": [expected]}}
    result = fuzz_grader(task, f"```python\ndef f(x):\n    return {_source(got)}\n```")
    (record,) = result.metadata["tests"]
    assert result.metadata["graded"] is True and record["status"] in ("ok", "wrong_answer"), record
    wrapped = type(expected) is list and len(expected) == 1 and values_match(got, expected[0])  # TACO's [value]
    assert record["passed"] is (values_match(got, expected) or wrapped), (record, got, expected)
    json.dumps(result.metadata, ensure_ascii=False).encode("utf-8")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(printed=st.binary(max_size=200) | _texts.map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_printed_bytes_end_in_a_verdict(fuzz_grader, printed):
    task = {"tests": [{"input": "", "output": "4\n"}]}
    result = fuzz_grader(task, f"```python\nimport sys\nsys.stdout.buffer.write({printed!r})\n```")
    (record,) = result.metadata["tests"]
    assert result.metadata["graded"] is True and record["status"] in ("ok", "wrong_answer"), record
    json.dumps(result.metadata, ensure_ascii=False).encode("utf-8")
