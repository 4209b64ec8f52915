"""The README's agent-program section: its Python block runs as written and prints what it says, and the agent it
shows is the one shipped as ``rllm_gym.agents.openai_calculator`` (which its eval command runs)."""

from __future__ import annotations

import contextlib
import inspect
import io
import re
from pathlib import Path

import pytest

from rllm_gym.agents import openai_calculator

README = Path(__file__).resolve().parents[2] / "README.md"


def gateway_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    [block] = [b for b in blocks if "run_agent_program(" in b]
    return block


@pytest.mark.slow  # ~20-30 s on 2 cores
def test_the_readme_agent_program_runs_and_prints_what_it_says():
    block = gateway_block()
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), namespace)
    assert "# 4 env_done True" in block
    assert out.getvalue().strip() == "4 env_done True"
    for episode in namespace["episodes"]:
        (trajectory,) = episode.trajectories
        assert trajectory.reward in (0.0, 1.0) and trajectory.input["task"]["answer"] in (42, 7)
        assert all("tools" in step.info for step in trajectory.steps)
    # The shipped agent is the README's.
    assert namespace["TOOLS"] == openai_calculator.TOOLS
    assert inspect.getsource(openai_calculator.run_tool).split("\n", 1)[1] in block
    shipped_solve = inspect.getsource(openai_calculator.solve).replace("    task = make_task(task)\n", "")
    assert shipped_solve.split("\n", 1)[1].replace("messages: list[dict] =", "messages =") in block
