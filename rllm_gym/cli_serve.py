"""``rllm-gym serve ENV_ID --port N``: one registered env over the OpenEnv protocol
(:mod:`rllm_gym.integrations.openenv`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_serve_parser", "run_serve"]


def add_serve_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve an env over the OpenEnv protocol (HTTP + WebSocket sessions, one env per session)",
        description="Serve ENV_ID over OpenEnv's protocol until interrupted; clients: gym.make('rllm/OpenEnv-v0', "
        "base_url='http://HOST:PORT'), OpenEnv's EnvClient, or any trainer that speaks OpenEnv.",
    )
    serve.add_argument("env_id", help="a registered single-agent id (rllm-gym list)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    serve.add_argument(
        "--max-sessions", type=int, default=8, help="WebSocket sessions (envs) at once; more are refused (default: 8)"
    )
    serve.add_argument(
        "--env-kwargs", type=json_object, default={}, help="the env's arguments as a JSON object, e.g. '{\"size\": 4}'"
    )


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"--env-kwargs must be a JSON object: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--env-kwargs must be a JSON object, got {type(value).__name__}")
    return value


def run_serve(args: argparse.Namespace) -> int:
    from rllm_gym.integrations.openenv import serve

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")

    def ready(url: str) -> None:
        print(f"serving {args.env_id} over OpenEnv at {url} (Ctrl-C stops)", flush=True)

    serve(
        args.env_id,
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        env_kwargs=args.env_kwargs,
        on_ready=ready,
    )
    return 0
