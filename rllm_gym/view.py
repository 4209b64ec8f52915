"""``rllm-gym view``: pick episodes out of a JSONL file (by position, range, id, task or termination reason) and print
them for people, every chat message, tool call and error exactly as it was written.

Everything that came from a model, an env or a task (message text, ids, error messages, tool arguments) is printed as
a rich :class:`~rich.text.Text`, never parsed as markup: a reply holding ``[bold]x[/bold]``, ``[/]`` or ``:smile:``
prints those characters, it neither loses them nor crashes the viewer.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from rllm_gym.types import Episode, TerminationReason

__all__ = [
    "Selection",
    "SelectionError",
    "new_messages",
    "parse_range",
    "print_brief",
    "print_episode",
    "select_episodes",
]

ROLE_STYLES = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}
REASONS = tuple(reason.value for reason in TerminationReason)


class SelectionError(ValueError):
    """A selection that names no episode of the file: the message says what the file holds."""


@dataclass(frozen=True)
class Selection:
    """Which episodes to show. At most one of ``index``, ``span``, ``ids`` and ``task`` is set (none: every episode);
    ``reason`` then keeps only the episodes that ended that way."""

    index: int | None = None
    span: slice | None = None
    ids: tuple[str, ...] = ()
    task: str | None = None
    reason: str | None = None


def parse_range(text: str) -> slice:
    """``"2:5"`` -> ``slice(2, 5)``: 0-based, end excluded, either end may be left out or negative, as in Python."""
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return slice(int(start) if start.strip() else None, int(stop) if stop.strip() else None)
    except ValueError:
        raise ValueError(
            f"--range must be START:STOP, STOP excluded (2:5, :3, 10:; the last 5: --range=-5:), got {text!r}"
        ) from None


def select_episodes(episodes: Iterable[Episode], selection: Selection) -> list[tuple[int, Episode]]:
    """The selected episodes with their positions in the file; :class:`SelectionError` when a selector misses."""
    episodes = list(episodes)
    count = len(episodes)
    held = f"the file holds {count} episodes, at 0..{count - 1} (or -{count}..-1 from the end)"
    held = held if count else "the file holds no episodes"
    numbered = list(enumerate(episodes))
    if selection.index is not None:
        if not -count <= selection.index < count:
            raise SelectionError(f"--index {selection.index} is out of range: {held}")
        numbered = [numbered[selection.index]]
    elif selection.span is not None:
        start, stop, _ = selection.span.indices(count)
        if start >= count or stop <= start:
            raise SelectionError(f"--range {_slice_text(selection.span)} selects no episode: {held}")
        numbered = numbered[start:stop]
    elif selection.ids:
        found = {episode.id for episode in episodes}
        missing = [wanted for wanted in selection.ids if wanted not in found]
        if missing:
            close = difflib.get_close_matches(missing[0], sorted(found), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SelectionError(f"no episode has id {', '.join(map(repr, missing))} ({count} in the file){hint}")
        order = {wanted: rank for rank, wanted in enumerate(selection.ids)}
        numbered = sorted((item for item in numbered if item[1].id in order), key=lambda item: order[item[1].id])
    elif selection.task is not None:
        numbered = [item for item in numbered if item[1].task_id == selection.task]
        if not numbered:
            tasks = sorted({episode.task_id for episode in episodes})
            close = difflib.get_close_matches(selection.task, tasks, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            spread = f"the file's {count} episodes are of {len(tasks)} tasks"
            raise SelectionError(f"no episode of task {selection.task!r}: {spread}{hint}")
    if selection.reason is not None:
        numbered = [item for item in numbered if _reason(item[1]) == selection.reason]
    return numbered


def _slice_text(span: slice) -> str:
    return ":".join("" if end is None else str(end) for end in (span.start, span.stop))


def _reason(episode: Episode) -> str:
    return episode.termination_reason.value if episode.termination_reason else "unknown"


def print_brief(numbered: list[tuple[int, Episode]], console: Console) -> None:
    """One line per episode: position, id, how it ended, correctness, reward, LLM calls."""
    for position, episode in numbered:
        reward = sum(trajectory.reward or 0.0 for trajectory in episode.trajectories)
        turns = sum(len(trajectory.steps) for trajectory in episode.trajectories)
        line = Text(f"{position:>5}  ")
        line.append(episode.id, style="bold")
        line.append(f"  {_reason(episode)}  correct={episode.is_correct}  reward={reward:g}  turns={turns}")
        if "error" in episode.metadata:
            line.append(f"  {_error_line(episode.metadata['error'])}", style="red")
        console.print(line, soft_wrap=True)


def print_episode(position: int, episode: Episode, console: Console) -> None:
    """The whole episode: a header, the error if it failed, then each trajectory's chat, tool calls and steps."""
    header = Text(f"#{position}  ")
    header.append(episode.id, style="bold")
    header.append(f"  {_reason(episode)}  correct={episode.is_correct}")
    console.rule(header)
    error = episode.metadata.get("error")
    if error is not None:
        console.print(Text.assemble(("error: ", "red"), _error_line(error)), soft_wrap=True)
        if isinstance(error, dict) and error.get("traceback"):
            console.print(Text(str(error["traceback"]).rstrip(), style="dim"), soft_wrap=True)
    for trajectory in episode.trajectories:
        console.rule(Text(f"trajectory {trajectory.name!r}  reward={trajectory.reward}"), style="dim")
        for number, step in enumerate(trajectory.steps):
            for message in new_messages(step.chat_completions, first=number == 0):
                print_message(message, console)
            output = step.model_output
            for call in output.tool_calls if output else []:
                call_text = f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"
                console.print(Text.assemble(("tool call: ", "yellow"), call_text), soft_wrap=True)
            summary = f"step {number}: reward={step.reward} done={step.done}"
            if output is not None:
                # From the local tokenizer or, when the policy has none, the server's `usage`.
                summary += f" tokens={output.prompt_length}+{output.completion_length}"
            console.print(Text(summary, style="bold"))
            final = (step.metadata or {}).get("final_observation")
            if final is not None:  # the state the episode ended in, which no later prompt shows
                console.print(Text.assemble(("ended in: ", "magenta"), str(final)), soft_wrap=True)


def new_messages(chat: list[dict[str, Any]], *, first: bool) -> list[dict[str, Any]]:
    """What a step's chat adds to the episode: all of it at the first step, then what follows the previous reply.

    Each step's chat is the context the agent sent plus the reply. An agent that keeps only its last turns
    (``max_history_turns``) drops earlier messages, so the chat cannot be read as the previous one grown; the previous
    reply is the last assistant message before this step's own, and everything after it (the env's new observation,
    tool results) is new. Without one in the chat (a window of one turn), everything but the system prompt is new.
    """
    if first:
        return list(chat)
    end = len(chat) - 1 if chat and chat[-1].get("role") == "assistant" else len(chat)  # this step's reply
    previous = [i for i, message in enumerate(chat[:end]) if message.get("role") == "assistant"]
    if previous:
        return chat[previous[-1] + 1 :]
    start = 0
    while start < end and chat[start].get("role") == "system":  # the system prompt was shown at the first step
        start += 1
    return chat[start:]


def print_message(message: dict[str, Any], console: Console) -> None:
    role = str(message.get("role", "?"))
    content = message.get("content")
    # A list of content parts (text, images), as the OpenAI format allows, is shown as its JSON.
    text = json.dumps(content, ensure_ascii=False) if isinstance(content, list | dict) else str(content or "")
    console.print(Text.assemble((f"{role}: ", ROLE_STYLES.get(role, "")), text), soft_wrap=True)


def _error_line(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('type', 'Error')}: {error.get('message', '')}"
    return str(error)


def view(path: Path, selection: Selection, console: Console, *, brief: bool = False) -> int:
    """Print the selected episodes of ``path``; the number printed (0 when ``reason`` filtered every one out)."""
    from rllm_gym.store import read_episodes

    numbered = select_episodes(read_episodes(path), selection)
    if brief:
        print_brief(numbered, console)
    else:
        for position, episode in numbered:
            print_episode(position, episode, console)
    return len(numbered)
