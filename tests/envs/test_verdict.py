import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.envs import solver_judge, verdict
from rllm_gym.envs.verdict import parse_verdict, read_verdict


def test_the_env_module_re_exports_the_protocol():
    for name in verdict.__all__:
        assert getattr(solver_judge, name) is getattr(verdict, name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<verdict>2</verdict>", 2),
        ("Both check out, but 1 is cleaner. <VERDICT> 1 </Verdict>", 1),
        ("<verdict>1</verdict> ... as I said, <verdict>01</verdict>", 1),
        ("<think>maybe <verdict>2</verdict></think> Final: <verdict>1</verdict>", 1),
        ("<think>maybe <verdict>2</verdict></think> no verdict after thinking", None),
        ("<think>unclosed <verdict>1</verdict>", None),
        ("<verdict>٢</verdict>", None),  # only ASCII digits name a solution
        ("<verdict>99999999999999999999</verdict>", None),
        ("<verdict>-1</verdict>", None),
    ],
)
def test_parse_verdict(text, expected):
    assert parse_verdict(text, 3) == expected


def test_read_verdict_rejects_non_text():
    assert read_verdict(None, 2) == (None, "the reply must be text, got NoneType")


@settings(max_examples=300, deadline=None)
@given(text=st.text(), n=st.integers(min_value=1, max_value=64))
def test_verdict_parser_fuzz_gives_a_number_in_range_or_none(text, n):
    verdict, error = read_verdict(text, n)
    assert (verdict is None) != (error is None)
    assert verdict is None or (isinstance(verdict, int) and 1 <= verdict <= n)


@settings(max_examples=200, deadline=None)
@given(
    noise=st.text(alphabet=st.characters(blacklist_characters="<>")),
    k=st.integers(min_value=1, max_value=8),
    n=st.integers(min_value=1, max_value=8),
)
def test_verdict_parser_fuzz_finds_one_verdict_in_noise(noise, k, n):
    text = f"{noise}<verdict>{k}</verdict>{noise}"
    assert parse_verdict(text, n) == (k if k <= n else None)


@given(st.text(alphabet="ab\n\r\u2028<>/verdict", max_size=60), st.integers(2, 40))
@settings(max_examples=300, deadline=None)
def test_a_cut_quote_keeps_within_its_limit_and_every_line_quoted(text, limit):
    quoted = verdict.quote_solution(text, max_chars=limit)
    assert len(quoted) <= limit
    assert all(line.startswith(verdict.SOLUTION_QUOTE) for line in quoted.split("\n"))
    whole = verdict.quote_solution(text)
    assert whole.startswith(quoted) and (quoted == whole or len(whole) > limit)


def test_the_judge_view_of_line_break_solutions_stays_in_the_observation_space():
    env = solver_judge.parallel_env(tasks=[{"question": "q", "ground_truth": "1"}])
    env.reset(seed=0)
    lines = "\n" * (solver_judge.MAX_TEXT_CHARS - 1)  # three times as long once each line is quoted
    observations, _, _, _, _ = env.step({"solver_0": lines, "solver_1": lines})
    view = observations["judge_0"]
    assert env.observation_space("judge_0").contains(view)
    assert view.count("\nSolution 2:\n> \n> \n") == 1 and view.endswith("k from 1 to 2.")


@pytest.mark.timeout(60)  # unclosed tags and "<" before spaces backtracked: quadratic in a reply of a million chars
def test_verdict_reading_and_quoting_take_linear_time():
    assert read_verdict("<verdict>" * 100_000, 2) == (None, "no <verdict>k</verdict> tag")
    assert read_verdict("</verdict>" + "<verdict>" * 100_000, 2) == (None, "no <verdict>k</verdict> tag")
    assert read_verdict("<verdict>2</verdict>" + "<verdict>" * 100_000, 2) == (2, None)
    assert verdict.quote_solution("<" + " " * 1_000_000 + "verdict>").endswith(" verdict\u203a")
