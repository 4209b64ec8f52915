"""The agent interface: conversation state between an env's text observations and a policy's model outputs.

An agent owns the chat (system prompt, history) and the :class:`~rllm_gym.types.Trajectory` it records; it knows
nothing about how the model is served or how the env grades. The engines drive it::

    agent.reset()
    agent.update_from_env(observation, reward=0.0, done=False, info=info)
    output = await policy.generate(agent.chat_completions)
    action = agent.update_from_model(output)          # records one Step per LLM call
    observation, reward, terminated, truncated, info = env.step(action)
    agent.update_from_env(observation, reward, terminated or truncated, info)
"""

from __future__ import annotations

from typing import Any

from rllm_gym.types import ModelOutput, Step, Trajectory

__all__ = ["BaseAgent"]


class BaseAgent:
    """Turns observations into chat messages and model outputs into actions, recording a Step per LLM call.

    Subclasses set ``system_prompt`` and override :meth:`format_observation` (observation -> user message text) and
    :meth:`parse_action` (model output -> action text) where the default (the observation as is, the reply's
    content) does not fit. ``name`` is the trajectory's role; training groups trajectories by it.
    ``enable_thinking`` is recorded on the agent and changes nothing in its chat: the chat template applies thinking,
    so it is the policy's setting (``HFPolicy(enable_thinking=...)``, ``rllm-gym eval --thinking``, the trainer's
    ``chat_template_kwargs``); the trainer's model record copies an ``enable_thinking`` given in ``agent_args`` into
    the template options it records.

    Example::

        >>> class EchoAgent(BaseAgent):
        ...     system_prompt = "Repeat the question."
        >>> agent = EchoAgent()
        >>> agent.update_from_env("2+2?", 0.0, False, {})
        >>> agent.update_from_model("2+2?")
        '2+2?'
        >>> agent.update_from_env("", 1.0, True, {})
        >>> agent.trajectory.steps[0].reward, len(agent.chat_completions)
        (1.0, 3)
    """

    name: str = "agent"
    system_prompt: str | None = None
    tools_schema: list[dict[str, Any]] | None = None  # sent to the policy for servers that take tools natively

    def __init__(
        self,
        system_prompt: str | None = None,
        *,
        name: str | None = None,
        enable_thinking: bool | None = None,
        max_history_turns: int | None = None,
    ):
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a str or None (no system message), got {system_prompt!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str (the trajectory's name), got {name!r}")
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise ValueError(
                f"enable_thinking must be True, False or None (the template's default), got {enable_thinking!r}"
            )
        if max_history_turns is not None and (
            isinstance(max_history_turns, bool) or not isinstance(max_history_turns, int)
        ):
            raise ValueError(
                f"max_history_turns must be an int >= 1 or None (keep everything), got {max_history_turns!r}"
            )
        if max_history_turns is not None and max_history_turns < 1:
            raise ValueError(f"max_history_turns must be >= 1 or None (keep everything), got {max_history_turns}")
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if name is not None:
            self.name = name
        self.enable_thinking = enable_thinking
        self.max_history_turns = max_history_turns
        self.reset()

    # State

    def reset(self) -> None:
        """Forget the episode: a fresh trajectory and a chat holding only the system prompt."""
        self._trajectory = Trajectory(name=self.name)
        self.messages: list[dict[str, Any]] = []
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})
        self._pending: Step | None = None  # the last Step, waiting for the env's reward

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory

    @property
    def chat_completions(self) -> list[dict[str, Any]]:
        """The messages to send to the model now (system prompt kept, older turns dropped past the history limit)."""
        if self.max_history_turns is None:
            return self.messages
        system = [m for m in self.messages[:1] if m["role"] == "system"]
        rest = self.messages[len(system) :]
        # A turn is one user message and what follows it; keep the last `max_history_turns` of them.
        starts = [i for i, message in enumerate(rest) if message["role"] == "user"]
        keep_from = starts[-self.max_history_turns] if len(starts) > self.max_history_turns else 0
        return system + rest[keep_from:]

    def get_current_state(self) -> Step | None:
        """The most recent Step, or None before the first LLM call."""
        return self._trajectory.steps[-1] if self._trajectory.steps else None

    # Hooks for subclasses

    def format_observation(self, observation: Any, info: dict[str, Any]) -> str:
        """The user message for an observation."""
        return observation if isinstance(observation, str) else str(observation)

    def parse_action(self, output: ModelOutput) -> str:
        """The action text for the env: by default the reply without its reasoning."""
        return output.content if output.reasoning or output.tool_calls else output.text

    # Updates

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict[str, Any]) -> None:
        """Give the reward to the last Step and, unless the episode is over, add the observation to the chat."""
        if self._pending is not None:
            # Typed here by construction; writing __dict__ skips pydantic's per-assignment validation, which would
            # otherwise be a tenth of the engine's CPU per LLM call.
            self._pending.__dict__.update(reward=float(reward), done=bool(done), info=dict(info))
            self._pending = None
        if done:
            return
        self.messages.append({"role": "user", "content": self.format_observation(observation, info)})

    def update_from_model(self, response: ModelOutput | str) -> str:
        """Record the model's reply as a new Step and return the action text to send to the env."""
        output = response if isinstance(response, ModelOutput) else ModelOutput(text=response, content=response)
        action = self.parse_action(output)
        prompt = self.chat_completions
        observation = prompt[-1]["content"] if prompt and prompt[-1]["role"] == "user" else None
        step = Step(
            output=output.text,
            action=action,
            observation=observation,
            thought=output.reasoning,
            model_response=output.text,
            model_output=output,
        )
        reply = {"role": "assistant", "content": output.text}
        # Already-typed values are shared rather than re-validated (validation copies every list and dict): the
        # token lists are the ModelOutput's own, and the chat is a new list of the same message dicts (messages are
        # never changed once appended), so a long episode costs O(turns) rather than O(turns^2).
        step.__dict__.update(
            chat_completions=[*prompt, reply],
            prompt_ids=output.prompt_ids,
            response_ids=output.completion_ids,
            logprobs=output.logprobs,
        )
        self.messages.append(reply)
        self._trajectory.steps.append(step)
        self._pending = step
        return action
