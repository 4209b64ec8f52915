"""Run any agent program as an episode: ``fn(task, base_url)`` talks to a gateway session, its calls become Steps.

An agent program is a plain function (sync or async) that takes a task and the ``/v1`` URL of its own
:class:`~rllm_gym.gateway.Gateway` session and uses any OpenAI-compatible client there::

    from openai import OpenAI

    def solve(task, base_url):
        client = OpenAI(base_url=base_url, api_key="unused")
        messages = [{"role": "user", "content": task["question"]}]
        reply = client.chat.completions.create(model="policy", messages=messages)
        return reply.choices[0].message.content

    def reward(task, output):
        return float(str(task["answer"]) in (output or ""))

:class:`AgentProgramWorkflow` is a :class:`~rllm_gym.engine.Workflow`, so
:class:`~rllm_gym.engine.AgentWorkflowEngine` runs many programs at once with its timeouts, retries and termination
reasons; :class:`AgentProgramEngine` is that engine with a gateway of its own, and :func:`run_agent_program` runs it
in one call. The Trajectory keeps the program's
``input`` (``{"task": task}``), ``output`` (its return value), ``signals`` and ``reward``: from ``reward_fn(task,
output)`` (a float or a :class:`~rllm_gym.types.RewardOutput`) when given, else what the program posted to
``/sessions/{id}/reward``. A program that raises (or calls ``sys.exit``) ends its episode as ``ERROR``, one that runs
past ``timeout_s`` as ``TIMEOUT``; neither touches the other episodes. A ``reward_fn`` that raises or returns anything
but a finite number (NaN, an infinity, a bool, a string) ends the episode as ``ERROR`` too: its bug surfaces, it is
never a reward. So does a program that returns after one of its calls met a policy failure (a 502 it caught): the
infrastructure failed, and its answer is not the model's to be scored. ``max_turns`` caps the LLM calls of an
episode: the gateway refuses the call after the last one with an OpenAI error (400 ``max_turns_exceeded``, a
``BadRequestError`` to the ``openai`` client), and the episode ends as ``MAX_TURNS_EXCEEDED`` whether the program then
returns (its output is scored) or raises. A program in another process gets its session through
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (:attr:`GatewaySession.environ <rllm_gym.gateway.GatewaySession.environ>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import numbers
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from rllm_gym.engine.common import max_turns_of
from rllm_gym.engine.engine import AgentWorkflowEngine
from rllm_gym.engine.workflow import TerminationEvent, Workflow
from rllm_gym.gateway import Gateway, GatewaySession
from rllm_gym.gateway.protocol import finite_number, unrecordable
from rllm_gym.policies.base import Policy, PolicyError, SamplingParams
from rllm_gym.types import Episode, RewardOutput, TerminationReason, Trajectory

__all__ = ["AgentProgramEngine", "AgentProgramWorkflow", "ProgramExitError", "load_function", "run_agent_program"]

AgentProgram = Callable[[Any, str], Any]
RewardFn = Callable[[Any, Any], Any]


class ProgramExitError(RuntimeError):
    """An agent program or reward function called ``sys.exit()`` or raised another exception that is no ``Exception``
    (``KeyboardInterrupt`` in its thread, ``CancelledError``, ``GeneratorExit``), each of which would end the whole
    run: its episode ends in ERROR, the others run on."""


def load_function(spec: str | Callable[..., Any], what: str = "--agent-program") -> Callable[..., Any]:
    """The function named ``module:function`` (a dotted attribute path after the colon works too), or ``spec`` itself
    when it is already callable."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"{what} must be 'module:function' (e.g. my_agents.solve:run), got {spec!r}")
    module_name, attribute = spec.split(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"{what} {spec}: cannot import {module_name!r} ({error}); run from the folder that holds it or put it "
            "on PYTHONPATH"
        ) from error
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{what} {spec}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{what} {spec} is a {type(target).__name__}, not a function")
    return target


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Await ``fn(*args)``: on the loop when it is async, else in a thread of its own (a program blocks for a whole
    episode, so the default executor's few threads would cap how many run at once). A thread left behind by a
    timeout finishes on its own; its calls then get 404 from the closed session. A ``TimeoutError`` that ``fn`` raises
    is its own failure (a client or grader that timed out), a ``RuntimeError`` here: the engine would read it as the
    episode's ``timeout_s`` and train on the episode as the model's ``TIMEOUT``. A ``sys.exit()`` in ``fn``, or a
    ``CancelledError`` or ``GeneratorExit`` it raises itself, is :class:`ProgramExitError`, this episode's error:
    asyncio lets those out of a task to end the whole run."""
    try:
        return await _await(fn, *args)
    except TimeoutError as exception:  # fn's own (a client's, a grader's): the episode's timeout_s cancels instead
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise RuntimeError(f"{name} raised TimeoutError: {exception}"[:500]) from exception
    except Exception:
        raise
    except asyncio.CancelledError as exception:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # the episode itself is cancelled (its timeout, the run stopping)
            raise
        raise _exit_error(fn, exception) from None
    except KeyboardInterrupt:  # Ctrl-C, while an async program ran on the loop's thread
        raise
    except BaseException as exception:  # sys.exit(), GeneratorExit, ... from the program itself
        raise _exit_error(fn, exception) from None


def _exit_error(fn: Callable[..., Any], exception: BaseException) -> ProgramExitError:
    name = getattr(fn, "__qualname__", None) or repr(fn)
    if isinstance(exception, SystemExit):
        return ProgramExitError(f"{name} called sys.exit({exception.code!r}): return a value (or raise) instead")
    return ProgramExitError(f"{name} raised {type(exception).__name__}: return a value (or raise an Exception)")


async def _await(fn: Callable[..., Any], *args: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            result, error = fn(*args), None
        except Exception as exception:  # handed to the episode, which ends in ERROR
            result, error = None, exception
        except BaseException as exception:  # the program's own (Ctrl-C reaches the main thread, never this one)
            result, error = None, _exit_error(fn, exception)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for it
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="rllm-gym-agent-program", daemon=True).start()
    result = await future
    return await result if inspect.isawaitable(result) else result


def _json_safe(value: Any) -> Any:
    """``value`` when a record's JSON can hold it (the episode is written to JSONL as UTF-8, and pydantic writes
    records no deeper than about 250 levels), else its ``repr``, as UTF-8 can hold it."""
    try:
        json.dumps(value)
        fits = unrecordable(value) is None
    except (TypeError, ValueError, RecursionError):
        fits = False
    if fits:
        return value
    try:
        text = repr(value)
    except Exception:  # a repr that raises, or recurses past the limit: the program's output still ends its episode
        return f"<{type(value).__name__} without a repr>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate as its escape


class AgentProgramWorkflow(Workflow):
    """One episode of an agent program: a gateway session, ``agent_program(task, base_url)``, then the reward.

    Args:
        policy: the gateway's policy (the engine passes it; the gateway already holds it).
        gateway: a started :class:`~rllm_gym.gateway.Gateway` shared by every episode.
        agent_program: ``fn(task, base_url)``, sync or async, or ``"module:function"``.
        reward_fn: ``fn(task, output)`` returning a float or a RewardOutput (sync or async), or
            ``"module:function"``; ``None``: the reward the program posted to its session (0 when it posted none).
        name: the trajectory's role name (training groups by task and name).
        max_turns: the most LLM calls per episode (default ``DEFAULT_MAX_TURNS``); the next one is refused and the
            episode ends as ``MAX_TURNS_EXCEEDED``.
        timeout_s: wall time per episode (a program past it ends as ``TIMEOUT``).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        gateway: Gateway,
        agent_program: AgentProgram | str,
        reward_fn: RewardFn | str | None = None,
        name: str = "agent",
        max_turns: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(policy, **kwargs)
        if not isinstance(gateway, Gateway):
            raise TypeError(f"AgentProgramWorkflow(gateway=...) must be a started Gateway, got {gateway!r}")
        self.gateway = gateway
        self.agent_program = load_function(agent_program, "agent_program")
        self.reward_fn = None if reward_fn is None else load_function(reward_fn, "reward_fn")
        self.name = name
        self.max_turns = max_turns_of(max_turns, None, type(self).__name__)

    @property
    def cheap_to_build(self) -> bool:
        return True

    async def run(self, task: Any, uid: str) -> None:
        session = self.gateway.open_session(task, name=self.name, max_turns=self.max_turns)
        trajectory = session.trajectory
        self.commit(trajectory=trajectory)  # committed first: a program that fails keeps the calls it made
        try:
            output = await _call(self.agent_program, task, session.base_url)
        except Exception as error:
            if session.turns_exceeded:  # most likely the refused call's error, raised through the program
                raise TerminationEvent(TerminationReason.MAX_TURNS_EXCEEDED, _turns_message(session)) from error
            raise
        finally:
            with contextlib.suppress(KeyError):
                self.gateway.close_session(session.id)
        trajectory.output = _json_safe(output)
        if session.policy_error is not None:  # the program went on past a 502: what it returned is not the model's
            raise PolicyError(f"a call of this episode met a policy failure: {session.policy_error}")
        if self.reward_fn is not None:
            await self._score(trajectory, task, output)
        if trajectory.steps and trajectory.reward is not None:
            # The trajectory's reward on its last step, so step rewards add up to it (returns, per-step advantages).
            trajectory.steps[-1].__dict__["reward"] = trajectory.reward
        if session.turns_exceeded:
            raise TerminationEvent(TerminationReason.MAX_TURNS_EXCEEDED, _turns_message(session))
        raise TerminationEvent(TerminationReason.ENV_DONE)

    async def _score(self, trajectory: Trajectory, task: Any, output: Any) -> None:
        """The reward_fn's verdict on the trajectory. A value that is not a finite number (a bool, a string, NaN, an
        infinity) is the reward_fn's bug: an error, so the episode ends in ERROR rather than training on it."""
        assert self.reward_fn is not None
        result = await _call(self.reward_fn, task, output)
        if isinstance(result, RewardOutput):
            reward = _finite(result.reward, "RewardOutput.reward")
            signals = {
                k: _finite(float(v) if isinstance(v, bool) else v, f"RewardOutput.metadata[{k!r}]")
                for k, v in result.metadata.items()
                if isinstance(v, int | float)
            }
            trajectory.reward = reward
            if result.is_correct is not None and trajectory.steps:
                trajectory.steps[-1].info["is_correct"] = result.is_correct
            trajectory.signals = {**trajectory.signals, **signals}
        elif isinstance(result, numbers.Real) and not isinstance(result, bool):  # numpy's floats and ints too
            trajectory.reward = _finite(result if isinstance(result, int) else float(result), "its reward")
        else:
            raise TypeError(f"reward_fn must return a float or a RewardOutput, got {type(result).__name__}")


def _finite(value: float, what: str) -> float:
    number = finite_number(value)
    if number is None:
        raise ValueError(f"reward_fn returned {what} = {value!r:.80}: a reward must be a finite number")
    return number


def _turns_message(session: GatewaySession) -> str:
    return f"the program asked for more than max_turns={session.max_turns} LLM calls"


class AgentProgramEngine(AgentWorkflowEngine):
    """An :class:`~rllm_gym.engine.AgentWorkflowEngine` of :class:`AgentProgramWorkflow` with a gateway of its own,
    listening while episodes run (started by ``run``/``stream``, closed when they end).

    ``sampling_params`` are the gateway's defaults for what the program's requests leave out. ``max_turns``: the most
    LLM calls per episode (default ``DEFAULT_MAX_TURNS``, as every engine). ``retry_limit=1`` (the default here): a
    program that raises is not run again, as programs may have side effects.
    """

    def __init__(
        self,
        agent_program: AgentProgram | str,
        policy: Policy,
        *,
        reward_fn: RewardFn | str | None = None,
        sampling_params: SamplingParams | None = None,
        timeout_s: float | None = None,
        name: str = "agent",
        max_turns: int | None = None,
        retry_limit: int = 1,
        **kwargs: Any,
    ) -> None:
        self.gateway = Gateway(policy, sampling_params=sampling_params)
        workflow_args = {
            "gateway": self.gateway,
            "agent_program": load_function(agent_program, "agent_program"),
            "reward_fn": None if reward_fn is None else load_function(reward_fn, "reward_fn"),
            "timeout_s": timeout_s,
            "name": name,
            "max_turns": max_turns_of(max_turns, None, type(self).__name__),
        }
        super().__init__(AgentProgramWorkflow, policy, workflow_args=workflow_args, retry_limit=retry_limit, **kwargs)

    async def stream_pairs(self, pairs: Sequence[Any]) -> AsyncIterator[Episode]:
        started_here = not self.gateway.url
        await self.gateway.start()
        try:
            async for episode in super().stream_pairs(pairs):
                yield episode
        finally:
            if started_here:
                await self.gateway.close()


async def run_agent_program(
    agent_program: AgentProgram | str,
    tasks: Sequence[Any],
    policy: Policy,
    *,
    reward_fn: RewardFn | str | None = None,
    n_rollouts: int = 1,
    **kwargs: Any,
) -> list[Episode]:
    """Run ``agent_program`` on every task ``n_rollouts`` times through a gateway on ``policy``: one Episode each,
    in task and rollout order. ``kwargs`` go to :class:`AgentProgramEngine` (``timeout_s``,
    ``max_turns``, ``n_parallel``, ``sampling_params``, ``out``, ``retry_limit``, ``seed``)."""
    engine = AgentProgramEngine(agent_program, policy, reward_fn=reward_fn, **kwargs)
    return await engine.run(tasks, n_rollouts)
