import re
import subprocess
import sys

import gymnasium as gym
import pytest

import rllm_gym
from rllm_gym.registry import ENV_SPECS, UnknownEnvError, env_ids, make


def test_every_single_agent_id_is_registered_with_gymnasium():
    for env_id in env_ids(multi_agent=False):
        assert env_id in gym.registry
        assert env_id.startswith("rllm/")


def test_ids_are_unique_and_versioned():
    ids = [spec.id for spec in ENV_SPECS]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"rllm/[A-Za-z]+-v\d+", env_id) for env_id in ids)


def test_module_prefixed_make_works_without_importing_rllm_gym():
    code = "import gymnasium as gym; e = gym.make('rllm_gym:rllm/FrozenLake-v0'); print(e.reset(seed=0)[0])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "P" in result.stdout and "G" in result.stdout


def test_unknown_id_suggests_the_closest():
    with pytest.raises(
        UnknownEnvError,
        match=re.escape("Environment 'rllm/FrozenLak-v0' doesn't exist. Did you mean 'rllm/FrozenLake-v0'?"),
    ):
        make("rllm/FrozenLak-v0")
    with pytest.raises(gym.error.NameNotFound, match="Did you mean"):
        gym.make("rllm/FrozenLakes-v0")


def test_make_returns_gymnasium_env_with_time_limit():
    env = rllm_gym.make("rllm/FrozenLake-v0")
    assert isinstance(env.unwrapped, gym.Env)
    assert env.spec.max_episode_steps == 100


def test_register_envs_is_idempotent():
    rllm_gym.register_envs()
    rllm_gym.register_envs()
    assert sum(1 for env_id in gym.registry if env_id.startswith("rllm/")) == len(env_ids(multi_agent=False))
