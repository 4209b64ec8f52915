"""The agent interface's old home: :class:`~rllm_gym.agent.BaseAgent` lives in the core (``rllm_gym.agent``), so that
the engines import nothing from this folder; ``rllm_gym.agents.base.BaseAgent`` and ``rllm_gym.agents.BaseAgent``
keep naming the same class."""

from rllm_gym.agent import BaseAgent

__all__ = ["BaseAgent"]
