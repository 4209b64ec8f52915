"""Adapters that take rllm-gym environments to where other tools expect them.

:mod:`rllm_gym.integrations.trl` turns any registered single-agent env into an ``environment_factory`` for plain
``trl.GRPOTrainer`` (one tool per kind of action, ``reset(**row)`` from a dataset row, ``get_reward()`` the episode
return); :mod:`rllm_gym.integrations.openenv` serves any registered env over the OpenEnv protocol (``rllm-gym
serve``). The other directions live with the envs and tools: ``rllm/OpenEnv-v0`` (:mod:`rllm_gym.envs.openenv`) plays
an OpenEnv server, and :mod:`rllm_gym.tools.mcp` brings MCP servers' tools into ``rllm/Tool-v0``.
"""
