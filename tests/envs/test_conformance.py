"""Every registered id works wherever Gymnasium and PettingZoo users put it (issue 17).

Single-agent ids: ``gym.make_vec`` in every vectorization mode, pickle / cloudpickle / deepcopy, forked and spawned
worker processes, ``check_env``, render modes, the spec's JSON round trip, ``max_episode_steps`` and invalid
actions. Multi-agent ids: PettingZoo's own test suite, its API conversions, the same process checks and invalid
actions. Rollouts are a few steps of canned text; none of them holds a code block, so no sandbox run is needed.
"""

from __future__ import annotations

import ast
import concurrent.futures
import copy
import importlib
import inspect
import math
import multiprocessing
import pickle
import re
import sys
import warnings

import cloudpickle
import gymnasium as gym
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.env_checker import check_env
from gymnasium.vector.utils import CloudpickleWrapper
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, render_test, seed_test
from pettingzoo.utils.conversions import aec_to_parallel, parallel_to_aec

import rllm_gym  # noqa: F401 - registers the envs
from rllm_gym.registry import ENV_SPECS, env_ids
from rllm_gym.spaces import TextAsArrayWrapper

SINGLE_AGENT_IDS = env_ids(multi_agent=False)
MULTI_AGENT_IDS = env_ids(multi_agent=True)
# Canned replies: a move, a boxed answer, a tool call (it runs on the env's tool threads) and another move.
ACTIONS = (
    "down",
    "The answer is \\boxed{4}",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
    "right",
)
INVALID_ACTIONS = {"bytes": b"down", "None": None, "int": 3, "float": 2.5, "overlong": "overlong"}
WORKER_TIMEOUT_S = 120  # a worker that hangs (a pool inherited through fork) fails the test instead of blocking it


def rollout(env, seed: int, actions=ACTIONS) -> list:
    """Observations, rewards and flags of ``actions`` from ``reset(seed)``; a finished episode is reset (no seed)."""
    observation, _ = env.reset(seed=seed)
    record = [observation]
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        record.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            record.append(env.reset()[0])
    return record


def module_of(env_id: str):
    """The PettingZoo-style module (``env``, ``raw_env``, ``parallel_env``) of a multi-agent id."""
    entry_point = next(spec.entry_point for spec in ENV_SPECS if spec.id == env_id)
    return importlib.import_module(entry_point.partition(":")[0])


def parallel_rollout(env, seed: int, actions=ACTIONS) -> list:
    """A parallel env's episodes: every live agent sends the next canned reply, until ``actions`` run out."""
    record = [env.reset(seed=seed)[0]]
    for action in actions:
        if not env.agents:
            record.append(env.reset()[0])
        observations, rewards, terminations, truncations, _ = env.step(dict.fromkeys(env.agents, action))
        record.append((observations, rewards, terminations, truncations))
    return record


# Vector envs


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_make_vec_sync_and_async_give_the_same_results_through_autoreset(env_id):
    modes = {
        "sync": ("sync", {}),
        "async shared memory (fork)": ("async", {"context": "fork"}),
        "async no shared memory (spawn)": ("async", {"shared_memory": False, "context": "spawn"}),
    }
    results = {}
    for name, (mode, vector_kwargs) in modes.items():
        envs = gym.make_vec(
            env_id, num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs, max_episode_steps=2
        )
        try:
            observations, _ = envs.reset(seed=11)
            record = [observations]
            for action in ACTIONS[:3]:
                observations, rewards, terminations, truncations, _ = envs.step((action, action))
                assert envs.observation_space.contains(observations), name
                record.append((observations, rewards.tolist(), terminations.tolist(), truncations.tolist()))
        finally:
            envs.close()
        assert all(isinstance(text, str) for text in record[0]), f"{name}: a batch of text is a tuple of str"
        results[name] = record
    assert results["async shared memory (fork)"] == results["sync"]
    assert results["async no shared memory (spawn)"] == results["sync"]
    ended = [any(done) for _, _, terminated, truncated in results["sync"][1:] for done in (terminated, truncated)]
    assert any(ended), "max_episode_steps=2 must end an episode within three steps, so autoreset is exercised"


# Processes


CLONES = {
    "pickle": lambda env: pickle.loads(pickle.dumps(env)),
    "cloudpickle": lambda env: cloudpickle.loads(cloudpickle.dumps(env)),
    "deepcopy": copy.deepcopy,
}


@pytest.mark.parametrize("clone", CLONES)
@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_env_replays_the_same_after_a_round_trip(env_id, clone):
    env = gym.make(env_id)
    expected = rollout(env, seed=5)  # the env has run: its threads and worker processes, if any, exist now
    copied = CLONES[clone](env)
    assert rollout(copied, seed=5) == expected
    assert rollout(env, seed=5) == expected  # the original is untouched
    copied.close()
    env.close()


def _in_worker(context: str, env, run) -> list:
    """``run(env)`` in a worker process: forked (inheriting ``env`` as it is) or spawned (``env`` pickled)."""
    if context == "fork":
        fork = multiprocessing.get_context("fork")
        results = fork.SimpleQueue()
        child = fork.Process(target=lambda: results.put(run(env)))
        child.start()
        child.join(WORKER_TIMEOUT_S)
        if child.is_alive():
            child.kill()
            pytest.fail("the env hung in a forked worker")
        return results.get()
    # A spawned worker cannot import this test module: send its functions by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    blob = pickle.dumps(env)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(context)) as pool:
        return pool.submit(CloudpickleWrapper(lambda: run(pickle.loads(blob)))).result(timeout=WORKER_TIMEOUT_S)


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_env_works_in_forked_and_spawned_workers(env_id, context):
    env = gym.make(env_id)
    expected = rollout(env, seed=9)  # run in the parent first: a fork inherits whatever the env has started
    assert _in_worker(context, env, lambda env: rollout(env, seed=9)) == expected
    assert rollout(env, seed=9) == expected  # and the parent's env still works
    env.close()


# Gymnasium conventions


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_check_env_passes_without_warnings(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)  # render modes included: check_env makes the env again in each declared mode
    # On a wrapped env Gymnasium's checker adds exactly one warning of its own, recommending env.unwrapped.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    assert [str(w.message) for w in caught if "different from the unwrapped version" not in str(w.message)] == []
    # The passive checker, which gym.make adds when asked, stays silent through a rollout.
    checked = gym.make(env_id, disable_env_checker=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rollout(checked, seed=0)
    checked.close()
    env.close()


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_render_modes_human_prints_and_ansi_returns_text(env_id, capsys):
    assert {"human", "ansi"} <= set(gym.make(env_id).metadata["render_modes"])
    env = gym.make(env_id, render_mode="ansi")
    env.reset(seed=1)
    text = env.render()
    assert isinstance(text, str) and text
    env.close()
    capsys.readouterr()
    env = gym.make(env_id, render_mode="human")
    env.reset(seed=1)  # human mode renders by itself, on reset and on every step
    assert capsys.readouterr().out.strip() == text.strip()
    assert env.render() is None
    env.step(ACTIONS[0])
    assert capsys.readouterr().out.strip()
    env.close()


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_spec_and_its_json_round_trip_rebuild_the_same_env(env_id):
    env = gym.make(env_id)
    spec = env.spec
    rebuilt_spec = EnvSpec.from_json(spec.to_json())
    assert rebuilt_spec == spec
    assert env_id in spec.pprint(disable_print=True)
    expected = rollout(env, seed=3)
    for source in (spec, rebuilt_spec):
        rebuilt = gym.make(source)
        assert rebuilt.spec == spec
        assert rollout(rebuilt, seed=3) == expected
        rebuilt.close()
    env.close()


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_max_episode_steps_truncates(env_id):
    env = gym.make(env_id, max_episode_steps=1)
    env.reset(seed=0)
    *_, truncated, _ = env.step(ACTIONS[0])
    assert truncated is True
    env.close()


# Invalid actions


def _invalid(env_space, name: str):
    return "x" * (env_space.max_length + 1) if name == "overlong" else INVALID_ACTIONS[name]


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_invalid_actions_get_an_observation_and_the_same_reward(env_id):
    env = gym.make(env_id)
    rewards = {}
    for name in INVALID_ACTIONS:
        env.reset(seed=2)
        observation, reward, terminated, truncated, info = env.step(_invalid(env.action_space, name))
        assert env.observation_space.contains(observation), name
        assert isinstance(reward, float) and math.isfinite(reward), name
        assert isinstance(terminated, bool) and isinstance(truncated, bool), name
        assert info["invalid_action"] is True, name
        rewards[name] = reward
    assert len(set(rewards.values())) == 1, f"every invalid action earns the one documented reward, got {rewards}"
    env.reset(seed=2)
    assert env.step(ACTIONS[0])[4]["invalid_action"] is False
    env.close()


@pytest.mark.parametrize("env_id", MULTI_AGENT_IDS)
@pytest.mark.parametrize("name", INVALID_ACTIONS)
def test_invalid_actions_multi_agent(env_id, name):
    module = module_of(env_id)
    env = module.env()
    env.reset(seed=2)
    for agent in env.agent_iter():
        observation, _, terminated, truncated, _ = env.last()
        assert env.observation_space(agent).contains(observation)
        env.step(None if terminated or truncated else _invalid(env.action_space(agent), name))
        if agent in env.infos and "invalid_action" in env.infos[agent]:
            assert env.infos[agent]["invalid_action"] is True
            assert isinstance(env.rewards[agent], float)
    parallel = module.parallel_env()
    parallel.reset(seed=2)
    while parallel.agents:
        actions = {agent: _invalid(parallel.action_space(agent), name) for agent in parallel.agents}
        observations, rewards, _, _, infos = parallel.step(actions)
        assert all(parallel.observation_space(a).contains(o) for a, o in observations.items())
        acted = [agent for agent, info in infos.items() if "invalid_action" in info]
        assert acted and all(infos[a]["invalid_action"] is True and isinstance(rewards[a], float) for a in acted)


# PettingZoo conventions


@pytest.mark.parametrize("env_id", MULTI_AGENT_IDS)
def test_pettingzoo_tests_pass(env_id):
    module = module_of(env_id)
    parallel_api_test(module.parallel_env(), num_cycles=5)
    seed_test(module.env, num_cycles=5)
    parallel_seed_test(module.parallel_env, num_cycles=5)
    render_test(lambda render_mode=None: module.env(render_mode=render_mode))
    # api_test reads each observation's numpy dtype: text observations pass through TextAsArrayWrapper.
    api_test(TextAsArrayWrapper(module.env()), num_cycles=5)
    api_test(TextAsArrayWrapper(module.raw_env()), num_cycles=5)
    seed_test(lambda: TextAsArrayWrapper(module.env()), num_cycles=5)


@pytest.mark.parametrize("env_id", MULTI_AGENT_IDS)
def test_pettingzoo_conversions(env_id):
    module = module_of(env_id)
    api_test(TextAsArrayWrapper(parallel_to_aec(module.parallel_env())), num_cycles=5)
    parallel_api_test(aec_to_parallel(parallel_to_aec(module.parallel_env())), num_cycles=5)
    # The AEC form gives each agent its dead step right after its move, so it declares itself not parallelizable
    # and PettingZoo's aec_to_parallel refuses it; parallel_env() is the parallel form.
    assert module.env().metadata["is_parallelizable"] is False
    with pytest.raises(AssertionError, match=re.escape("is_parallelizable")):
        aec_to_parallel(module.env())


@pytest.mark.parametrize("env_id", MULTI_AGENT_IDS)
def test_multi_agent_env_round_trips_and_works_in_workers(env_id):
    module = module_of(env_id)
    for factory in (module.env, module.parallel_env):
        env = factory()
        env.reset(seed=4)
        for clone in CLONES.values():
            copied = clone(env)
            assert type(copied) is type(env)
            assert copied.unwrapped.task == env.unwrapped.task
    parallel = module.parallel_env()
    expected = parallel_rollout(parallel, seed=4)
    for clone in CLONES.values():
        assert parallel_rollout(clone(parallel), seed=4) == expected
    for context in ("fork", "spawn"):
        assert _in_worker(context, parallel, lambda env: parallel_rollout(env, seed=4)) == expected


# Dependencies point one way


@pytest.mark.parametrize("env_id", env_ids())
def test_env_modules_do_not_import_agents(env_id):
    entry_point = next(spec.entry_point for spec in ENV_SPECS if spec.id == env_id)
    module = importlib.import_module(entry_point.partition(":")[0])
    tree = ast.parse(inspect.getsource(module))
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert [name for name in imported if name and name.startswith("rllm_gym.agents")] == []
