"""Agents: observations into chat messages, model outputs into actions; installed as ``rllm_gym.agents``."""
