"""The solver-judge game as a PettingZoo environment: ``rllm/SolverJudge-v0``, in the AEC and the parallel API.

Like a PettingZoo module, this one exposes ``env()`` (the AEC env wrapped with PettingZoo's ``OrderEnforcingWrapper``),
``raw_env`` (the unwrapped AEC class) and ``parallel_env()``; ``rllm_gym.make("rllm/SolverJudge-v0")`` and
``rllm_gym.make("rllm/SolverJudge-v0", parallel=True)`` build them by id. Both APIs share the rules in
:class:`_SolverJudgeRules`, so the same seed poses the same task and the same replies earn the same rewards.

The game's protocol, the judge's view (:func:`judge_observation`) and the parsing of its pick (:func:`read_verdict`),
lives in :mod:`rllm_gym.envs.verdict` and is re-exported here. The judge's system prompt is its agent's
(:data:`rllm_gym.agents.solver_judge.JUDGE_SYSTEM_PROMPT`); neither module imports the other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import wrappers

from rllm_gym.data import Dataset, MathTaskGenerator, load_dataset, map_math_row
from rllm_gym.envs.verdict import SOLUTION_QUOTE, judge_observation, parse_verdict, quote_solution, read_verdict
from rllm_gym.rewards import RewardFunction
from rllm_gym.rewards.math import MathGrader
from rllm_gym.rewards.side_by_side import grade_side_by_side
from rllm_gym.spaces import TextSpace
from rllm_gym.types import RewardOutput

__all__ = [
    "MAX_TEXT_CHARS",
    "SOLUTION_QUOTE",
    "SolverJudgeEnv",
    "SolverJudgeParallelEnv",
    "env",
    "judge_observation",
    "parallel_env",
    "parse_verdict",
    "quote_solution",
    "raw_env",
    "read_verdict",
]

MAX_TEXT_CHARS = 1_000_000  # longest question, and longest solution shown to the judge
MAX_SOLVERS = 64
JUDGE = "judge_0"


def _role(agent: str) -> str:
    return agent.rpartition("_")[0]


class _SolverJudgeRules:
    """The game both APIs share: arguments, task drawing, grading, observations and infos."""

    # Not parallelizable in PettingZoo's sense: in the AEC form each agent takes its dead step right after acting,
    # so ``aec_to_parallel`` does not apply; the native parallel form is ``parallel_env()``.
    metadata: dict[str, Any] = {
        "name": "solver_judge_v0",
        "render_modes": ["human", "ansi"],
        "is_parallelizable": False,
        "rllm_gym.inline_step": False,
    }

    def __init__(
        self,
        tasks: Dataset | Sequence[Mapping[str, Any]] | str | os.PathLike[str] | None = None,
        grader: RewardFunction | None = None,
        n_solvers: int = 2,
        invalid_verdict_reward: float = 0.0,
        render_mode: str | None = None,
        grading_time_limit: float = 20.0,
    ):
        if (
            isinstance(grading_time_limit, bool)
            or not isinstance(grading_time_limit, (int, float))
            or not 0 < grading_time_limit <= 600
        ):
            raise ValueError(
                f"grading_time_limit must be a number of seconds in (0, 600], got {grading_time_limit!r}; it bounds "
                "one round's grading (every solver's grade together)"
            )
        self.grading_time_limit = float(grading_time_limit)
        if not isinstance(n_solvers, int) or isinstance(n_solvers, bool) or not 1 <= n_solvers <= MAX_SOLVERS:
            raise ValueError(f"n_solvers must be an int in [1, {MAX_SOLVERS}], got {n_solvers!r}")
        if grader is not None and not callable(grader):
            raise TypeError(f"grader must be callable as grader(task_info, action) -> RewardOutput, got {grader!r}")
        if (
            isinstance(invalid_verdict_reward, bool)
            or not isinstance(invalid_verdict_reward, (int, float))
            or not math.isfinite(invalid_verdict_reward)
        ):
            raise ValueError(f"invalid_verdict_reward must be a finite number, got {invalid_verdict_reward!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        low, high = min(0.0, float(invalid_verdict_reward)), max(1.0, float(invalid_verdict_reward))
        # Per agent: each acts once, so its step reward is its episode return (a grader in [0, 1], as the math one).
        self.metadata = {**type(self).metadata, "step_reward_range": (low, high), "episode_return_range": (low, high)}
        self.tasks: Sequence[dict[str, Any]] = MathTaskGenerator() if tasks is None else load_dataset(tasks)
        if len(self.tasks) == 0:
            raise ValueError("tasks is empty: pass at least one task dict, or None for the built-in math tasks")
        self._default_grader = grader is None  # the math grader needs a ground truth; checked at reset
        self.grader: RewardFunction = MathGrader() if grader is None else grader
        self.n_solvers = n_solvers
        self.invalid_verdict_reward = float(invalid_verdict_reward)
        self.render_mode = render_mode
        self.solvers = [f"solver_{i}" for i in range(n_solvers)]
        self.possible_agents = [*self.solvers, JUDGE]
        observation_space = TextSpace(max_length=(n_solvers + 1) * MAX_TEXT_CHARS + 1024 * (n_solvers + 1))
        self.observation_spaces = {agent: observation_space for agent in self.possible_agents}
        self.action_spaces = {agent: TextSpace(max_length=MAX_TEXT_CHARS) for agent in self.possible_agents}
        self._np_random: np.random.Generator | None = None
        self.task: dict[str, Any] = {}
        self.solutions: dict[str, str] = {}
        self.grades: dict[str, RewardOutput] = {}
        self.verdict: int | None = None
        self.judged = False

    def observation_space(self, agent: str) -> TextSpace:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> TextSpace:
        return self.action_spaces[agent]

    # The task

    def validate_task(self, task: Any) -> dict[str, Any]:
        """Check a task dict (math rows in GSM8K/MATH/DeepScaleR form are mapped) and return a copy."""
        if not isinstance(task, Mapping):
            raise ValueError(f"a task must be a dict like {{'question': ..., ...}}, got {type(task).__name__}")
        task = dict(task)
        if "question" not in task and "problem" in task:
            task = map_math_row(task, "auto", source="task")
        question = task.get("question")
        if not isinstance(question, str) or len(question) > MAX_TEXT_CHARS:
            raise ValueError(
                f"task['question'] must be a string of at most {MAX_TEXT_CHARS} characters, got keys {sorted(task)}"
            )
        if self._default_grader and task.get("ground_truth") is None and task.get("answer") is None:
            raise ValueError(
                f"a math task needs 'ground_truth' (the reference answer), got keys {sorted(task)}; "
                "e.g. {'question': 'What is 2+2?', 'ground_truth': '4'}, or pass your own grader="
            )
        return task

    def _start(self, seed: int | None, options: dict[str, Any] | None) -> None:
        if seed is not None or self._np_random is None:
            self._np_random, _ = seeding.np_random(seed)
        task = (options or {}).get("task")
        if task is None:
            task = self.tasks[int(self._np_random.integers(len(self.tasks)))]
        self.task = self.validate_task(task)
        self.solutions, self.grades, self.verdict, self.judged = {}, {}, None, False

    # The rules

    @property
    def judging(self) -> bool:
        """Every solver has answered and the judge has not: the judge's turn."""
        return len(self.solutions) == self.n_solvers and not self.judged

    def _active(self, agent: str) -> bool:
        return self.judging if agent == JUDGE else agent not in self.solutions

    def observe(self, agent: str) -> str:
        if agent == JUDGE:
            if not self.judging:
                return ""
            shown = [self.solutions[s] for s in self.solvers]
            return judge_observation(self.task["question"], shown, max_solution_chars=MAX_TEXT_CHARS)
        return "" if agent in self.solutions else self.task["question"]

    def _waiting_info(self, agent: str) -> dict[str, Any]:
        """The info of an agent that has not acted yet."""
        return {
            "role": _role(agent),
            "task_id": str(self.task.get("id", "")),
            "task": dict(self.task),
            "active": self._active(agent),
        }

    def _play_round(self, actions: Mapping[str, Any]) -> dict[str, tuple[float, dict[str, Any]]]:
        """Apply the moves of a round: ``{agent: (reward, info)}``. An action outside the action space is an invalid
        action; a solver's invalid action is graded as the empty reply. The solvers' replies are graded at once."""
        invalid = {agent: not self.action_spaces[agent].contains(action) for agent, action in actions.items()}
        if JUDGE in actions:
            outcomes = {JUDGE: self._judge(actions[JUDGE], invalid[JUDGE])}
        else:
            replies = {agent: "" if invalid[agent] else action for agent, action in actions.items()}
            # Side by side: a round costs one grading_time_limit, not one grader's worst case per solver.
            grades = grade_side_by_side(self.grader, self.task, replies, self.grading_time_limit)
            outcomes = {agent: self._solve(agent, replies[agent], grades[agent]) for agent in actions}
        for agent, (_, info) in outcomes.items():
            info["invalid_action"] = invalid[agent]
        return outcomes

    def _solve(self, agent: str, reply: str, grade: RewardOutput) -> tuple[float, dict[str, Any]]:
        """Record one solver's graded reply."""
        self.solutions[agent], self.grades[agent] = reply, grade
        info = {
            "role": "solver",
            "task_id": str(self.task.get("id", "")),
            "active": False,
            "is_correct": bool(grade.is_correct),
            "infra_failed": bool(grade.metadata.get("infra_failed", False)),
            "reward_metadata": dict(grade.metadata),
        }
        return float(grade.reward), info

    def _judge(self, action: Any, invalid: bool) -> tuple[float, dict[str, Any]]:
        """The judge earns the grade of the solution it names; a malformed verdict earns invalid_verdict_reward."""
        if invalid and isinstance(action, str):
            limit = self.action_spaces[JUDGE].max_length
            verdict, error = None, f"the reply is longer than the limit of {limit} characters"
        else:
            verdict, error = read_verdict(action, self.n_solvers)
        self.verdict, self.judged = verdict, True
        if verdict is None:
            chosen = RewardOutput(reward=self.invalid_verdict_reward, is_correct=False)
        else:
            chosen = self.grades[self.solvers[verdict - 1]]
        info = {
            "role": "judge",
            "task_id": str(self.task.get("id", "")),
            "active": False,
            "is_correct": bool(chosen.is_correct),
            "infra_failed": bool(chosen.metadata.get("infra_failed", False)),
            "verdict": verdict,
            "invalid_verdict": verdict is None,
            "verdict_error": error,
            "solutions_correct": [bool(self.grades[s].is_correct) for s in self.solvers],
        }
        return float(chosen.reward), info

    def render(self) -> str | None:
        """``"ansi"``: the task, the solutions so far and the verdict, as text; ``"human"``: that text printed."""
        if self.render_mode is None:
            return None
        lines = [f"Task {self.task.get('id', '')}: {self.task.get('question', '')}"]
        for solver in self.solvers:
            if solver in self.grades:
                lines.append(f"{solver} (reward {self.grades[solver].reward}): {self.solutions[solver]}")
        if self.judged:
            lines.append(f"{JUDGE} verdict: {self.verdict}")
        if self.render_mode == "human":
            print("\n".join(lines))
            return None
        return "\n".join(lines)

    def close(self) -> None:
        """Nothing to release: the grader's worker pool is the process's own, started on first use."""


class SolverJudgeEnv(_SolverJudgeRules, AECEnv):
    """Several solvers answer a problem on their own; a judge reads every solution and names the one it trusts.

    ## Description
    A two-phase cooperative game for training LLM solvers and an LLM judge together (the solver-judge setup of
    rLLM). Each episode poses one task. ``n_solvers`` solvers answer it independently, without seeing each other;
    then the judge sees the problem and every solution, numbered from 1, and replies with
    ``<verdict>k</verdict>``. This class is the raw AEC env (``raw_env``); ``env()`` wraps it with PettingZoo's
    ``OrderEnforcingWrapper`` and :class:`SolverJudgeParallelEnv` (``parallel_env()``) plays the same game in the
    parallel API.

    ## Agents
    ``possible_agents = ["solver_0", ..., "solver_{n-1}", "judge_0"]`` (PettingZoo's ``<role>_<n>`` naming; the
    role is the part before the last ``_``). AEC order: ``solver_0``, ``solver_1``, ... then ``judge_0``; each
    agent acts once, and right after acting it is terminated and selected once more for its ``None`` step
    (PettingZoo's dead step), where ``last()`` shows its reward.

    ## Action Space
    ``TextSpace(max_length=1_000_000)`` for every agent: the model's reply. Any text, malformed or not, is normal
    input, and so is an action outside the space (``bytes``, ``None``, a number, text over 1,000,000 characters):
    it is an invalid action (``info["invalid_action"]``), graded as an empty reply for a solver and as a malformed
    verdict for the judge.

    ## Observation Space
    ``TextSpace`` (long enough for the judge's view): a solver sees the task's ``question`` until it has answered,
    then ``""``. The judge sees ``""`` until every solver has answered, then
    :func:`judge_observation` of the question and the solutions (each quote cut at 1,000,000
    characters, so the view stays in the observation space however many lines a solution has), then ``""`` after
    its verdict. Example judge observation::

        Problem:
        What is 17 + 25?

        Solution 1:
        17 + 25 = \\boxed{42}

        Solution 2:
        17 + 25 = \\boxed{32}

        Which solution is correct? End with <verdict>k</verdict>, k from 1 to 2.

    ## Prompt Format
    Observations hold no instructions beyond the judge's last line: agents (:mod:`rllm_gym.agents.solver_judge`)
    add the system prompts ("put your final answer within \\boxed{}", and for the judge
    :data:`~rllm_gym.agents.solver_judge.JUDGE_SYSTEM_PROMPT`, "end with <verdict>k</verdict>").

    ## Action Parsing
    Solvers: the grader's own (for the math grader, the last ``\\boxed{}`` after any ``</think>``). Judge:
    :func:`read_verdict`: exactly one distinct ``<verdict>k</verdict>`` (case-insensitive, repeated tags allowed
    if they agree) after the last ``</think>``, with ``k`` from 1 to ``n_solvers``.

    ## Starting State
    ``reset(options={"task": {"question": ..., "ground_truth": ...}})`` poses that task (GSM8K, MATH and
    DeepScaleR rows are mapped); otherwise a task is drawn from ``tasks`` with the env's seeded generator, so
    ``reset(seed=s)`` always poses the same task.

    ## Rewards
    Solver ``i``: ``grader(task, reply_i).reward`` (math grader: 1.0 correct, 0.0 wrong or no answer), given when it
    answers. Judge: the reward of the solution it names (the same number its solver earned), so picking a correct
    solution earns 1.0 and a wrong one 0.0 under the math grader. A malformed verdict (no tag, a number out of range,
    conflicting tags, no number) earns ``invalid_verdict_reward`` (default 0.0), never the grade of a guessed
    solution. Each agent acts once, so its step reward is its episode return: with a grader in [0, 1] (the math
    grader's range) both lie in ``[min(0, invalid_verdict_reward), max(1, invalid_verdict_reward)]``, given as
    ``metadata["step_reward_range"]`` and ``metadata["episode_return_range"]`` (per agent).

    ## Episode End
    Each solver is terminated right after it answers; the judge right after its verdict, which ends the episode.
    Never truncated: the game has ``n_solvers + 1`` moves.

    ## Information
    After ``reset`` every agent's info is ``role`` (``"solver"``/``"judge"``), ``task_id``, ``task`` (the task
    dict) and ``active`` (whether the agent's next action is used: False for the judge until every solver has
    answered; the parallel runner reads it). After a solver answers: ``role``, ``task_id``, ``active`` (False),
    ``is_correct``, ``infra_failed``, ``reward_metadata`` (the grader's metadata), ``invalid_action``. After the
    verdict: ``role``, ``task_id``, ``active``, ``is_correct`` (the named solution is correct), ``infra_failed``
    (the named solution's grade failed), ``verdict`` (int or None),
    ``invalid_verdict`` (bool), ``verdict_error`` (why it was rejected, or None), ``solutions_correct`` (each
    solution's correctness), ``invalid_action`` (the action was outside the action space).

    Whose failure: a reply with no answer, a wrong one, or one the grader ran out of its own ``time_limit`` on is the
    model's (``is_correct`` False, ``infra_failed`` False). A grader that crashed, returned something other than a
    ``RewardOutput`` or a non-finite reward, or was not back within ``grading_time_limit`` is the infrastructure's:
    reward 0.0 with ``infra_failed`` True and the reason in ``reward_metadata["error"]``; do not train on that
    sample.

    ## Arguments
    ``tasks``: a :class:`rllm_gym.data.Dataset` or list of task dicts, a ``.jsonl``/``.parquet`` path or a name
    :func:`rllm_gym.data.load_dataset` understands, or None for the built-in offline math generator.
    ``grader`` (RewardFunction, default :class:`rllm_gym.rewards.math.MathGrader`): grades ``(task, reply)``.
    ``n_solvers`` (int, 2; 1 to 64). ``invalid_verdict_reward`` (float, 0.0): the judge's reward for a malformed
    verdict, e.g. -0.5 to penalise format errors. ``render_mode`` (``"human"``: the text below printed after every
    step; ``"ansi"``: ``render()`` returns the task, the solutions so far and the verdict; or None).
    ``grading_time_limit`` (float, 20.0 s; up to 600): one step's bound on grading. The solvers' replies of a round
    are graded side by side, so a step returns within this bound whatever the replies (it used to cost a grader's
    worst case once per solver); a grader still running past it is an infrastructure failure. A custom grader that
    never returns keeps its thread: give it a time limit of its own.

    ## Conformance
    PettingZoo's ``parallel_api_test``, ``seed_test``, ``parallel_seed_test`` and ``render_test`` pass as shipped,
    and so does ``aec_to_parallel(parallel_to_aec(parallel_env()))``. ``api_test`` checks numpy observations, so it
    passes through :class:`rllm_gym.spaces.TextAsArrayWrapper` (on ``env()``, ``raw_env()`` and
    ``parallel_to_aec(parallel_env())``). ``aec_to_parallel`` of the AEC form does not apply (each agent's dead
    step follows its move, so the AEC form is not parallelizable: use ``parallel_env()``), nor does
    ``max_cycles_test`` (the game always ends after two rounds).

    ## Version History
    * v0: initial version; actions outside the action space became invalid actions instead of a ``TypeError``, and
      ``render_mode="human"`` was added.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        AECEnv.__init__(self)
        _SolverJudgeRules.__init__(self, *args, **kwargs)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._start(seed, options)
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: self._waiting_info(agent) for agent in self.agents}
        self._skip_agent_selection = None
        self.agent_selection = self.agents[0]

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        reward, info = self._play_round({agent: action})[agent]
        self.rewards[agent] = reward
        self.terminations[agent] = True
        self.infos[agent] = info
        if agent != JUDGE:
            position = self.solvers.index(agent)
            self.agent_selection = self.solvers[position + 1] if position + 1 < self.n_solvers else JUDGE
            self.infos[JUDGE] = self._waiting_info(JUDGE)  # a new dict: infos handed out earlier stay as they were
        self._accumulate_rewards()
        self._deads_step_first()  # the agent that just finished takes its None step before the next one acts
        if self.render_mode == "human":
            self.render()


class SolverJudgeParallelEnv(_SolverJudgeRules, ParallelEnv):
    """The solver-judge game in PettingZoo's parallel API: every solver in round one, the judge in round two.

    Rules, spaces, rewards, info keys and arguments are those of :class:`SolverJudgeEnv`. Round one takes an action
    for every solver (a missing one is a ``ValueError``); the judge is a live agent with an empty observation and
    ``info["active"] == False``, and its round-one action, if given, is ignored. The round ends the solvers (their
    rewards, ``terminated=True``) and gives the judge its view. Round two takes the judge's verdict and ends the
    episode. ``step`` after the end raises ``RuntimeError``: call ``reset()``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        _SolverJudgeRules.__init__(self, *args, **kwargs)
        self.agents: list[str] = []

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        self._start(seed, options)
        self.agents = list(self.possible_agents)
        return {a: self.observe(a) for a in self.agents}, {a: self._waiting_info(a) for a in self.agents}

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.task:
            raise RuntimeError("SolverJudgeParallelEnv.step called before reset(): call reset() first")
        if not self.agents:
            raise RuntimeError("SolverJudgeParallelEnv.step called after the episode ended: call reset() first")
        acting = [JUDGE] if self.judging else self.solvers
        missing = [agent for agent in acting if agent not in actions]
        if missing:
            raise ValueError(f"step() needs an action for {', '.join(missing)} (the agents whose turn it is)")
        live = list(self.agents)
        rewards = dict.fromkeys(live, 0.0)
        infos: dict[str, dict[str, Any]] = {}
        for agent, (reward, info) in self._play_round({agent: actions[agent] for agent in acting}).items():
            rewards[agent], infos[agent] = reward, info
        terminations = {agent: agent in acting for agent in live}
        if JUDGE not in acting:
            infos[JUDGE] = self._waiting_info(JUDGE)
        self.agents = [agent for agent in live if not terminations[agent]]
        observations = {agent: self.observe(agent) for agent in live}
        if self.render_mode == "human":
            self.render()
        return observations, rewards, terminations, dict.fromkeys(live, False), infos


raw_env = SolverJudgeEnv


def env(**kwargs: Any) -> AECEnv:
    """The AEC env, wrapped with PettingZoo's ``OrderEnforcingWrapper`` (errors on calls before ``reset``)."""
    return wrappers.OrderEnforcingWrapper(SolverJudgeEnv(**kwargs))


def parallel_env(**kwargs: Any) -> SolverJudgeParallelEnv:
    """The parallel-API env: every solver acts in round one, the judge in round two."""
    return SolverJudgeParallelEnv(**kwargs)
