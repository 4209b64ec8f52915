"""rllm-gym: reinforcement-learning post-training of LLM agents on real Gymnasium and PettingZoo environments.

Importing the package registers every environment under Gymnasium's ``rllm/`` namespace::

    import gymnasium as gym
    import rllm_gym

    env = gym.make("rllm/FrozenLake-v0")
"""

import logging

from rllm_gym.registry import env_ids, make, register_envs

__version__ = "0.1.0"
__all__ = ["__version__", "env_ids", "make", "register_envs"]

logging.getLogger("rllm_gym").addHandler(logging.NullHandler())  # a library prints nothing unless asked
register_envs()
