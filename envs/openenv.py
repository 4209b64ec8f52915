"""Any OpenEnv server as a Gymnasium text environment (``gym.make("rllm/OpenEnv-v0", base_url=...)``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import httpx

from rllm_gym.envs.base import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS, TextRendering
from rllm_gym.spaces import TextSpace

__all__ = ["EnvServerError", "OpenEnvEnv"]


# Several replicas: each new env takes the next one, so a process's sessions spread evenly over them.
_NEXT_REPLICA = itertools.count()


class EnvServerError(RuntimeError):
    """The OpenEnv server cannot be used: unreachable, another protocol, or gone in the middle of an episode. Raised
    from ``step``, it ends that episode as an infrastructure failure (the engines record it as ``error``)."""


def _schema_properties(schema: dict[str, Any], part: str) -> dict[str, Any]:
    return (schema.get(part) or {}).get("properties") or {}


class OpenEnvEnv(TextRendering, gym.Env[str, str]):
    """An episode on an OpenEnv server, over one WebSocket session (OpenEnv's own client).

    ## Description
    Connects to ``base_url`` (``rllm-gym serve ENV_ID`` or any OpenEnv server), checks that it speaks OpenEnv
    (``GET /health`` and ``GET /schema``), and plays episodes in one session of its own: ``reset`` and ``step`` are
    the server's. The server's env keeps its own state; this env only carries text.

    ## Action Space
    ``TextSpace(max_length=1_000_000)``: the reply, sent as ``{action_field: reply}``. Anything else (``None``, bytes,
    longer text) is sent as ``""`` with ``info["invalid_action"]`` True.

    ## Observation Space
    ``TextSpace(max_length=1_000_000)``: the observation's ``observation_field``; with no such field, the whole
    observation as JSON.

    ## Starting State
    The server's: ``reset(seed=s, options=o)`` sends ``seed`` and ``options`` (``rllm-gym serve`` passes both to its
    env; other servers take what their ``reset`` accepts).

    ## Rewards
    The server's ``reward`` (``None`` is 0.0).

    ## Episode End
    Terminated when the server says ``done``, unless its observation says ``truncated`` (then truncated).

    ## Information
    ``reset`` and ``step``: the observation's ``info`` dict when it has one (``rllm-gym serve`` sends the served env's
    info), plus ``server_metadata`` (OpenEnv's ``metadata``) and, on ``step``, ``invalid_action``.

    ## Arguments
    ``base_url`` (``http(s)://host:port``, or a list of replicas' URLs: each new env takes the next one in turn,
    so ``rllm-gym eval --env rllm/OpenEnv-v0 --env-args '{"base_url": [...]}'`` spreads its sessions;
    None: this env serves ``serve_env_id`` (default ``rllm/FrozenLake-v0``,
    made with ``serve_env_kwargs``) itself on a free loopback port, over the same protocol, until ``close()``: a
    self-contained check of the protocol, used by the tests and ``benchmarks/bench_interop.py``).
    ``action_field`` (the action's text field; default: ``text``, or the
    action schema's only required string field). ``observation_field`` (default: ``text`` when the observation has
    it). ``timeout`` (seconds to connect and for each reply, 30.0). ``render_mode`` (``"human"``, ``"ansi"`` or
    None).

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["human", "ansi"], "render_fps": 4}

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        timeout: float = 30.0,
        render_mode: str | None = None,
        serve_env_id: str = "rllm/FrozenLake-v0",
        serve_env_kwargs: dict[str, Any] | None = None,
    ):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"OpenEnv timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.set_render_mode(render_mode)
        self._local: Any = None
        self._client: Any = None
        self._client_pid = os.getpid()
        self._serve = None if base_url is not None else (serve_env_id, dict(serve_env_kwargs or {}))
        if self._serve is not None:
            base_url = self._start_local_server()
        try:
            self._connect(base_url, action_field, observation_field)
        except BaseException:
            self.close()  # a local server this env started is stopped
            raise
        self.observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS)
        self.action_space = TextSpace(max_length=MAX_ACTION_CHARS)
        self._last_observation = ""

    # Connection

    def _connect(self, base_url: Any, action_field: str | None, observation_field: str | None) -> None:
        if isinstance(base_url, Sequence) and not isinstance(base_url, str):
            replicas = list(base_url)
            if not replicas:
                raise ValueError("OpenEnv base_url is an empty list: give one URL or several replicas' URLs")
            base_url = replicas[next(_NEXT_REPLICA) % len(replicas)]
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"OpenEnv base_url must be an http(s)://host:port URL (or a list of them), got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        schema = self._schema()
        self.action_field = action_field or self._default_action_field(schema)
        observed = _schema_properties(schema, "observation")
        self.observation_field = observation_field or ("text" if "text" in observed else None)
        if self.observation_field is not None and observed and self.observation_field not in observed:
            raise ValueError(
                f"observation_field {self.observation_field!r} is not a field of {self.base_url}'s observations "
                f"(fields: {sorted(observed)})"
            )

    def _start_local_server(self) -> str:
        from rllm_gym.integrations.openenv import LocalServer

        env_id, env_kwargs = self._serve or ("", {})
        self._local = LocalServer(env_id, env_kwargs=env_kwargs)
        return self._local.base_url

    def __getstate__(self) -> dict[str, Any]:
        # A copy opens its own session on first use (and, without base_url, starts its own local server).
        state = self.__dict__.copy()
        state.update(_client=None, _local=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._serve is not None:
            self.base_url = self._start_local_server()

    def _schema(self) -> dict[str, Any]:
        where = f"OpenEnv server {self.base_url}"
        try:
            health = httpx.get(f"{self.base_url}/health", timeout=self.timeout)
            schema = httpx.get(f"{self.base_url}/schema", timeout=self.timeout)
        except httpx.HTTPError as error:
            raise EnvServerError(f"{where} cannot be reached ({type(error).__name__}: {error})") from None
        try:
            answer = schema.json() if health.status_code == 200 and schema.status_code == 200 else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("action"), dict):
            raise EnvServerError(
                f"{self.base_url} does not speak the OpenEnv protocol (GET /health answered {health.status_code}, "
                f"GET /schema {schema.status_code} without an action schema); start one with rllm-gym serve ENV_ID"
            )
        return answer

    def _default_action_field(self, schema: dict[str, Any]) -> str:
        fields = _schema_properties(schema, "action")
        if "text" in fields:
            return "text"
        required = [
            name for name in schema["action"].get("required", []) if fields.get(name, {}).get("type") == "string"
        ]
        if len(required) == 1:
            return required[0]
        raise ValueError(
            f"{self.base_url}'s actions have no single text field (fields: {sorted(fields)}): pass action_field="
        )

    def _session(self) -> Any:
        if self._client is not None and self._client_pid != os.getpid():
            self._client = None  # a forked copy: the client's event-loop thread stayed in the parent
        if self._client is None:
            from openenv.core import GenericEnvClient

            client = GenericEnvClient(
                base_url=self.base_url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout
            ).sync()
            client.connect()
            self._client, self._client_pid = client, os.getpid()
        return self._client

    def _call(self, what: str, run: Any) -> Any:
        try:
            return run(self._session())
        except Exception as error:  # the server went away, refused the session, or broke the protocol
            self._drop_client()
            raise EnvServerError(
                f"OpenEnv server {self.base_url} failed during {what} ({type(error).__name__}: {error}); the episode "
                "ends as an infrastructure failure"
            ) from error

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # already broken: nothing more to release
                client.close()

    # Gymnasium API

    def _observation(self, result: Any) -> tuple[str, dict[str, Any]]:
        observation = result.observation if isinstance(result.observation, dict) else {}
        if self.observation_field is not None:
            text = observation.get(self.observation_field, "")
            text = text if isinstance(text, str) else json.dumps(text, default=str)
        else:
            shown = {key: value for key, value in observation.items() if key != "metadata"}
            text = json.dumps(shown, default=str, sort_keys=True)
        info = dict(observation["info"]) if isinstance(observation.get("info"), dict) else {}
        info["server_metadata"] = result.metadata or observation.get("metadata") or {}
        self._last_observation = text[:MAX_OBSERVATION_CHARS]
        return self._last_observation, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        kwargs: dict[str, Any] = {} if seed is None else {"seed": seed}
        if options:
            kwargs["options"] = options
        result = self._call("reset", lambda client: client.reset(**kwargs))
        return self.rendered(self._observation(result))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        valid = self.action_space.contains(action)
        payload = {self.action_field: action if valid else ""}
        result = self._call("step", lambda client: client.step(payload))
        observation, info = self._observation(result)
        info["invalid_action"] = not valid
        raw = result.observation if isinstance(result.observation, dict) else {}
        done = bool(result.done)
        truncated = done and bool(raw.get("truncated", False))
        reward = float(result.reward) if isinstance(result.reward, (int, float)) else 0.0
        if not math.isfinite(reward):
            raise EnvServerError(f"OpenEnv server {self.base_url} sent a reward of {reward}: a broken server")
        return self.rendered((observation, reward, done and not truncated, truncated, info))

    def close(self) -> None:
        """End the session (the server closes its env) and stop the local server this env started, if any."""
        self._drop_client()
        local, self._local = self._local, None
        if local is not None:
            local.stop()
