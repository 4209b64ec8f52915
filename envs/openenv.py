"""Any OpenEnv server as a Gymnasium text environment (``gym.make("rllm/OpenEnv-v0", base_url=...)``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import httpx

from rllm_gym.envs.base import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS, TextRendering
from rllm_gym.integrations import describe_error
from rllm_gym.spaces import TextSpace

__all__ = ["URL_VARIABLE", "EnvServerError", "OpenEnvEnv", "replica_urls"]

URL_VARIABLE = "RLLM_GYM_OPENENV_URL"  # base_url when none is given: one URL, or several separated by commas


# Several replicas: each new env takes the next one, so a process's sessions spread evenly over them.
_NEXT_REPLICA = itertools.count()


class EnvServerError(RuntimeError):
    """The OpenEnv server cannot be used: unreachable (``unreachable`` True), another protocol, or no replica answers
    a ``reset`` (the engines record that episode as ``error``: an infrastructure failure, never a reward)."""

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


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
    Terminated when the server says ``done``, unless its observation says ``truncated`` (then truncated). A server
    that fails during a step (gone, a broken reply) truncates the episode with reward 0.0 and ``info["infra_failed"]``
    True, so the engines record it as ``infra_failed`` (retried, never trained on: the reward is not the env's); the
    next ``reset`` goes to the next replica. A ``reset`` that no replica answers raises :class:`EnvServerError`.

    ## Information
    ``reset`` and ``step``: the observation's ``info`` dict when it has one (``rllm-gym serve`` sends the served env's
    info), plus ``server_metadata`` (OpenEnv's ``metadata``), ``base_url`` (the replica that served it) and, on
    ``step``, ``invalid_action`` and ``infra_failed`` (the served env's own, or True with ``error`` when the server
    failed).

    ## Arguments
    ``base_url``: the server, ``http(s)://host:port`` (``rllm-gym serve ENV_ID`` or any OpenEnv server), or a list of
    replicas' URLs serving the same env: each new env takes the next one in turn, so the sessions of a run spread
    over them, and an env whose replica fails moves on to the next one (see Episode End). Without it, the
    ``RLLM_GYM_OPENENV_URL`` environment variable (one URL, or several separated by commas); with neither, the env
    serves ``serve_env_id`` (default ``rllm/FrozenLake-v0``, made with ``serve_env_kwargs``) itself on a free loopback
    port over the same protocol until ``close()``, and warns that it does (a self-contained check of the protocol:
    registry-wide suites and ``benchmarks/bench_interop.py`` make it so). ``action_field`` (the action's text field;
    default: ``text``, or the action schema's only required string field). ``observation_field`` (default: ``text``
    when the observation has it). ``timeout`` (seconds to connect and for each reply, 30.0). ``render_mode``
    (``"human"``, ``"ansi"`` or None).

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
        self._local: Any = None  # the server this env started itself (no base_url anywhere), stopped by close()
        self._serve = (serve_env_id, dict(serve_env_kwargs or {}))
        self._serves_itself = base_url is None and not os.environ.get(URL_VARIABLE, "").strip()
        if self._serves_itself:
            base_url = self._start_local_server(warn=True)
        self.replicas = replica_urls(base_url)
        self._replica = next(_NEXT_REPLICA) % len(self.replicas)
        self._client: Any = None
        self._client_pid = os.getpid()
        self._failed: tuple[str, str] | None = None  # the server that failed the episode and why, until a reset
        try:
            schema = self._first_schema()
        except BaseException:
            self.close()  # a local server this env started is stopped
            raise
        self.action_field = action_field or self._default_action_field(schema)
        observed = _schema_properties(schema, "observation")
        self.observation_field = observation_field or ("text" if "text" in observed else None)
        if self.observation_field is not None and observed and self.observation_field not in observed:
            raise ValueError(
                f"observation_field {self.observation_field!r} is not a field of {self.base_url}'s observations "
                f"(fields: {sorted(observed)})"
            )
        self.observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS)
        self.action_space = TextSpace(max_length=MAX_ACTION_CHARS)
        self._last_observation = ""

    # Connection

    @property
    def base_url(self) -> str:
        """The replica this env's session is (or will be) on."""
        return self.replicas[self._replica]

    def _next_replica(self) -> None:
        self._drop_client()
        self._replica = (self._replica + 1) % len(self.replicas)

    def _first_schema(self) -> dict[str, Any]:
        """The schema of the first replica, from this env's turn on, that answers it (the env stays on that one)."""
        unreachable = []
        for _ in self.replicas:
            try:
                return self._schema()
            except EnvServerError as error:
                if len(self.replicas) == 1 or not error.unreachable:
                    raise  # one server, or one that answers but speaks another protocol: a configuration error
                unreachable.append(self.base_url)
                self._next_replica()
        raise EnvServerError(f"no OpenEnv replica can be reached ({', '.join(unreachable)})", unreachable=True)

    def _schema(self) -> dict[str, Any]:
        where = f"OpenEnv server {self.base_url}"
        try:
            health = httpx.get(f"{self.base_url}/health", timeout=self.timeout)
            schema = httpx.get(f"{self.base_url}/schema", timeout=self.timeout)
        except httpx.HTTPError as error:
            raise EnvServerError(
                f"{where} cannot be reached ({describe_error(error)}); is it running? "
                "(start one with rllm-gym serve ENV_ID --port N)",
                unreachable=True,
            ) from None
        try:
            answer = schema.json() if health.status_code == 200 and schema.status_code == 200 else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("action"), dict):
            raise EnvServerError(
                f"{self.base_url} does not speak the OpenEnv protocol (GET /health answered {health.status_code}, "
                f"GET /schema {schema.status_code} without an action schema): give base_url the root URL of an "
                "OpenEnv server (e.g. one started with rllm-gym serve ENV_ID --port N)"
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
                f"OpenEnv server {self.base_url} failed during {what} ({describe_error(error)}); the episode "
                "ends as an infrastructure failure"
            ) from error

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # already broken: nothing more to release
                client.close()

    def _start_local_server(self, *, warn: bool = False) -> str:
        from rllm_gym.integrations.openenv import LocalServer

        env_id, env_kwargs = self._serve
        if warn:
            warnings.warn(
                f"rllm/OpenEnv-v0 was made without base_url (nor ${URL_VARIABLE}): it serves {env_id} itself on "
                "loopback, a self-contained check of the protocol. Pass base_url='http://host:port' (a server "
                "started with rllm-gym serve ENV_ID --port N, or any OpenEnv server) to use yours.",
                UserWarning,
                stacklevel=4,
            )
        self._local = LocalServer(env_id, env_kwargs=env_kwargs)
        return self._local.base_url

    def __getstate__(self) -> dict[str, Any]:
        # A copy opens its own session on first use (and, if this env serves itself, starts its own local server).
        return {**self.__dict__, "_client": None, "_local": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._serves_itself:
            self.replicas = [self._start_local_server()]
            self._replica = 0

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
        info["base_url"] = self.base_url
        self._last_observation = text[:MAX_OBSERVATION_CHARS]
        return self._last_observation, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        kwargs: dict[str, Any] = {} if seed is None else {"seed": seed}
        if options:
            kwargs["options"] = options
        self._failed = None
        failures = []
        for _ in self.replicas:  # a replica that fails the reset: the next one (nothing was played yet)
            try:
                result = self._call("reset", lambda client: client.reset(**kwargs))
            except EnvServerError as error:
                failures.append(str(error))
                self._next_replica()
                continue
            return self.rendered(self._observation(result))
        raise EnvServerError(
            failures[0] if len(failures) == 1 else "every OpenEnv replica failed: " + " | ".join(failures)
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        valid = self.action_space.contains(action)
        payload = {self.action_field: action if valid else ""}
        served_by = self.base_url
        try:
            if self._failed is not None:
                served_by, message = self._failed
                raise EnvServerError(message)
            result = self._call("step", lambda client: client.step(payload))
            reward = float(result.reward) if isinstance(result.reward, (int, float)) else 0.0
            if not math.isfinite(reward):
                raise EnvServerError(f"OpenEnv server {served_by} sent a reward of {reward}: a broken server")
        except EnvServerError as error:
            # The episode cannot go on, and its reward is not the env's: truncated, marked for the engines.
            if self._failed is None:
                self._failed = (served_by, str(error))
                self._next_replica()
            info = {"infra_failed": True, "error": str(error), "base_url": served_by, "server_metadata": {}}
            info["invalid_action"] = not valid
            return self.rendered((self._last_observation, 0.0, False, True, info))
        observation, info = self._observation(result)
        info["invalid_action"] = not valid
        info["infra_failed"] = bool(info.get("infra_failed", False))  # a served env's own (its sandbox failed, ...)
        raw = result.observation if isinstance(result.observation, dict) else {}
        done = bool(result.done)
        truncated = done and bool(raw.get("truncated", False))
        return self.rendered((observation, reward, done and not truncated, truncated, info))

    def close(self) -> None:
        """End the session (the server closes its env) and stop the server this env started, if it started one."""
        self._drop_client()
        local, self._local = getattr(self, "_local", None), None
        if local is not None:
            local.stop()


def replica_urls(base_url: Any) -> list[str]:
    """The replicas' URLs of ``base_url`` (one URL or a list; None: ``$RLLM_GYM_OPENENV_URL``), checked."""
    if base_url is None:
        base_url = [url.strip() for url in os.environ.get(URL_VARIABLE, "").split(",") if url.strip()] or None
    if base_url is None:
        raise ValueError(
            "rllm/OpenEnv-v0 needs base_url: the URL of an OpenEnv server, e.g. gym.make('rllm/OpenEnv-v0', "
            "base_url='http://127.0.0.1:8000') after rllm-gym serve rllm/FrozenLake-v0 --port 8000 (or a list of "
            f"replicas' URLs, or the {URL_VARIABLE} environment variable)"
        )
    replicas = [base_url] if isinstance(base_url, str) else base_url
    if not isinstance(replicas, Sequence) or not replicas:
        raise ValueError(f"OpenEnv base_url must be an http(s)://host:port URL or a list of them, got {base_url!r}")
    for url in replicas:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"OpenEnv base_url must be an http(s)://host:port URL (or a list of them), got {url!r}")
    return [url.rstrip("/") for url in replicas]
