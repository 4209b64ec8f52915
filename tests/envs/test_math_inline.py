"""Math-v0 steps on the engine's event loop only when grading is bounded: math-verify always runs off the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.engine.workflow import SingleTurnWorkflow, inline_call
from rllm_gym.envs.math import MathEnv
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.rewards.math import MathGrader, MathVerifyPool
from rllm_gym.types import RewardOutput


class RecordingPool(MathVerifyPool):
    """A pool that records the thread of every math-verify request and answers "not equal" at once."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.threads: list[int] = []

    def verify(self, gold: str, answer: str, time_limit: float) -> tuple[bool, str]:
        self.threads.append(threading.get_ident())
        return False, "ok"


# Replies covering every path: exact, numeric (right and wrong), words, format errors, symbolic (math-verify),
# garbage that is only a "short answer", an over-long answer, several references.
REPLIES = [
    "\\boxed{42}",
    "so the answer is \\boxed{42.0}",
    "\\boxed{41}",
    "The answer is 42 apples but not really",
    "3 is not it",
    "I do not know.",
    "<think>unclosed",
    "\\boxed{\\frac{84}{2}}",
    "\\boxed{x^2 + 1}",
    "99\x18sum 837 v189",
    "\\boxed{" + "1" * 2000 + "}",
    "#### 6*7",
    "",
]
GOLDS = ["42", "x^2+1", ["41", "42"], ["\\sqrt{2}", "42"], "\\frac{1}{2}"]


@pytest.mark.parametrize("gold", GOLDS)
@pytest.mark.parametrize("reply", REPLIES)
def test_needs_math_verify_says_exactly_whether_grading_asks_math_verify(gold: object, reply: str) -> None:
    pool = RecordingPool()
    grader = MathGrader(pool=pool)
    task = {"question": "q", "ground_truth": gold}
    predicted = grader.needs_math_verify(task, reply)
    cheap = grader.grade_cheaply(task, reply)
    assert not pool.threads  # neither asks math-verify
    graded = grader(task, reply)
    assert predicted == bool(pool.threads) == (cheap is None)
    if cheap is not None:  # the cheap verdict is __call__'s, to the metadata
        assert cheap == graded
    assert not MathGrader(pool=pool, use_math_verify=False).needs_math_verify(task, reply)


def test_math_env_declares_resets_and_cheap_steps_inline_and_math_verify_steps_not() -> None:
    env = MathEnv(reward_config={"pool": RecordingPool()})
    assert inline_call(env, "reset", seed=0)
    env.reset(options={"task": {"question": "q", "ground_truth": "x^2+1"}})
    assert inline_call(env, "step", "\\boxed{x^2+1}")  # exact
    assert inline_call(env, "step", "no answer here at all, sorry")  # format error
    assert inline_call(env, "step", b"bytes")  # invalid action: graded as "", a format error
    assert not inline_call(env, "step", "\\boxed{1 + x^2}")  # symbolic: math-verify
    assert not inline_call(env, "render")

    def custom(task: dict, action: str) -> RewardOutput:
        return RewardOutput(reward=0.0, is_correct=False)

    custom_env = MathEnv(reward_fn=custom)
    custom_env.reset(seed=0)
    assert inline_call(custom_env, "reset") and not inline_call(custom_env, "step", "\\boxed{1}")


@pytest.mark.parametrize(("reply", "on_loop"), [("\\boxed{7}", True), ("\\boxed{1 + x^2}", False)])
def test_the_engine_grades_a_math_verify_answer_off_its_event_loop(reply: str, on_loop: bool) -> None:
    pool = RecordingPool()
    env_thread: list[int] = []

    class Env(MathEnv):
        def step(self, action: str):  # type: ignore[override]
            env_thread.append(threading.get_ident())
            return super().step(action)

    workflow = SingleTurnWorkflow(
        ScriptedPolicy([reply]),
        env=lambda: Env(reward_config={"pool": pool}),
        agent_cls=MathAgent,
    )

    async def run() -> tuple[int, object]:
        task = {"question": "What is x^2 + 1 at 0, plus 6?", "ground_truth": "x^2+1" if not on_loop else "7"}
        episode = await workflow.run_with_termination_handling(task, "t:0")
        return threading.get_ident(), episode

    loop_thread, episode = asyncio.run(run())
    assert episode.trajectories[0].steps[0].reward == (1.0 if on_loop else 0.0)
    assert (env_thread == [loop_thread]) is on_loop
    assert all(thread != loop_thread for thread in pool.threads)
    assert bool(pool.threads) is not on_loop


@pytest.mark.parametrize(
    "reply",
    [
        "42 <think> and then the reply was cut",  # unclosed <think>: a format error, not the "42" before it
        '<tool_call>{"name": "f", "arguments": {}}</tool_call> 42',  # no tools here: the markup is text
        "<think>it is 41</think> \\boxed{42}",
        "it is 41</think> so \\boxed{42}",  # the template opened the block
        "\\boxed{42}",
    ],
)
def test_an_episode_grades_the_whole_reply_as_a_reward_function_on_the_completion_does(reply: str) -> None:
    from rllm_gym.rewards.math import math_reward_fn

    task = {"question": "What is 6 * 7?", "ground_truth": "42"}
    workflow = SingleTurnWorkflow(ScriptedPolicy([reply]), env="rllm/Math-v0", agent_cls=MathAgent)
    episode = asyncio.run(workflow.run_with_termination_handling(task, "t:0"))
    (step,) = episode.trajectories[0].steps
    expected = math_reward_fn(task, reply)
    assert step.action == reply
    assert (step.reward, step.info["extracted_answer"]) == (expected.reward, expected.metadata["extracted_answer"])


class CountingGrader(MathGrader):
    """The math grader, counting the replies it grades (cheaply or not)."""

    def _grade(self, task_info: dict, action: str, cheap_only: bool) -> RewardOutput | None:
        object.__setattr__(self, "graded", getattr(self, "graded", 0) + 1)
        return super()._grade(task_info, action, cheap_only)


@pytest.mark.parametrize("reply", REPLIES)
def test_a_step_decided_inline_is_graded_once_and_as_a_fresh_env_grades_it(reply: str) -> None:
    task = {"question": "q", "ground_truth": ["41", "42"]}
    grader = CountingGrader(pool=RecordingPool())
    env, fresh = MathEnv(reward_fn=grader), MathEnv(reward_config={"pool": RecordingPool()})
    env.reset(options={"task": task})
    fresh.reset(options={"task": task})
    on_loop = inline_call(env, "step", reply)
    graded_inline = grader.graded
    assert env.step(reply)[1:] == fresh.step(reply)[1:]
    assert grader.graded == graded_inline + (0 if on_loop else 1)  # the inline verdict is not graded again


def test_a_kept_inline_verdict_serves_only_the_step_of_that_action_on_that_task() -> None:
    grader = CountingGrader(pool=RecordingPool())
    env = MathEnv(reward_fn=grader, max_turns=3)
    env.reset(options={"task": {"question": "q", "ground_truth": "42"}})
    assert inline_call(env, "step", "\\boxed{41}")
    assert env.step("\\boxed{42}")[1] == 1.0  # another action: graded itself, not with the 41's verdict
    env.reset(options={"task": {"question": "q", "ground_truth": "7"}})
    assert inline_call(env, "step", "\\boxed{7}")
    env.reset(options={"task": {"question": "q", "ground_truth": "8"}})
    assert env.step("\\boxed{7}")[1] == 0.0  # another task since: graded against it
