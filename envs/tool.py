"""Tool use as a text environment: the model answers a question by calling tools (calculator, search, python, ...)
over several turns and then submitting a final answer, which is graded by the task's reward function."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import gymnasium as gym

from rllm_gym.envs.base import TextRendering, check_observation_length, checked_grade
from rllm_gym.rewards import RewardFunction
from rllm_gym.spaces import TextSpace
from rllm_gym.tools import (
    BUILTIN_TOOLS,
    MultiTool,
    ParsedReply,
    Tool,
    ToolCallError,
    ToolOutput,
    ToolParser,
    get_parser,
)
from rllm_gym.types import ModelOutput, ToolCall

__all__ = ["DEFAULT_TOOLS", "ToolEnv", "builtin_tasks"]

DEFAULT_TOOLS = ("calculator", "search", "python", "finish")
_OBSERVATION_MAX = 200_000


def builtin_tasks() -> list[dict[str, Any]]:
    """The built-in offline task set: 20 arithmetic problems too large to do by hand (``kind="arithmetic"``, with
    the ``expression`` that solves them) and 14 questions answerable only from the shipped search corpus
    (``kind="lookup"``, with the ``evidence`` document id). Every task has ``id``, ``question``, ``ground_truth``."""
    text = resources.files("rllm_gym.tools").joinpath("tasks.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _validate_task(task: Any) -> dict[str, Any]:
    if not isinstance(task, dict):
        raise ValueError(
            f"options['task'] must be a dict with 'question' and 'ground_truth', got {type(task).__name__}"
        )
    if not isinstance(task.get("question"), str) or not task["question"].strip():
        raise ValueError(f"task['question'] must be a non-empty string, got {task.get('question')!r}")
    if "ground_truth" not in task:
        raise ValueError(
            f"task needs a 'ground_truth' (the answer the reward function compares to); keys: {sorted(task)}"
        )
    task = dict(task)
    if not task.get("id"):
        task["id"] = "tool-" + hashlib.sha1(task["question"].encode()).hexdigest()[:12]
    return task


def _default_reward_fn() -> RewardFunction:
    from rllm_gym.rewards.math import math_reward_fn  # lazy: the grader starts worker processes on first use

    return math_reward_fn


class ToolEnv(TextRendering, gym.Env[str, str]):
    """Answer a question with the help of tools, then submit the answer.

    ## Description
    Each episode is one task (a question with a ground truth). The model replies with text that may contain tool
    calls in the env's format (``parser``); the env runs the calls (concurrently when a reply has several) and
    returns their outputs. A ``finish(response)`` call, or a reply with no tool call at all, is the final answer: it
    is graded by ``reward_fn`` (the math grader by default) and ends the episode. The built-in tasks
    (:func:`builtin_tasks`) need the tools: exact arithmetic on numbers too large to do by hand, and questions about
    a fictional province answerable only from the shipped search corpus.

    ## Action Space
    ``TextSpace(max_length=100_000)``: the model's reply. A :class:`~rllm_gym.types.ModelOutput` is also accepted,
    so that calls an OpenAI-compatible server returned as structured ``tool_calls`` are used as they are. Any other
    action (``bytes``, ``None``, a number, text over 100,000 characters) is one malformed call of kind
    ``invalid_input``: it costs ``malformed_call_penalty`` and the episode goes on.

    ## Observation Space
    ``TextSpace``: after ``reset``, the question. After a tool turn, the tool results in the parser's format (for
    Hermes/Qwen one ``<tool_response>...</tool_response>`` block per call, in call order; a malformed call's block
    holds ``Error: <what was wrong>``), then a line ``Tool calls left: N.``

    ## Prompt Format
    The observation holds no instructions. ``info["system_prompt"]`` (at reset, also :attr:`system_prompt`) holds
    the tool schemas rendered by the parser (for Hermes, the ``<tools>...</tools>`` block Qwen models expect) and a
    line on how to answer. Example Hermes reply: ``<tool_call>{"name": "calculator", "arguments": {"expression":
    "3**45"}}</tool_call>``.

    ## Action Parsing
    ``parser.parse_with_errors`` (see :mod:`rllm_gym.tools.parsers`). Each call is checked against its tool's JSON
    schema. Malformed calls (invalid JSON, no name, unknown tool, wrong argument types, missing required argument)
    are not run: their result block says exactly what was wrong, and each costs ``malformed_call_penalty``. A
    reply whose only calls are malformed does not end the episode.

    ## Starting State
    ``reset(options={"task": {"id", "question", "ground_truth", ...}})`` poses that task; without a task, one is
    drawn (seeded) from ``tasks`` (default: :func:`builtin_tasks`). The tool-call budget is reset.

    ## Rewards
    Each step: ``-malformed_call_penalty`` per malformed call in the reply, at most ``max_reply_penalty`` (0.2) for
    one reply and ``max_episode_penalty`` (0.5) over the episode. The final step adds the reward function's reward
    (math grader: 1.0 correct, 0.0 otherwise), kept within ``reward_bounds`` (default ``(0.0, 1.0)``; a reward
    outside them is clipped and ``info["reward_clipped_from"]`` holds it; a reward function that returns no
    ``RewardOutput`` or a non-finite reward raises ``TypeError``/``ValueError``, see :func:`checked_grade`). Tool
    calls themselves are free. So with ``(low, high) = reward_bounds``: a step earns within ``[min(0, low) -
    min(max_reply_penalty, max_episode_penalty), max(0, high)]`` and an episode within ``[min(0, low) -
    max_episode_penalty, max(0, high)]`` (defaults: steps in [-0.2, 1.0], episodes in [-0.5, 1.0]); both ranges are in
    ``env.metadata["step_reward_range"]`` and ``env.metadata["episode_return_range"]``.

    ## Episode End
    Terminated on ``finish`` or on a reply without tool calls (the answer is graded). Truncated when a reply asks for
    tools after all ``max_tool_calls`` were used (no grading), or by the ``TimeLimit`` wrapper after
    ``max_episode_steps`` (16 for ``gym.make("rllm/Tool-v0")``).

    ## Information
    ``reset``: ``task`` (the task dict), ``system_prompt``, ``tool_names``. Both ``reset`` and ``step``:
    ``tool_calls`` (the well-formed calls, as dicts), ``tool_outputs`` (one ``ToolOutput`` dict per call run),
    ``malformed_calls`` (``{"index", "kind", "message", "text"}`` per malformed call), ``n_tool_calls`` (calls run so
    far), ``tool_calls_left``, ``final_answer`` (the graded text, or None), ``is_correct``, ``reward_metadata`` (the
    reward function's metadata on the final step, else ``{}``), ``invalid_action`` (the action was neither text
    within the action space nor a ModelOutput), ``infra_failed`` (a tool output's metadata said the infrastructure
    failed, e.g. the python tool's sandbox could not run, or on the final step the reward function's metadata said
    its grade came from the infrastructure, e.g. the math-verify worker died; then the engine retries the episode
    and the trainer leaves it out). A tool's own error (a bad expression, a timeout, code that raised) is shown to
    the model as the tool's output: it is the model's to handle.

    ## Arguments
    ``tools`` (names from :data:`~rllm_gym.tools.BUILTIN_TOOLS` or Tool objects, default calculator, search, python,
    finish; or a :class:`~rllm_gym.tools.MultiTool`). ``tool_map`` (dict name -> Tool or typed function, added to
    ``tools``). ``parser`` (``"hermes"``, ``"qwen"``, ``"json"``, ``"openai"`` or a ``ToolParser``, default
    ``"hermes"``). ``reward_fn`` (a :class:`~rllm_gym.rewards.RewardFunction`, default the math grader).
    ``tasks`` (the pool ``reset`` draws from). ``max_tool_calls`` (int, 8). ``tool_timeout`` (seconds per call,
    10.0). ``tool_timeouts`` (dict tool name -> seconds, overriding ``tool_timeout``). ``malformed_call_penalty``
    (float >= 0, 0.05). ``max_reply_penalty`` (float >= 0, 0.2) and ``max_episode_penalty`` (float >= 0, 0.5): the
    caps of that penalty. ``reward_bounds`` (``(low, high)``, ``(0.0, 1.0)``): the range of the graded reward.
    ``render_mode`` (``"human"``: the observation printed after every reset and step;
    ``"ansi"``: ``render()`` returns it; or None). ``mcp_servers`` (streamable-HTTP URLs, stdio commands or dicts
    ``{"command": ..., "args": [...], "env": {...}, "shared": false}`` of MCP servers, see :mod:`rllm_gym.tools.mcp`:
    their tools join ``tools``; the envs of a process share one session, and one stdio process, per server unless
    its entry says ``"shared": false`` (a stateful server: one per env); a server that cannot be started raises
    ``MCPServerError``, one that fails later answers its calls with an error) and ``mcp_timeout`` (seconds per MCP
    call, 10.0).

    Tool calls run on worker threads of the env's own, started on first use in the process that steps the env (a
    pickled, copied or forked env starts its own) and stopped by :meth:`close`.

    ## Version History
    * v0: initial version; text over ``max_length`` became a malformed call instead of a graded answer, and
      ``render_mode="human"`` was added; the malformed-call penalty was capped per reply and per episode and the
      graded reward kept within ``reward_bounds``.
    """

    metadata = {"render_modes": ["human", "ansi"], "render_fps": 1}

    def __init__(
        self,
        tools: Sequence[str | Tool] | MultiTool = DEFAULT_TOOLS,
        tool_map: Mapping[str, Any] | None = None,
        parser: str | ToolParser = "hermes",
        reward_fn: RewardFunction | None = None,
        tasks: Sequence[dict[str, Any]] | None = None,
        max_tool_calls: int = 8,
        tool_timeout: float | None = 10.0,
        tool_timeouts: Mapping[str, float] | None = None,
        malformed_call_penalty: float = 0.05,
        render_mode: str | None = None,
        max_reply_penalty: float = 0.2,
        max_episode_penalty: float = 0.5,
        reward_bounds: tuple[float, float] = (0.0, 1.0),
        mcp_servers: Sequence[str | Sequence[str] | Mapping[str, Any]] = (),
        mcp_timeout: float = 10.0,
    ):
        if isinstance(tools, MultiTool):
            if tool_map:
                raise ValueError("ToolEnv: pass tool_map only with a list of tools, not with a MultiTool")
            self.tools = tools
        elif isinstance(tools, str) or not isinstance(tools, Sequence):
            raise ValueError(
                f"ToolEnv tools must be a list of tool names or Tool objects (built-ins: {', '.join(BUILTIN_TOOLS)}) "
                f"or a MultiTool, got {tools!r}"
            )
        else:
            self.tools = MultiTool(list(tools), tool_map)
        self.parser = get_parser(parser)
        if reward_fn is not None and not callable(reward_fn):
            raise ValueError(f"ToolEnv reward_fn must be callable as reward_fn(task_info, action), got {reward_fn!r}")
        self._reward_fn = reward_fn
        if tasks is not None and (isinstance(tasks, (str, bytes, Mapping)) or not isinstance(tasks, Sequence)):
            raise ValueError(
                f"ToolEnv tasks must be a list of task dicts or None (built-in tasks), got {tasks!r:.100}"
            )
        self.tasks = [_validate_task(task) for task in (builtin_tasks() if tasks is None else tasks)]
        if not self.tasks:
            raise ValueError("ToolEnv tasks is empty: give at least one {'question', 'ground_truth'} task, or None")
        if not isinstance(max_tool_calls, int) or isinstance(max_tool_calls, bool) or max_tool_calls < 0:
            raise ValueError(f"ToolEnv max_tool_calls must be a non-negative int, got {max_tool_calls!r}")
        if tool_timeouts is not None and not isinstance(tool_timeouts, Mapping):
            raise ValueError(f"ToolEnv tool_timeouts must be a dict of tool name -> seconds, got {tool_timeouts!r}")
        for name, limit in {"tool_timeout": tool_timeout, **dict(tool_timeouts or {})}.items():
            if limit is not None and not (
                isinstance(limit, (int, float)) and not isinstance(limit, bool) and 0 < limit < math.inf
            ):
                raise ValueError(f"ToolEnv timeout for {name!r} must be a positive number of seconds, got {limit!r}")
        unknown = sorted(set(tool_timeouts or {}) - set(self.tools.names))
        if unknown:
            raise ValueError(f"ToolEnv tool_timeouts names unknown tools {unknown}; tools: {self.tools.names}")
        if (
            isinstance(malformed_call_penalty, bool)
            or not isinstance(malformed_call_penalty, (int, float))
            or not 0 <= malformed_call_penalty < math.inf
        ):
            raise ValueError(f"ToolEnv malformed_call_penalty must be a number >= 0, got {malformed_call_penalty!r}")
        for name, cap in (("max_reply_penalty", max_reply_penalty), ("max_episode_penalty", max_episode_penalty)):
            if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 <= cap < math.inf:
                raise ValueError(f"ToolEnv {name} must be a finite number >= 0, got {cap!r}")
        if (
            not isinstance(reward_bounds, (tuple, list))
            or len(reward_bounds) != 2
            or not all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in reward_bounds
            )
            or reward_bounds[0] > reward_bounds[1]
        ):
            raise ValueError(
                f"ToolEnv reward_bounds must be (low, high), finite numbers with low <= high, got {reward_bounds!r}"
            )
        self.max_tool_calls = max_tool_calls
        self.tool_timeout = tool_timeout
        self.tool_timeouts = dict(tool_timeouts or {})
        self.malformed_call_penalty = float(malformed_call_penalty)
        self.max_reply_penalty, self.max_episode_penalty = float(max_reply_penalty), float(max_episode_penalty)
        self.reward_bounds = (float(reward_bounds[0]), float(reward_bounds[1]))
        low, high = self.reward_bounds
        worst_step = min(self.max_reply_penalty, self.max_episode_penalty)
        self.metadata = {
            **type(self).metadata,
            "step_reward_range": (min(0.0, low) - worst_step, max(0.0, high)),
            "episode_return_range": (min(0.0, low) - self.max_episode_penalty, max(0.0, high)),
        }
        self._penalty_paid = 0.0
        self.set_render_mode(render_mode)
        self.observation_space = TextSpace(max_length=_OBSERVATION_MAX)
        self.action_space = TextSpace(max_length=100_000)
        self._task: dict[str, Any] = {}
        self._n_tool_calls = 0
        self._done = True
        self._last_observation = ""
        self._mcp_servers = self._add_mcp_tools(mcp_servers, mcp_timeout)

    @property
    def reward_fn(self) -> RewardFunction:
        if self._reward_fn is None:
            self._reward_fn = _default_reward_fn()
        return self._reward_fn

    @property
    def system_prompt(self) -> str:
        """The tools in the parser's format, and how to answer."""
        answer = (
            "Call the finish tool with your final answer when you know it."
            if "finish" in self.tools
            else "Reply without a tool call to give your final answer."
        )
        return f"{self.parser.render_tools(self.tools)}\n\n{answer}"

    # Gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        task = _validate_task(task)
        self._done = True  # until the task is known to fit: a failed reset leaves no episode to step
        check_observation_length(task["question"], self.observation_space)
        self._task = task
        self._n_tool_calls = 0
        self._penalty_paid = 0.0
        self._done = False
        self._last_observation = self._task["question"]
        info = {
            "task": dict(self._task),
            "system_prompt": self.system_prompt,
            "tool_names": self.tools.names,
            **self._info([], [], [], final_answer=None),
        }
        return self.rendered((self._last_observation, info))

    def step(self, action: str | ModelOutput) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._task:
            raise RuntimeError("ToolEnv.step called before reset(): call reset() first")
        if self._done:
            raise RuntimeError("ToolEnv.step called after the episode ended: call reset() first")
        observation, reward, terminated, truncated, info = self._turn(action)
        info["invalid_action"] = not (isinstance(action, ModelOutput) or self.action_space.contains(action))
        return self.rendered((observation, reward, terminated, truncated, info))

    def _add_mcp_tools(self, mcp_servers: Sequence[Any], timeout: float) -> list[Any]:
        # Last in __init__, once every other argument is checked: a server is a process or a session to stop.
        if not mcp_servers:
            return []
        from rllm_gym.tools.mcp import open_mcp_servers

        servers = open_mcp_servers(mcp_servers, timeout=timeout)
        try:
            mcp_tools = [tool for server in servers for tool in server.tools]
            self.tools = MultiTool([*self.tools.tools.values(), *mcp_tools])
        except BaseException:
            for server in servers:
                server.close()
            raise
        return servers

    def close(self) -> None:
        """Stop the tool worker threads (a later step starts new ones) and give back the ``mcp_servers`` sessions
        (a shared one ends with the last env that holds it; this env's MCP tools answer with an error after it)."""
        self.tools.close()
        for server in self._mcp_servers:
            server.close()

    def _turn(self, action: str | ModelOutput) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if isinstance(action, str) and not self.action_space.contains(action):
            limit = self.action_space.max_length
            message = f"a reply must be at most {limit} characters, got {len(action)}"
            reply = ParsedReply(errors=[ToolCallError(index=0, kind="invalid_input", message=message)])
        else:
            reply = self.parser.parse_with_errors(action)
        # Malformed calls: unparsable ones from the parser, then well-formed ones that fail their tool's schema.
        problems: dict[int, ToolOutput] = {
            e.index: ToolOutput(name="invalid_tool_call", error=e.message) for e in reply.errors
        }
        malformed = [{"index": e.index, "kind": e.kind, "message": e.message, "text": e.text} for e in reply.errors]
        slots = (i for i in itertools.count() if i not in problems)  # the call positions between errors
        valid: list[tuple[int, ToolCall]] = []
        for call, index in zip(reply.calls, slots, strict=False):
            message = self.tools.validate(call)
            if message is None:
                valid.append((index, call))
                continue
            problems[index] = ToolOutput(name=call.name, call_id=call.id, error=message)
            kind = "invalid_arguments" if call.name in self.tools else "unknown_tool"
            text = json.dumps(call.arguments, ensure_ascii=False, default=str)[:120]
            malformed.append({"index": index, "kind": kind, "message": message, "text": text})
        malformed.sort(key=lambda item: item["index"])
        # Capped per reply and per episode: one reply of 4,000 empty calls must not outweigh any answer.
        penalty = min(self.malformed_call_penalty * len(problems), self.max_reply_penalty)
        penalty = min(penalty, self.max_episode_penalty - self._penalty_paid)
        self._penalty_paid += penalty
        penalty = -penalty

        finish = next((call for _, call in valid if call.name == "finish"), None)
        if finish is not None:
            return self._grade(str(finish.arguments["response"]), penalty, reply.calls, malformed)
        if not reply.calls and not reply.errors:
            text = (action.text or action.content) if isinstance(action, ModelOutput) else action
            return self._grade(text, penalty, [], malformed)

        left = self.max_tool_calls - self._n_tool_calls
        if valid and left <= 0:
            self._done = True
            self._last_observation = (
                f"No tool calls left (the budget is {self.max_tool_calls}): the episode ends without an answer."
            )
            info = self._info(reply.calls, [], malformed, final_answer=None)
            return self._last_observation, penalty, False, True, info
        to_run, over_budget = valid[:left], valid[left:]
        outputs = self.tools.execute_many(
            [call for _, call in to_run], timeouts=self.tool_timeouts, default_timeout=self.tool_timeout
        )
        self._n_tool_calls += len(to_run)
        results = dict(problems)
        results.update({index: output for (index, _), output in zip(to_run, outputs, strict=True)})
        for index, call in over_budget:
            budget = (
                f"not run: the budget of {self.max_tool_calls} tool calls is used up; call finish with your answer"
            )
            results[index] = ToolOutput(name=call.name, call_id=call.id, error=budget)
        rendered = self.parser.render_results([results[i] for i in sorted(results)])
        left = self.max_tool_calls - self._n_tool_calls
        self._last_observation = f"{rendered}\n\nTool calls left: {left}."[:_OBSERVATION_MAX]
        info = self._info(reply.calls, outputs, malformed, final_answer=None)
        return self._last_observation, penalty, False, False, info

    # Helpers

    def _grade(
        self, answer: str, penalty: float, calls: list[ToolCall], malformed: list[dict[str, Any]]
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        graded = checked_grade(self.reward_fn(self._task, answer), self.reward_fn)
        is_correct = bool(graded.is_correct) if graded.is_correct is not None else graded.reward > 0
        self._done = True
        self._last_observation = "Answer submitted: correct." if is_correct else "Answer submitted: incorrect."
        info = self._info(calls, [], malformed, final_answer=answer, is_correct=is_correct)
        info["reward_metadata"] = dict(graded.metadata)
        info["infra_failed"] = info["infra_failed"] or bool(graded.metadata.get("infra_failed", False))
        low, high = self.reward_bounds
        reward = float(graded.reward)
        if not low <= reward <= high:
            info["reward_clipped_from"] = reward  # a reward function outside the declared bounds: kept in them
            reward = min(max(reward, low), high)
        return self._last_observation, reward + penalty, True, False, info

    def _info(
        self,
        calls: list[ToolCall],
        outputs: list[ToolOutput],
        malformed: list[dict[str, Any]],
        final_answer: str | None,
        is_correct: bool = False,
    ) -> dict[str, Any]:
        return {
            "tool_calls": [call.to_dict() for call in calls],
            "tool_outputs": [output.to_dict() for output in outputs],
            "malformed_calls": malformed,
            "n_tool_calls": self._n_tool_calls,
            "tool_calls_left": self.max_tool_calls - self._n_tool_calls,
            "final_answer": final_answer,
            "is_correct": is_correct,
            "reward_metadata": {},
            "invalid_action": False,
            # A tool that failed by the infrastructure's doing (the python tool's sandbox could not run).
            "infra_failed": any(output.metadata.get("infra_failed") for output in outputs),
        }
