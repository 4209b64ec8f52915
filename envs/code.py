"""Programming tasks as a text environment: the model writes Python, the sandbox runs it against the task's tests."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

import gymnasium as gym

from rllm_gym.envs.base import TextRendering
from rllm_gym.rewards.code import CodeReward, parse_tests
from rllm_gym.sandbox import DEFAULT_LIMITS, Sandbox
from rllm_gym.spaces import TextSpace

__all__ = [
    "BUILTIN_TASKS_PATH",
    "FEEDBACK_MODES",
    "CodeEnv",
    "builtin_code_tasks",
    "load_code_tasks",
    "normalize_task",
    "public_test_count",
]

BUILTIN_TASKS_PATH = Path(__file__).with_name("code_tasks.jsonl")
_PROMPT_KEYS = ("prompt", "question", "question_content", "text", "problem")
_FEEDBACK_QUOTE = 500
FEEDBACK_MODES = ("public", "full")


def normalize_task(row: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """One task dict in the env's schema from a row of our JSONL, TACO/APPS, LiveCodeBench, HumanEval or MBPP.

    The schema: ``id``, ``prompt``, and tests as :func:`rllm_gym.rewards.code.parse_tests` reads them (``tests`` with
    optional ``fn_name``, ``test_list``, or ``test`` + ``entry_point``); optional ``starter_code`` and
    ``reference_solution``, and ``public_tests`` (see :func:`public_test_count`). A LiveCodeBench row is graded on
    its public and private cases together; the public ones, which its statement shows, are its ``public_tests``.
    Raises ValueError naming the missing field.
    """
    if not isinstance(row, dict):
        raise ValueError(f"code task #{index} must be a dict, got {type(row).__name__}")
    task = dict(row)
    prompt = next((task[key] for key in _PROMPT_KEYS if isinstance(task.get(key), str) and task[key].strip()), None)
    if prompt is None:
        raise ValueError(f"code task #{index} needs a problem statement in one of the fields {list(_PROMPT_KEYS)}")
    task["prompt"] = prompt
    if "input_output" in task and "tests" not in task:  # TACO / APPS
        spec = json.loads(task["input_output"]) if isinstance(task["input_output"], str) else task["input_output"]
        task["tests"] = {"inputs": spec["inputs"], "outputs": spec["outputs"]}
        if spec.get("fn_name"):
            task["fn_name"] = spec["fn_name"]
    if "public_test_cases" in task and "tests" not in task:  # LiveCodeBench
        # The statement shows the public cases: graded on them alone, a reply could print their outputs. The
        # private cases come after them, and feedback may quote only the public ones.
        public = _livecodebench_cases(task["public_test_cases"], "public_test_cases", index)
        cases = public + _livecodebench_cases(task.get("private_test_cases") or [], "private_test_cases", index)
        task.setdefault("public_tests", len(public))
        task["tests"] = [{"input": c["input"], "output": c["output"]} for c in cases]
        if any(c.get("testtype") == "functional" for c in cases):
            metadata = task.get("metadata")
            if isinstance(metadata, str):  # LiveCodeBench keeps it as JSON text
                with contextlib.suppress(json.JSONDecodeError):
                    metadata = json.loads(metadata)
            fn_name = metadata.get("func_name") if isinstance(metadata, dict) else None
            task["fn_name"] = task.get("fn_name") or fn_name
            try:
                task["tests"] = {
                    "inputs": [[json.loads(a) for a in c["input"].splitlines()] for c in cases],
                    "outputs": [json.loads(c["output"]) for c in cases],
                }
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"code task #{index}: a functional LiveCodeBench case needs JSON text: its 'input' one argument "
                    f"per line, its 'output' one value ({error})"
                ) from None
    if "canonical_solution" in task and "reference_solution" not in task:  # HumanEval: prompt + body
        task["reference_solution"] = task["prompt"] + task["canonical_solution"]
    if "code" in task and "test_list" in task and "reference_solution" not in task:  # MBPP
        task["reference_solution"] = task["code"]
    task.setdefault("id", task.get("task_id", f"code-{index}"))
    task["id"] = str(task["id"])
    tests = parse_tests(task)  # validates the tests now, with a message naming the field
    if "public_tests" in task:
        count, least = task["public_tests"], 1 if "test_list" in task else 0
        if isinstance(count, bool) or not isinstance(count, int) or not least <= count <= len(tests):
            raise ValueError(
                f"code task {task['id']!r}: public_tests (how many of the first tests the model may see) must be an "
                f"int from {least} to {len(tests)}, got {count!r}"
                + (" (an MBPP prompt shows at least one assert: it names the function)" if least else "")
            )
    return task


def public_test_count(task: dict[str, Any]) -> int:
    """How many of the task's first tests the model may see, in the prompt or in feedback: ``task["public_tests"]``,
    else 1 for MBPP-style asserts (the prompt shows one: it names the function and its call), else 0."""
    if "public_tests" in task:
        return task["public_tests"]
    return 1 if "test_list" in task else 0


class _TextOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: only plain data is read")


def _livecodebench_cases(cases: Any, field: str, index: int) -> list[dict[str, Any]]:
    """LiveCodeBench test cases: a list, JSON text, or (``private_test_cases`` in code_generation_lite) base64 of a
    zlib-compressed pickle of JSON text. The pickle is read by an unpickler that refuses every class and function, so
    a data file cannot run code here."""
    if isinstance(cases, str):
        try:
            cases = json.loads(cases)
        except json.JSONDecodeError:
            try:
                text = _TextOnlyUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(cases)))).load()
                cases = json.loads(text)
            except (ValueError, TypeError, LookupError, zlib.error, pickle.UnpicklingError, EOFError) as error:
                raise ValueError(
                    f"code task #{index}: {field} is neither JSON nor LiveCodeBench's compressed form ({error})"
                ) from error
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "input" in c and "output" in c for c in cases):
        raise ValueError(f"code task #{index}: {field} must be a list of {{'input': ..., 'output': ...}} cases")
    return cases


def load_code_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Tasks from a local ``.jsonl`` (one row per line) or ``.json`` (a list of rows) file, normalized."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"code task file {str(path)!r} does not exist: pass a .jsonl or .json file")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError(f"{path} must hold a JSON list of task objects")
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no tasks")
    return [normalize_task(row, index) for index, row in enumerate(rows)]


def builtin_code_tasks() -> list[dict[str, Any]]:
    """The project's offline set: 43 tasks (stdin parsing, strings, math, lists), each with a reference solution."""
    return load_code_tasks(BUILTIN_TASKS_PATH)


def _instructions(task: dict[str, Any]) -> str:
    if task.get("fn_name"):
        how = f"Define the function `{task['fn_name']}` (a method of `class Solution` is accepted too)."
    elif "entry_point" in task:
        how = f"Define the function `{task['entry_point']}`."
    elif "test_list" in task:
        shown = task["test_list"][: public_test_count(task)]
        calls = "this test calls" if len(shown) == 1 else "these tests call"
        how = f"Define the function {calls}:\n" + "\n".join(shown)
    else:
        how = "Read the input from standard input and print the answer to standard output."
    parts = [task["prompt"].rstrip(), how]
    if task.get("starter_code"):
        parts.append(f"Starter code:\n```python\n{task['starter_code'].rstrip()}\n```")
    parts.append("Reply with your complete solution in one ```python code block; the last code block is graded.")
    return "\n\n".join(parts)


def _feedback(metadata: dict[str, Any], revisions_left: int, public: int | None) -> str:
    """What a failing attempt is told. ``public``: how many of the first tests may be quoted (``None``: all).

    Of a hidden test only that it failed is told: its input and expected output would let the next attempt print
    the answer (a reward the policy forges), what the program printed or raised could carry the hidden input out,
    and its status (wrong answer, timeout, memory...) or how many hidden tests passed before it would be a channel
    the program picks from the hidden input. The public tests ran in a sandbox process of their own, before any
    hidden input reached the solution, so what is quoted of them depends on nothing hidden.
    """
    if metadata.get("error") and not metadata.get("tests"):
        head = f"Your reply could not be graded: {metadata['error']}."
    else:
        index, failing = next((i, t) for i, t in enumerate(metadata["tests"]) if not t["passed"])
        if public is not None and index >= public:
            shown = f"All {public} public test(s) passed, but a" if public else "A"
            head = (
                f"{shown} hidden test failed. Of hidden tests nothing more is shown: not their input or expected "
                f"output, not what your program printed or raised, not how it failed."
            )
        else:
            if public is None:
                count = f"{metadata['passed']} of {metadata['total']} tests passed."
            else:  # hidden tests count for nothing here: how many passed is theirs to hide too
                count = f"{sum(t['passed'] for t in metadata['tests'][:public])} of {public} public test(s) passed."
            lines = [
                f"{count} First failing test:",
                f"Input:\n{failing['input']}",
            ]
            if "expected" in failing:
                lines.append(f"Expected:\n{failing['expected']}")
            if "got" in failing:
                lines.append(f"Got:\n{failing['got']}")
            if failing.get("error"):
                lines.append(f"Error ({failing['status']}):\n{failing['error']}")
            head = "\n".join(line[:_FEEDBACK_QUOTE] for line in lines)
    return (
        f"{head}\n\nRevise your solution ({revisions_left} revision(s) left) and reply with one ```python code block."
    )


class CodeEnv(TextRendering, gym.Env[str, str]):
    """Solve a programming task in Python; the reply's last code block runs in the sandbox against the task's tests.

    ## Description
    Each episode is one task: a problem statement with stdin/stdout tests, function-call tests (``fn_name``) or
    assert tests (HumanEval/MBPP). The reply's last fenced code block is executed by :mod:`rllm_gym.sandbox` (its own
    uid and namespaces, no network, a minimal read-only file system without the task files, time and memory limits)
    and graded by :class:`rllm_gym.rewards.code.CodeReward` outside the process that ran it: function and assert
    tests run in a separate harness process that only gets plain-data return values back, and comparison is strict
    (exact ints and strings, a float tolerance only for expected floats). By default the episode is single-turn;
    with ``max_revisions=N`` a failing reply gets feedback on the first failing test and may be revised N times.
    Feedback quotes a test (input, expected, got, or the error) only when it is public, one the model may see
    (``public_tests``: the one assert an MBPP prompt shows, none otherwise), from a run of the public tests alone
    (function and assert tests run them in a sandbox process apart from the hidden ones); of a hidden test it says
    only that one failed. Quoting hidden tests let a policy earn the reward by printing the expected outputs it had
    been shown, and what a program prints or raises on a hidden input could carry that input out. Even a hidden test's
    status (wrong answer, timeout, memory...) or how many hidden tests passed is a channel the program picks from the
    hidden input, so neither is told: the trade-off is that the policy cannot tell a hidden timeout from a hidden
    wrong answer, while ``info["tests"]`` keeps every status for the user.

    ## Action Space
    ``TextSpace(max_length=100_000)``: the model's reply. An action outside the space (``bytes``, ``None``, a
    number, text over 100,000 characters) is graded as the empty reply: no code block, no code run.

    ## Observation Space
    ``TextSpace``: at reset, the problem statement, how to read input or which function to define, any starter code,
    and the answer format. After a failing attempt with revisions left: the feedback on the first failing test
    (quoted when it is public, with how many public tests passed; "a hidden test failed" when it is hidden).

    ## Prompt Format
    Example observation::

        Read two integers a and b on one line and print a + b.

        Read the input from standard input and print the answer to standard output.

        Reply with your complete solution in one ```python code block; the last code block is graded.

    ## Action Parsing
    The body of the last fenced block (```` ```python ... ``` ````). A reply without one is graded as failing every
    test (reward 0.0) and, with revisions left, told what format to use.

    ## Starting State
    ``reset(seed=s)`` draws a task from the env's task list with the seeded generator;
    ``reset(options={"task": {...}})`` pins one (any format :func:`normalize_task` reads).

    ## Rewards
    On the step that ends the episode: 1.0 when every test passes, else 0.0 (or the fraction of tests passed with
    ``fraction=True``). Steps that return feedback earn 0.0. When the sandbox or the task's tests fail the episode
    ends with reward 0.0 and ``info["graded"] = False``: drop such samples rather than train on them. So a step earns
    within [0.0, 1.0] and, as only the last step is graded, so does an episode (``metadata["step_reward_range"]`` and
    ``["episode_return_range"]``).

    ## Episode End
    Terminated when all tests pass, when no revision is left, or on a sandbox failure. Truncated only by a
    ``TimeLimit`` wrapper (``gym.make("rllm/Code-v0")`` sets ``max_episode_steps`` to 10).

    ## Information
    ``reset``: ``task`` (``{"id", "prompt"}``), ``is_correct`` (False). ``step``: ``is_correct`` (bool, or None when
    ungraded), ``graded`` (bool), ``passed`` and ``total`` (tests), ``tests`` (per-test results: input, expected, got,
    status among ``ok``, ``wrong_answer``, ``runtime_error``, ``killed``, ``timeout``, ``memory_limit``,
    ``output_limit``, ``not_plain_data``; error), ``attempt`` (1-based), ``revisions_left``, ``error`` (why a reply
    or the sandbox failed, or None), ``invalid_action`` (the action was outside the action space), ``infra_failed``
    (bool). ``info`` quotes hidden tests too: it is for logs, not for the model
    (:class:`~rllm_gym.agents.code.CodeAgent` shows only the observation).

    Whose failure: a test that fails by the solution's doing (wrong answer, its code raised, timed out, hit the
    memory or output limit, was killed, returned what is not plain data) is the model's: ``graded`` True,
    ``infra_failed`` False. The sandbox failing to start or run (``sandbox_error``), or the task's test code failing
    whatever the reply (``harness_error``: its setup raises, an assert fails before calling the solution, it passes an
    argument that cannot cross to the solution's process), is not: ``graded`` False, ``infra_failed`` True; the
    engine retries such an episode and the trainer leaves it out.

    ## Arguments
    ``tasks`` (list of task dicts, a path to a .jsonl/.json file, or None for the 43 built-in tasks). A task's
    ``public_tests`` (int) says how many of its first tests the model may see (default: 1 for MBPP-style
    ``test_list`` tasks, whose prompt shows that assert to name the function; 0 otherwise).
    ``max_revisions`` (int, 0): revisions after feedback. ``feedback`` (``"public"``, the default, or ``"full"``:
    quote every failing test, hidden ones included; a policy trained with it can copy expected outputs from the
    feedback into its next attempt, so keep it for evaluation and debugging). ``fraction`` (bool, False).
    ``timeout`` (float, 5.0) and ``memory_mb`` (int, 512) per test run (:class:`rllm_gym.sandbox.SandboxLimits`).
    ``stop_on_first_failure`` (bool or None, None: stop exactly when ``fraction`` is False, as
    :class:`~rllm_gym.rewards.code.CodeReward` does): stop grading at the first failing test. ``sandbox`` (a
    :class:`rllm_gym.sandbox.Sandbox`, default: the process's own, started on first use and stopped at exit; after
    a fork the child starts its own). ``render_mode``
    (``"human"``: the observation printed after every reset and step; ``"ansi"``: ``render()`` returns it; or None).

    ## Version History
    * v0: initial version; grading since made unforgeable (paired function tests, strict comparison, a minimal
      file system view): replies that exploited the old grader now earn 0.0. Text over ``max_length`` is no
      longer run, and ``render_mode="human"`` was added. Feedback no longer quotes hidden tests (``feedback="full"``
      restores it), and an MBPP prompt shows one of its asserts rather than three. A hidden failure is told as
      "a hidden test failed" (no status, no count of hidden passes), public tests run apart from hidden ones, a
      HumanEval prompt's helpers stay the task's, and exceptions such as ``StopIteration`` fail the test.
    """

    metadata = {
        "render_modes": ["human", "ansi"],
        "render_fps": 1,
        "step_reward_range": (0.0, 1.0),
        "episode_return_range": (0.0, 1.0),
    }

    def __init__(
        self,
        tasks: list[dict[str, Any]] | str | Path | None = None,
        max_revisions: int = 0,
        fraction: bool = False,
        timeout: float = DEFAULT_LIMITS.timeout,
        memory_mb: int = DEFAULT_LIMITS.memory_mb,
        stop_on_first_failure: bool | None = None,
        sandbox: Sandbox | None = None,
        render_mode: str | None = None,
        feedback: str = "public",
    ):
        if feedback not in FEEDBACK_MODES:
            raise ValueError(
                f"CodeEnv feedback must be one of {FEEDBACK_MODES} ('full' quotes hidden tests: a policy can copy "
                f"their expected outputs), got {feedback!r}"
            )
        if tasks is None:
            self.tasks = builtin_code_tasks()
        elif isinstance(tasks, (str, Path)):
            self.tasks = load_code_tasks(tasks)
        elif isinstance(tasks, list) and tasks:
            self.tasks = [normalize_task(task, index) for index, task in enumerate(tasks)]
        else:
            raise ValueError(
                f"CodeEnv tasks must be a non-empty list of task dicts, a file path or None, got {tasks!r:.100}"
            )
        if isinstance(max_revisions, bool) or not isinstance(max_revisions, int) or max_revisions < 0:
            raise ValueError(f"CodeEnv max_revisions must be an int >= 0 (0 = single turn), got {max_revisions!r}")
        self.max_revisions = max_revisions
        self.feedback = feedback
        self.grader = CodeReward(
            fraction=fraction,
            stop_on_first_failure=stop_on_first_failure,
            timeout=timeout,
            memory_mb=memory_mb,
            sandbox=sandbox,
            hidden_run_class="visible" if feedback == "full" else "verdict",  # "full" quotes hidden tests
        )
        self.set_render_mode(render_mode)
        self.observation_space = TextSpace(max_length=200_000)
        self.action_space = TextSpace(max_length=100_000)
        self._task: dict[str, Any] = {}
        self._attempt = 0
        self._done = True
        self._last_observation = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        task = self.tasks[int(self.np_random.integers(len(self.tasks)))] if task is None else normalize_task(task)
        self._task, self._attempt, self._done = task, 0, False
        self._last_observation = _instructions(task)
        info = {"task": {"id": task["id"], "prompt": task["prompt"]}, "is_correct": False}
        return self.rendered((self._last_observation, info))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("CodeEnv.step called after the episode ended: call reset() first")
        return self.rendered(self._attempt_step(action))

    def _attempt_step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._attempt += 1
        invalid = not self.action_space.contains(action)
        result = self.grader(self._task, "" if invalid else action, public_tests=public_test_count(self._task))
        meta = result.metadata
        graded = bool(meta.get("graded"))
        revisions_left = self.max_revisions - (self._attempt - 1)
        info = {
            "is_correct": result.is_correct,
            "graded": graded,
            "infra_failed": not graded,
            "passed": meta.get("passed", 0),
            "total": meta.get("total", 0),
            "tests": meta.get("tests", []),
            "attempt": self._attempt,
            "revisions_left": revisions_left,
            "error": meta.get("error"),
            "invalid_action": invalid,
        }
        if result.is_correct or not graded or revisions_left <= 0:
            self._done = True
            info["revisions_left"] = 0
            if result.is_correct:
                observation = f"All {meta['total']} tests passed."
            elif not graded:
                observation = f"The grader failed (not your reply's fault): {meta.get('error')}"
            else:
                observation = f"{meta.get('passed', 0)} of {meta.get('total', 0)} tests passed. No revisions left."
            self._last_observation = observation
            return observation, result.reward, True, False, info
        public = None if self.feedback == "full" else public_test_count(self._task)
        self._last_observation = _feedback(meta, revisions_left, public)
        return self._last_observation, 0.0, False, False, info
