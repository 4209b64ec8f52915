"""Any registered rllm-gym env served over the OpenEnv protocol (``rllm-gym serve ENV_ID --port N``).

The server is OpenEnv's own reference server (``openenv.core.env_server.create_app``, from the ``openenv`` package):
HTTP (``/health``, ``/schema``, ``/reset``, ``/step``) and WebSocket sessions (``/ws``), one env per session, at most
``max_sessions`` sessions at once. The action is ``{"text": "<the model's reply>"}``; the observation carries ``text``
(the env's observation), ``truncated`` and ``info`` (the env's info dict, made JSON-safe), next to OpenEnv's own
``reward`` and ``done`` (terminated or truncated). ``reset`` takes ``seed`` and ``options`` as Gymnasium does.
``gym.make("rllm/OpenEnv-v0", base_url=...)`` (:mod:`rllm_gym.envs.openenv`) is the matching client.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import uuid
from collections.abc import Callable
from typing import Any

from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from rllm_gym.registry import ENV_SPECS, make

__all__ = [
    "BodyLimit",
    "GymTextEnvironment",
    "LocalServer",
    "TextAction",
    "TextObservation",
    "create_server_app",
    "listen",
    "serve",
]

logger = logging.getLogger("rllm_gym.integrations.openenv")

MAX_ACTION_CHARS = 1_000_000
MAX_BODY_BYTES = 16 * 1024 * 1024  # an HTTP body or WebSocket message; an action is at most 1,000,000 characters


class TextAction(Action):
    """The model's reply, as the text action every rllm-gym env takes."""

    text: str = Field(max_length=MAX_ACTION_CHARS, description="the model's reply (the env's text action)")


class TextObservation(Observation):
    """The env's text observation, whether the step was a truncation, and the env's info dict (JSON-safe)."""

    text: str = Field(default="", description="the env's observation")
    truncated: bool = Field(default=False, description="the episode was cut off (time limit), not terminated")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict")


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(info, default=str))


class GymTextEnvironment(Environment):
    """One rllm-gym env (``make(env_id, **env_kwargs)``) behind OpenEnv's ``Environment`` interface."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session makes its own env

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None):
        super().__init__()
        self.env_id = env_id
        self.env = make(env_id, **(env_kwargs or {}))
        self._state = State(episode_id=None, step_count=0)
        self._done = True

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TextObservation:
        observation, info = self.env.reset(seed=seed, options=options)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        logger.info("%s: episode %s reset (seed %s)", self.env_id, self._state.episode_id, seed)
        self._done = False
        return TextObservation(text=str(observation), info=_json_safe(info), reward=None, done=False)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        if self._done:
            message = f"{self.env_id}: step after the episode ended; reset first"
            return TextObservation(text="", done=True, reward=0.0, info={"error": message})
        observation, reward, terminated, truncated, info = self.env.step(action.text)
        self._state.step_count += 1
        self._done = bool(terminated or truncated)
        return TextObservation(
            text=str(observation),
            reward=float(reward),
            done=self._done,
            truncated=bool(truncated) and not terminated,
            info=_json_safe(info),
        )

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.env.close()


def create_server_app(env_id: str, *, max_sessions: int = 8, env_kwargs: dict[str, Any] | None = None) -> Any:
    """The FastAPI app serving ``env_id`` (checked now: an unknown or multi-agent id, or bad ``env_kwargs``, raise
    here rather than in the first session)."""
    if any(spec.id == env_id and spec.multi_agent for spec in ENV_SPECS):
        raise ValueError(f"{env_id!r} is multi-agent: the OpenEnv protocol serves one agent per session")
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be a positive int, got {max_sessions!r}")
    GymTextEnvironment(env_id, env_kwargs).close()  # fail fast on a wrong id or wrong kwargs
    app = create_app(
        lambda: GymTextEnvironment(env_id, env_kwargs),
        TextAction,
        TextObservation,
        env_name=env_id.replace("/", "-"),
        max_concurrent_envs=max_sessions,
    )
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    return app


class BodyLimit:
    """ASGI middleware: an HTTP request body over ``max_bytes`` (declared or streamed) is answered 413 before the
    app parses it, so one huge request cannot take the server's memory."""

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"0")
        body, more = b"", True
        if not declared.isdigit() or int(declared) > self.max_bytes:
            more = False
            body = b"x" * (self.max_bytes + 1)
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: the app sees the disconnect below
            body += message.get("body", b"")
            more = message.get("more_body", False) and len(body) <= self.max_bytes
        if len(body) > self.max_bytes:
            detail = json.dumps({"detail": f"request body over {self.max_bytes} bytes"}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(detail)).encode())]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": detail})
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def serve(
    env_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_sessions: int = 8,
    env_kwargs: dict[str, Any] | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``env_id`` until interrupted (uvicorn, one process). The app is built and the address taken first, so
    a wrong id, bad ``env_kwargs`` or a port in use raise before ``on_ready(url)`` is called."""
    import uvicorn

    app = create_server_app(env_id, max_sessions=max_sessions, env_kwargs=env_kwargs)
    listening = listen(host, port)
    config = uvicorn.Config(app, log_level="warning", ws_max_size=MAX_BODY_BYTES)
    if on_ready is not None:
        on_ready(f"http://{host}:{listening.getsockname()[1]}")
    try:
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        listening.close()


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one); OSError in one line naming the address and the fix."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        bound = socket.socket(family, kind, protocol)
    except OSError as error:
        raise OSError(
            f"cannot listen on {host}:{port}: {error.strerror or error}; --host must name this machine"
        ) from None
    try:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind(address)
    except OSError as error:
        bound.close()
        fix = (
            "another process has it: pick another --port"
            if error.errno == errno.EADDRINUSE
            else ("--host must be an address of this machine (127.0.0.1, 0.0.0.0 for every interface)")
        )
        raise OSError(f"cannot listen on {host}:{port} ({error.strerror}): {fix}") from None
    return bound


class LocalServer:
    """``env_id`` served on a free loopback port by a uvicorn server on a thread of this process, until
    :meth:`stop`: what ``rllm/OpenEnv-v0`` connects to when it is given no ``base_url`` (tests, benchmarks)."""

    def __init__(self, env_id: str, *, max_sessions: int = 8, env_kwargs: dict[str, Any] | None = None):
        import threading

        import uvicorn

        app = create_server_app(env_id, max_sessions=max_sessions, env_kwargs=env_kwargs)
        self._socket = listen("127.0.0.1", 0)
        self.base_url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", ws_max_size=MAX_BODY_BYTES)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="rllm-openenv-server", daemon=True
        )
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            self._thread.join(0.01)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"the local OpenEnv server for {env_id!r} did not start")

    def stop(self) -> None:
        """Stop the server (its sessions' envs are closed) and release the port."""
        self._server.should_exit = True
        self._thread.join(10.0)
        self._socket.close()
