import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rllm_gym.types import (
    Episode,
    ModelOutput,
    RewardOutput,
    Step,
    Task,
    TerminationReason,
    ToolCall,
    Trajectory,
    TrajectoryGroup,
)

# JSON-like values: what tasks, inputs and outputs hold once they have been through a JSONL file.
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
json_dicts = st.dictionaries(st.text(max_size=8), json_values, max_size=3)
floats = st.floats(allow_nan=True, allow_infinity=True)

tool_calls = st.builds(ToolCall, name=st.text(min_size=1, max_size=10), arguments=json_dicts)
model_outputs = st.builds(
    lambda text, ids, lp, calls, reason: ModelOutput(
        text=text,
        content=text,
        completion_ids=ids,
        logprobs=lp[: len(ids)] if len(lp) >= len(ids) else [],
        tool_calls=calls,
        completion_length=len(ids),
        finish_reason=reason,
    ),
    st.text(),
    st.lists(st.integers(0, 200_000), max_size=5),
    st.lists(st.floats(max_value=0.0, allow_nan=False), max_size=5),
    st.lists(tool_calls, max_size=2),
    st.sampled_from([None, "stop", "length", "tool_calls"]),
)
steps = st.builds(
    Step,
    input=json_values,
    output=json_values,
    action=json_values,
    reward=floats,
    done=st.booleans(),
    metadata=st.none() | json_dicts,
    prompt_ids=st.lists(st.integers(0, 200_000), max_size=5),
    response_ids=st.lists(st.integers(0, 200_000), max_size=5),
    logprobs=st.lists(floats, max_size=5),
    chat_completions=st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text()}),
        max_size=3,
    ),
    advantage=st.none() | floats,
    observation=json_values,
    thought=st.text(),
    model_response=st.text(),
    model_output=st.none() | model_outputs,
    mc_return=floats,
    info=json_dicts,
)
trajectories = st.builds(
    Trajectory,
    name=st.sampled_from(["agent", "solver", "judge"]),
    task=json_values,
    steps=st.lists(steps, max_size=3),
    reward=st.none() | floats,
    input=st.none() | json_dicts,
    output=json_values,
    signals=st.dictionaries(st.text(max_size=5), floats, max_size=3),
    metadata=st.none() | json_dicts,
)
episodes = st.builds(
    Episode,
    id=st.builds(lambda t, i: f"{t}:{i}", st.text(min_size=1, max_size=12), st.integers(0, 99)),
    task=json_values,
    termination_reason=st.none() | st.sampled_from(list(TerminationReason)),
    is_correct=st.booleans(),
    trajectories=st.lists(trajectories, max_size=3),
    artifacts=json_dicts,
    metrics=json_dicts,
    metadata=json_dicts,
)


def same(a: object, b: object) -> bool:
    """Equality that treats NaN as equal to NaN (a NaN reward must survive the round trip)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@settings(max_examples=60, deadline=None)
@given(episodes)
def test_episode_json_round_trip_is_lossless(episode):
    text = episode.to_json()
    back = Episode.from_json(text)
    assert same(back.to_dict(), episode.to_dict())
    assert back.to_json() == text


@settings(max_examples=60, deadline=None)
@given(episodes)
def test_episode_dict_round_trip_through_json_module(episode):
    data = json.loads(json.dumps(episode.to_dict()))
    back = Episode.from_dict(data)
    assert same(back.to_dict(), episode.to_dict())
    assert same(back.model_dump(mode="json"), data)


def test_nan_and_infinite_rewards_survive_json():
    episode = Episode(id="t:0", trajectories=[Trajectory(reward=math.inf, steps=[Step(reward=math.nan)])])
    back = Episode.from_json(episode.to_json())
    assert back.trajectories[0].reward == math.inf
    assert math.isnan(back.trajectories[0].steps[0].reward)


def test_episode_id_splits_on_last_colon():
    episode = Episode(id="a:b:3")
    assert episode.task_id == "a:b"
    assert episode.rollout_idx == "3"
    assert Episode(id="gsm8k_42:3").task_id == "gsm8k_42"


@pytest.mark.parametrize("bad_id", ["no-colon", ":3", "task:"])
def test_episode_id_without_rollout_index_is_rejected(bad_id):
    with pytest.raises(ValidationError, match=re.escape("is not of the form '{task_id}:{rollout_idx}'")):
        Episode(id=bad_id)


def test_invalid_field_names_the_field():
    with pytest.raises(ValidationError) as excinfo:
        Step(reward="lots")
    assert excinfo.value.errors()[0]["loc"] == ("reward",)
    with pytest.raises(ValidationError) as excinfo:
        Episode.from_dict({"id": "t:0", "trajectories": [{"steps": [{"prompt_ids": ["x"]}]}]})
    assert excinfo.value.errors()[0]["loc"] == ("trajectories", 0, "steps", 0, "prompt_ids", 0)
    with pytest.raises(ValidationError, match="termination_reason"):
        Episode(id="t:0", termination_reason="crashed")


def test_unknown_field_is_rejected():
    with pytest.raises(ValidationError, match="rewrd"):
        Step.from_dict({"rewrd": 1.0})


def test_termination_reason_values():
    assert {reason.value for reason in TerminationReason} == {
        "env_done",
        "max_turns_exceeded",
        "max_prompt_length_exceeded",
        "max_response_length_exceeded",
        "timeout",
        "error",
        "infra_failed",
        "unknown",
    }
    assert Episode(id="t:0", termination_reason="timeout").termination_reason is TerminationReason.TIMEOUT


def test_model_output_logprobs_must_match_completion_ids():
    ModelOutput(completion_ids=[1, 2], logprobs=[-0.1, -0.2])
    with pytest.raises(ValidationError, match="logprobs has 1 entries but completion_ids has 2"):
        ModelOutput(completion_ids=[1, 2], logprobs=[-0.1])


def test_reward_output_and_task():
    out = RewardOutput(reward=1.0, is_correct=True, metadata={"path": "exact"})
    assert RewardOutput.from_dict(out.to_dict()) == out
    with pytest.raises(ValidationError, match=re.escape("a task id must be a non-empty string")):
        Task(id="")


def chat_step(*messages: str) -> Step:
    return Step(
        chat_completions=[
            {"role": "user" if i % 2 == 0 else "assistant", "content": m} for i, m in enumerate(messages)
        ]
    )


def test_is_cumulative():
    assert Trajectory(steps=[chat_step("q"), chat_step("q", "a", "q2")]).is_cumulative()
    assert not Trajectory(steps=[chat_step("q"), chat_step("other", "a", "q2")]).is_cumulative()
    assert Trajectory().is_cumulative()


def test_trajectory_groups_by_task_and_role():
    def episode(task: str, idx: int) -> Episode:
        return Episode(
            id=f"{task}:{idx}",
            trajectories=[Trajectory(name="solver"), Trajectory(name="solver"), Trajectory(name="judge")],
        )

    groups = TrajectoryGroup.from_episodes([episode("math:1", i) for i in range(4)] + [episode("math:2", 0)])
    sizes = {group.group_id: len(group.trajectories) for group in groups}
    assert sizes == {"math:1:solver": 8, "math:1:judge": 4, "math:2:solver": 2, "math:2:judge": 1}
    judge = next(g for g in groups if g.group_id == "math:1:judge")
    assert judge.task_id == "math:1" and judge.name == "judge"
    assert judge.episode_ids == ["math:1:0", "math:1:1", "math:1:2", "math:1:3"]


def test_trajectory_group_checks_parallel_lists():
    with pytest.raises(ValidationError, match="episode_ids has 2 entries for 1 trajectories"):
        TrajectoryGroup(group_id="t:agent", trajectories=[Trajectory()], episode_ids=["t:0", "t:1"])


def _step_ids(n: int) -> list[str]:
    return [Step().id for _ in range(n)]


def test_record_ids_are_unique_within_a_process_and_across_forked_workers():
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        children = pool.map(_step_ids, [200, 200])
    ours = [*_step_ids(200), Trajectory().uid]
    ids = [*ours, *children[0], *children[1]]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    # A forked worker starts from its parent's state: without a new prefix it would repeat the parent's next ids.
    assert {i[:16] for i in ours}.isdisjoint(i[:16] for i in children[0] + children[1])
