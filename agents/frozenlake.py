"""The FrozenLake agent: the rules of the lake in the system prompt, one move per turn."""

from __future__ import annotations

from typing import Any

from rllm_gym.agents.base import BaseAgent

__all__ = ["FrozenLakeAgent"]

SYSTEM_PROMPT = """You are walking on a frozen lake, shown as a grid.
P is you, _ is frozen ice (safe), O is a hole (the episode ends, no reward) and G is the goal (reward 1).
Each turn, move one tile: up, down, left or right. Moving off the grid leaves you where you are.
Reply with your move as the last line, exactly: Action: <up|down|left|right>"""


class FrozenLakeAgent(BaseAgent):
    """Plays ``rllm/FrozenLake-v0``: the grid as the user message, the reply's last ``Action:`` as the move.

    ``observation_template`` shapes the user message (``{observation}`` is the env's text); a bare
    ``"{observation}"`` keeps sequences short for small models.
    """

    name = "agent"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, *args: Any, observation_template: str = "Current grid:\n{observation}\nYour move?", **kwargs):
        if not isinstance(observation_template, str) or "{observation}" not in observation_template:
            raise ValueError(f"observation_template must contain '{{observation}}', got {observation_template!r}")
        try:  # checked now, not at the first step: any other {field} is a placeholder format() cannot fill
            observation_template.format(observation="")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"observation_template {observation_template!r} has a placeholder other than {{observation}} "
                f"({type(error).__name__}: {error}); write a literal brace as {{{{ or }}}}"
            ) from None
        self.observation_template = observation_template
        super().__init__(*args, **kwargs)

    def format_observation(self, observation: Any, info: dict[str, Any]) -> str:
        return self.observation_template.format(observation=observation)
