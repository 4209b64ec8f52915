"""rllm-gym environments inside plain TRL: an ``environment_factory`` for ``trl.GRPOTrainer``.

TRL (>= 1.8) calls ``environment_factory()`` with no arguments for every rollout slot, exposes the instance's public
methods as tools (typed arguments and a Google-style docstring each), calls ``reset(**row)`` with the dataset row
before generation (a returned string is appended to the prompt) and ``get_reward()`` once the rollout is over::

    from trl import GRPOConfig, GRPOTrainer
    from rllm_gym.integrations.trl import dataset_rows, environment_factory

    trainer = GRPOTrainer(
        model="Qwen/Qwen3-0.6B",
        train_dataset=dataset_rows("rllm/FrozenLake-v0", 64),
        environment_factory=environment_factory("rllm/FrozenLake-v0", size=4),
        args=GRPOConfig(max_completion_length=256),
    )

Each kind of action is one tool: FrozenLake ``move(direction)``, Math and ReasoningGym ``submit_answer(answer)``, Code
``submit_solution(code)``, Tool-v0 its own tools (calculator, search, ..., finish, with their JSON schemas); any other
env with text actions gets ``reply(text)``. A tool's result is the env's next observation; once the episode ended
(terminated, or truncated by the env's time limit) every further call answers that it is over, and ``get_reward()``
returns the sum of the step rewards.
"""

from __future__ import annotations

import inspect
import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rllm_gym.registry import ENV_SPECS, make

__all__ = ["ActionTool", "EnvironmentAdapter", "dataset_rows", "environment_factory", "parse_qwen_tool_calls"]

_JSON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


@dataclass(frozen=True)
class ActionTool:
    """The one tool that stands for an env's action: the model calls ``name(argument=value)`` and the env steps with
    ``render(value, env)`` (``env`` the unwrapped env, for envs whose action format is an option)."""

    name: str
    argument: str
    description: str
    argument_description: str
    render: Callable[[str, Any], str]


def _boxed(answer: str, env: Any) -> str:
    if getattr(env, "answer_format", "boxed") == "answer_tag":
        return f"<answer>{answer}</answer>"
    return f"\\boxed{{{answer}}}"


_SUBMIT_ANSWER = ActionTool(
    "submit_answer",
    "answer",
    "Submit your final answer to the problem; it is graded once, exactly.",
    "The final answer alone, e.g. 42 or \\frac{1}{2} (no \\boxed{}, no explanation).",
    _boxed,
)
# Keyed by the unwrapped env's "module:Class": the same class registered under several ids acts the same way.
ACTION_TOOLS: dict[str, ActionTool] = {
    "rllm_gym.envs.frozenlake:FrozenLakeEnv": ActionTool(
        "move",
        "direction",
        "Move one tile on the frozen lake (a move into the edge keeps you in place).",
        "Where to move: one of up, down, left or right.",
        lambda direction, env: direction,
    ),
    "rllm_gym.envs.math:MathEnv": _SUBMIT_ANSWER,
    "rllm_gym.envs.reasoning_gym:ReasoningGymEnv": _SUBMIT_ANSWER,
    "rllm_gym.envs.code:CodeEnv": ActionTool(
        "submit_solution",
        "code",
        "Submit a Python solution; it is run against the task's tests in the sandbox.",
        "The complete Python source of the solution, without Markdown fences.",
        lambda code, env: f"```python\n{code}\n```",
    ),
}
_REPLY = ActionTool("reply", "text", "Send your reply to the environment.", "The reply text.", lambda text, env: text)


class EnvironmentAdapter:
    """One rllm-gym env seen as a TRL environment. :func:`environment_factory` makes a subclass per env id with the
    env's tools as methods; TRL builds it without arguments.

    Only ``reset``, ``get_reward`` and the tools are public: TRL turns every other public method into a tool. The env
    is closed when the adapter is garbage-collected (or by ``_close()``).
    """

    env_id: str = ""
    _env_kwargs: dict[str, Any] = {}

    def __init__(self) -> None:
        self._env = make(self.env_id, **self._env_kwargs)
        self._close = weakref.finalize(self, self._env.close)
        self._return = 0.0
        self._done = True

    def reset(self, **row: Any) -> str:
        """Start an episode from a dataset row: ``seed`` (int) and/or ``task`` (a task dict, or its JSON text);
        other columns (``prompt``, ...) are ignored. Returns the first observation."""
        seed, task = row.get("seed"), row.get("task")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"dataset row field 'seed' must be an int or None, got {seed!r}")
        if isinstance(task, str):
            try:
                task = json.loads(task)
            except json.JSONDecodeError as error:
                raise ValueError(f"dataset row field 'task' must be a task dict or its JSON text: {error}") from None
        options = None if task is None else {"task": task}
        observation, _ = self._env.reset(seed=seed, options=options)
        self._return = 0.0
        self._done = False
        return str(observation)

    def get_reward(self) -> float:
        """The episode return so far: the sum of the step rewards (0.0 when no tool was called)."""
        return self._return

    def _step(self, action: Any) -> str:
        if self._done:
            return f"The episode is over (return {self._return:g}): do not call any more tools."
        observation, reward, terminated, truncated, _ = self._env.step(action)
        self._return += float(reward)
        if terminated or truncated:
            self._done = True
            how = "ended" if terminated else "was cut off (step or tool budget used up)"
            observation = f"{observation}\n\nThe episode {how}; its return is {self._return:g}."
        return str(observation)


def _tool_method(
    name: str,
    description: str,
    parameters: list[tuple[str, type, str, bool]],
    act: Callable[[EnvironmentAdapter, dict[str, Any]], Any],
) -> Callable[..., str]:
    """A method named ``name`` whose signature, annotations and Google-style docstring describe ``parameters``
    (``(argument, type, description, required)``), as ``transformers.utils.get_json_schema`` reads them."""

    ordered = sorted(parameters, key=lambda item: not item[3])  # required arguments first, as Python wants
    names = [argument for argument, _, _, _ in ordered]

    def method(self: EnvironmentAdapter, *args: Any, **arguments: Any) -> str:
        # Unknown keyword arguments from a model are the env's to judge (a malformed call), never a TypeError.
        arguments.update(zip(names, args, strict=False))
        return self._step(act(self, arguments))

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for argument, kind, _, required in ordered:
        annotations[argument] = kind if required else kind | None
        default = inspect.Parameter.empty if required else None
        signature.append(
            inspect.Parameter(argument, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=kind)
        )
    annotations["return"] = str
    lines = [" ".join(description.split()) or f"The {name} tool.", "", "Args:"]
    lines += [f"    {argument}: {' '.join(text.split()) or 'The ' + argument}" for argument, _, text, _ in ordered]
    method.__name__ = method.__qualname__ = name
    method.__doc__ = "\n".join(lines) if ordered else lines[0]
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    return method


def _action_method(tool: ActionTool) -> Callable[..., str]:
    def act(adapter: EnvironmentAdapter, arguments: dict[str, Any]) -> Any:
        value = arguments.get(tool.argument)
        if value is None:
            return ""  # the env's own answer to an empty reply says what it expected
        return tool.render(value if isinstance(value, str) else json.dumps(value), adapter._env.unwrapped)

    return _tool_method(tool.name, tool.description, [(tool.argument, str, tool.argument_description, True)], act)


def _schema_method(schema: dict[str, Any]) -> Callable[..., str]:
    from rllm_gym.types import ModelOutput, ToolCall

    function = schema.get("function", schema)
    name = function["name"]
    properties = function.get("parameters", {}).get("properties", {})
    required = set(function.get("parameters", {}).get("required", []))
    parameters = []
    for argument, prop in properties.items():
        kind = prop.get("type", "string")
        kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
        parameters.append((argument, _JSON_TYPES.get(kind, str), prop.get("description", ""), argument in required))

    def act(adapter: EnvironmentAdapter, arguments: dict[str, Any]) -> Any:
        given = {key: value for key, value in arguments.items() if value is not None or key in required}
        return ModelOutput(tool_calls=[ToolCall(name=name, arguments=given)])

    return _tool_method(name, function.get("description", ""), parameters, act)


def _tools_of(env: Any) -> list[Callable[..., str]]:
    from rllm_gym.envs.tool import ToolEnv

    unwrapped = env.unwrapped
    if isinstance(unwrapped, ToolEnv):
        return [_schema_method(schema) for schema in unwrapped.tools.schemas]
    kind = type(unwrapped)
    return [_action_method(ACTION_TOOLS.get(f"{kind.__module__}:{kind.__qualname__}", _REPLY))]


def environment_factory(env_id: str, **env_kwargs: Any) -> type[EnvironmentAdapter]:
    """A class for ``trl.GRPOTrainer(environment_factory=...)``: each instance holds ``make(env_id, **env_kwargs)``
    and offers its actions as tools. Raises at once for an unknown or multi-agent id and for bad ``env_kwargs``
    (one env is made and closed to read its tools)."""
    if any(spec.id == env_id and spec.multi_agent for spec in ENV_SPECS):
        single = ", ".join(spec.id for spec in ENV_SPECS if not spec.multi_agent)
        raise ValueError(f"{env_id!r} is multi-agent; TRL's environment_factory takes single-agent ids: {single}")
    probe = make(env_id, **env_kwargs)
    try:
        tools = _tools_of(probe)
    finally:
        probe.close()
    names = [tool.__name__ for tool in tools]
    clashes = sorted({"reset", "get_reward"} & set(names))
    if clashes:
        raise ValueError(f"{env_id!r} has tools named {clashes}, which TRL reserves: rename those tools")
    class_name = "".join(part for part in env_id.split("/")[-1].title() if part.isalnum()) + "Environment"
    namespace: dict[str, Any] = {
        "__doc__": f"{env_id} as a TRL environment; tools: {', '.join(names)}.",
        "__module__": __name__,
        "env_id": env_id,
        "_env_kwargs": dict(env_kwargs),
    }
    namespace.update(zip(names, tools, strict=True))
    return type(class_name, (EnvironmentAdapter,), namespace)


def dataset_rows(env_id: str, n: int, *, seed: int = 0, instructions: str | None = None) -> Any:
    """A ``datasets.Dataset`` of ``n`` rows for ``environment_factory(env_id)``: ``seed`` (``seed``, ``seed + 1``,
    ...) picks each row's episode, ``prompt`` is one user message with ``instructions`` (default: to use the tools
    until the episode ends), to which TRL appends the env's first observation."""
    from datasets import Dataset

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"dataset_rows n (the number of rows) must be a positive int, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"dataset_rows seed must be an int, got {seed!r}")
    if instructions is None:
        instructions = f"Solve this {env_id} episode by calling the tools until the environment says it is over."
    prompt = [{"role": "user", "content": instructions.rstrip() + "\n\n"}]
    return Dataset.from_list([{"prompt": prompt, "seed": seed + i} for i in range(n)])


def parse_qwen_tool_calls(tokenizer: Any) -> Any:
    """``tokenizer`` with TRL's Qwen3 response template, for a Qwen-shaped chat template (``<tool_call>`` JSON blocks
    in ChatML) that TRL does not know by its exact text, such as the embedded tiny model's
    (:mod:`rllm_gym.tiny_model`): GRPOTrainer then parses its tool calls instead of refusing the template."""
    from trl.chat_template_utils import qwen3_template

    tokenizer.response_template = qwen3_template
    return tokenizer
