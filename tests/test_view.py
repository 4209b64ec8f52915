"""``rllm-gym view``: a whole file, an index, a range, ids, a task or a termination reason; selections that miss say
what the file holds and exit 2; model text (rich markup, emoji codes) prints exactly as written. Driven as the command
line, with the selection logic also tested on its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rllm_gym.types import Episode, ModelOutput, Step, TerminationReason, ToolCall, Trajectory
from rllm_gym.view import Selection, SelectionError, parse_range, select_episodes

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
TRACEBACK = 'Traceback (most recent call last):\n  File "env.py", line 3, in step\n    raise ValueError("[/]")\n'
MARKUP = "[bold]x[/bold] then [/] then [red]unclosed, :smile: and [link=https://example.com]y[/link] \\[z]"


def make_episode(episode_id: str, reply: str = "Action: left", reason=TerminationReason.ENV_DONE, **extra) -> Episode:
    chat = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Your move?"}]
    output = ModelOutput(text=reply, content=reply, prompt_length=9, completion_length=3, **extra.pop("output", {}))
    step = Step(chat_completions=[*chat, {"role": "assistant", "content": reply}], model_output=output, reward=1.0)
    trajectory = Trajectory(name=extra.pop("role", "agent"), steps=[step], reward=1.0)
    return Episode(id=episode_id, termination_reason=reason, trajectories=[trajectory], **extra)


def write(path, episodes):
    path.write_text("".join(episode.to_json() + "\n" for episode in episodes))
    return path


def view(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rllm_gym.cli", "view", *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=120)


@pytest.fixture
def five(tmp_path):
    ids = ["a:0", "a:1", "b:0", "b:1", "c:0"]
    reasons = {"b:1": TerminationReason.ERROR}
    episodes = [make_episode(i, f"reply of {i}", reasons.get(i, TerminationReason.ENV_DONE)) for i in ids]
    return write(tmp_path / "episodes.jsonl", episodes)


def headers(stdout: str) -> list[str]:
    """The '#N  id' header of each printed episode."""
    return re.findall(r"#(\d+)  (\S+)  ", stdout)


def test_model_text_with_markup_prints_verbatim(tmp_path):
    episode = make_episode(
        "task[/]:0",
        MARKUP,
        reason=TerminationReason.ERROR,
        role="[bold]solver",
        metadata={"error": {"type": "ValueError", "message": f"bad input {MARKUP}", "traceback": TRACEBACK}},
        output={"tool_calls": [ToolCall(name="calc[/]", arguments={"q": "[bold]2+3[/]"})]},
    )
    result = view(str(write(tmp_path / "markup.jsonl", [episode])))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"assistant: {MARKUP}" in lines  # one line, unwrapped, every bracket, backslash and colon kept
    assert f"error: ValueError: bad input {MARKUP}" in lines
    assert TRACEBACK.rstrip() in result.stdout  # what the engine recorded, for `view --id` after an eval's errors
    assert 'tool call: calc[/]({"q": "[bold]2+3[/]"})' in lines
    assert "task[/]:0" in result.stdout and "trajectory '[bold]solver'" in result.stdout
    assert "step 0: reward=1.0 done=False tokens=9+3" in lines
    assert result.stderr == ""


def test_the_whole_file_by_default_and_one_line_each_with_brief(five):
    result = view(str(five))
    assert result.returncode == 0, result.stderr
    assert headers(result.stdout) == [("0", "a:0"), ("1", "a:1"), ("2", "b:0"), ("3", "b:1"), ("4", "c:0")]
    assert "assistant: reply of c:0" in result.stdout
    brief = view(str(five), "--brief")
    assert brief.stdout.splitlines()[3].split() == ["3", "b:1", "error", "correct=False", "reward=1", "turns=1"]
    assert len(brief.stdout.splitlines()) == 5


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--index", "2"], [("2", "b:0")]),
        (["--index", "-1"], [("4", "c:0")]),
        (["--range", "1:3"], [("1", "a:1"), ("2", "b:0")]),
        (["--range", "3:"], [("3", "b:1"), ("4", "c:0")]),
        (["--range", ":2"], [("0", "a:0"), ("1", "a:1")]),
        (["--range=-2:"], [("3", "b:1"), ("4", "c:0")]),
        (["--range", "4:99"], [("4", "c:0")]),  # the end is clipped, as in Python
        (["--id", "c:0", "--id", "a:1"], [("4", "c:0"), ("1", "a:1")]),  # in the order asked
        (["--task", "b"], [("2", "b:0"), ("3", "b:1")]),
        (["--reason", "error"], [("3", "b:1")]),
        (["--range", "0:3", "--reason", "error"], []),
    ],
)
def test_a_selection_prints_those_episodes(five, args, shown):
    result = view(str(five), *args)
    assert headers(result.stdout) == shown
    assert result.returncode == 0, result.stderr
    if not shown:  # none of them failed: an answer, said on stderr, not a failure
        assert result.stderr == f"rllm-gym view: no selected episode of {five} ended with reason 'error'\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--index", "5"], "--index 5 is out of range: the file holds 5 episodes, at 0..4 (or -5..-1 from the end)"),
        (["--index", "-6"], "--index -6 is out of range: the file holds 5 episodes, at 0..4"),
        (["--range", "5:"], "--range 5: selects no episode: the file holds 5 episodes, at 0..4"),
        (["--range", "3:1"], "--range 3:1 selects no episode"),
        (["--id", "a:2"], "no episode has id 'a:2' (5 in the file); did you mean a:1, a:0?"),
        (["--task", "d"], "no episode of task 'd': the file's 5 episodes are of 3 tasks"),
        (
            ["--range", "2-5"],
            "--range must be START:STOP, STOP excluded (2:5, :3, 10:; the last 5: --range=-5:), got '2-5'",
        ),
        (["--index", "1", "--range", "1:2"], "argument --range: not allowed with argument --index"),
        (["--reason", "crashed"], "argument --reason: invalid choice: 'crashed'"),
    ],
)
def test_a_selection_that_misses_exits_2_naming_what_the_file_holds(five, args, message):
    result = view(str(five), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_an_empty_file_says_so(tmp_path):
    empty = write(tmp_path / "empty.jsonl", [])
    result = view(str(empty), "--index", "0")
    assert result.returncode == 2
    assert "--index 0 is out of range: the file holds no episodes" in result.stderr
    whole = view(str(empty))
    assert whole.returncode == 1
    assert whole.stderr == f"rllm-gym view: nothing to show in {empty}: it holds no episodes\n"


@pytest.mark.parametrize(
    ("text", "span"),
    [("2:5", slice(2, 5)), (":3", slice(None, 3)), ("10:", slice(10, None)), ("-5:-1", slice(-5, -1))],
)
def test_parse_range(text, span):
    assert parse_range(text) == span


@pytest.mark.parametrize("text", ["3", "a:b", "1:2:3", ""])
def test_parse_range_rejects_what_is_not_start_stop(text):
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"--range must be START:STOP, STOP excluded (2:5, :3, 10:; the last 5: --range=-5:), got {text!r}"
        ),
    ):
        parse_range(text)


def test_select_episodes_keeps_positions():
    episodes = [make_episode(f"t{i}:0") for i in range(4)]
    assert [p for p, _ in select_episodes(episodes, Selection())] == [0, 1, 2, 3]
    assert [p for p, _ in select_episodes(episodes, Selection(span=slice(-3, -1)))] == [1, 2]
    with pytest.raises(SelectionError, match=re.escape("no episode has id 't9:0', 't8:0' (4 in the file)")):
        select_episodes(episodes, Selection(ids=("t1:0", "t9:0", "t8:0")))


@pytest.mark.parametrize("history", [1, 2, None], ids=["one-turn", "two-turns", "whole-chat"])
def test_every_turn_is_shown_whatever_the_agent_kept_in_context(tmp_path, history):
    """The main job's agent keeps one turn (max_history_turns: 1): each step's chat is not the previous one grown,
    yet every step's new observation and reply are shown, once each, in order."""
    import asyncio

    from rllm_gym.engine import engine_for
    from rllm_gym.policies.scripted import ScriptedPolicy
    from rllm_gym.store import read_episodes

    moves = ["down", "down", "right", "nonsense", "right", "down", "right"]
    agent_args = {"system_prompt": "Reach G.", "observation_template": "{observation}", "max_history_turns": history}
    path = tmp_path / "episodes.jsonl"
    engine = engine_for(
        "rllm/FrozenLake-v0", ScriptedPolicy(moves), agent_args=agent_args, out=path, max_turns=len(moves)
    )
    asyncio.run(engine.run([3], n_rollouts=1))
    (episode,) = read_episodes(path)
    steps = episode.trajectories[0].steps
    assert len(steps) >= 3

    shown = view(str(path))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    replies = [line.removeprefix("assistant: ") for line in lines if line.startswith("assistant: ")]
    assert replies == [step.chat_completions[-1]["content"] for step in steps]
    assert [line for line in lines if line.startswith("system: ")] == ["system: Reach G."]
    # Each step's observation (its last user message) comes right before its reply, and the step line after it.
    text = shown.stdout
    position = 0
    for number, step in enumerate(steps):
        observation = step.chat_completions[-2]["content"]
        found = text.find(f"user: {observation}", position)
        assert found >= 0, f"step {number}'s observation is missing after position {position}:\n{text}"
        position = text.find(f"step {number}: reward=", found)
        assert position > found
    assert text.count("user: ") == len(steps)


@pytest.mark.parametrize(("moves", "reason"), [(["right"] * 3, "env_done"), (["left", "up"], "max_turns_exceeded")])
def test_the_state_an_episode_ended_in_is_shown(tmp_path, moves, reason):
    """The observation after the last reply, which no prompt shows, is kept on the last step and printed after it,
    whether the env ended the episode (the agent on the goal) or the turn limit did."""
    import asyncio

    from rllm_gym.engine import engine_for
    from rllm_gym.envs.frozenlake import FrozenLakeEnv
    from rllm_gym.policies.scripted import ScriptedPolicy
    from rllm_gym.store import read_episodes

    task = {"id": "row", "map": ["SFFG"]}
    path = tmp_path / "episodes.jsonl"
    engine = engine_for("rllm/FrozenLake-v0", ScriptedPolicy(moves), out=path, max_turns=len(moves))
    asyncio.run(engine.run([task], n_rollouts=1))
    (episode,) = read_episodes(path)
    assert episode.termination_reason.value == reason
    env = FrozenLakeEnv()
    env.reset(options={"task": task})
    for move in moves:
        final = env.step(move)[0]
    assert episode.trajectories[0].steps[-1].metadata["final_observation"] == final
    shown = view(str(path))
    assert shown.returncode == 0 and f"ended in: {final.splitlines()[0]}" in shown.stdout
