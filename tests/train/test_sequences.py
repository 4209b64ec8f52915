import random

import pytest

from rllm_gym.train.sequences import CALL_COST_TOKENS, width_groups


def padded_tokens(widths: list[int], groups: list[list[int]]) -> int:
    return sum(len(rows) * max(widths[row] for row in rows) for rows in groups)


def test_one_long_row_gets_its_own_group_instead_of_widening_every_row():
    widths = [48] * 360 + [108] * 3 + [48] * 5
    groups = width_groups(widths)
    assert groups == [[*range(360), *range(363, 368)], [360, 361, 362]]
    assert padded_tokens(widths, groups) == 365 * 48 + 3 * 108


def test_rows_stay_together_when_splitting_saves_less_than_a_call():
    widths = [48] * 10 + [50] * 10 + [3] * 4  # splitting saves 20 + 4 * 47 tokens < one call
    assert width_groups(widths) == [list(range(24))]
    assert width_groups([48] * 10 + [50] * 10, call_cost=0) == [list(range(10)), list(range(10, 20))]


def test_empty_and_single_rows():
    assert width_groups([]) == []
    assert width_groups([7]) == [[0]]


@pytest.mark.parametrize("seed", range(5))
def test_groups_partition_the_rows_at_the_least_cost(seed):
    rng = random.Random(seed)
    widths = [rng.choice([3, 40, 41, 90, 200, 201, 600]) for _ in range(rng.randint(1, 300))]
    call_cost = rng.choice([0, 100, CALL_COST_TOKENS, 10**6])
    groups = width_groups(widths, call_cost=call_cost)
    assert sorted(row for rows in groups for row in rows) == list(range(len(widths)))
    assert all(rows == sorted(rows) for rows in groups)
    # against every split of the sorted distinct widths into runs (an optimal grouping is one of them)
    distinct = sorted(set(widths))
    best = None
    for mask in range(2 ** (len(distinct) - 1)):
        runs, run = [], [distinct[0]]
        for i, width in enumerate(distinct[1:]):
            if mask >> i & 1:
                runs.append(run)
                run = []
            run.append(width)
        runs.append(run)
        cost = sum(sum(w in run for w in widths) * run[-1] + call_cost for run in runs)
        best = cost if best is None else min(best, cost)
    assert padded_tokens(widths, groups) + call_cost * len(groups) == best
    if call_cost >= sum(widths) * max(widths):
        assert len(groups) == 1
