"""Agents: observations into chat messages, model outputs into actions; installed as ``rllm_gym.agents``.

Their interface, :class:`~rllm_gym.agent.BaseAgent`, lives in the core and is re-exported here."""

from rllm_gym.agent import BaseAgent

__all__ = ["BaseAgent"]
