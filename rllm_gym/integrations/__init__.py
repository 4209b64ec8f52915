"""Adapters that take rllm-gym environments to where other tools expect them.

:mod:`rllm_gym.integrations.trl` turns any registered single-agent env into an ``environment_factory`` for plain
``trl.GRPOTrainer``: one tool per kind of action, ``reset(**row)`` from a dataset row, ``get_reward()`` the episode
return.
"""
