"""The ``python`` tool (model-written code, run only inside :mod:`rllm_gym.sandbox`) and the ``finish`` tool (the
agent's final answer, which ends a tool-use episode)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rllm_gym.sandbox.limits import DEFAULT_LIMITS, SandboxLimits
from rllm_gym.tools.base import Tool, ToolOutput

if TYPE_CHECKING:
    from rllm_gym.sandbox import SandboxResult

__all__ = ["FinishTool", "PythonTool"]


class PythonTool(Tool):
    """``python(code)``: run a Python program in the sandbox and return what it printed.

    Success returns stdout (plus stderr when the program wrote to it); a crash, a timeout or a memory limit returns
    an error output with the status and stderr. Only printed values are returned: the program is a script, not a
    notebook cell.
    """

    def __init__(
        self, *, timeout: float = DEFAULT_LIMITS.timeout, memory_mb: int = DEFAULT_LIMITS.memory_mb, **kwargs: Any
    ):
        SandboxLimits(timeout=timeout, memory_mb=memory_mb, owner="PythonTool")  # the sandbox's own rule
        super().__init__(
            "python",
            "Run a Python 3 program in an isolated sandbox and return its printed output. Use print() to see "
            f"values. The program has no network or file access beyond a temporary directory and stops after "
            f"{timeout:g} seconds.",
            {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The complete Python program to run."}},
                "required": ["code"],
            },
            # The env-level timeout wraps the sandbox's own: give the sandbox room to report its timeout first.
            **{"timeout": timeout + 5.0, **kwargs},
        )
        self.sandbox_timeout = float(timeout)
        self.memory_mb = memory_mb

    def _to_output(self, result: SandboxResult) -> ToolOutput:
        status = result.status.value
        metadata = {"status": status, "exit_code": result.exit_code, "duration_s": result.duration_s}
        if status == "sandbox_error":  # the sandbox failed, not the program: the env reports it as infra_failed
            metadata["infra_failed"] = True
        if status == "ok":
            stdout = result.stdout.rstrip("\n")
            text = stdout if not result.stderr else f"{stdout}\n[stderr]\n{result.stderr.rstrip()}"
            return ToolOutput(name=self.name, output=text if text.strip() else "(no output)", metadata=metadata)
        detail = (result.stderr or result.error or "").strip()
        message = f"program ended with status {status!r}"
        if status == "timeout":
            message += f" (limit {self.sandbox_timeout:g} s)"
        if detail:
            message += f":\n{detail}"
        if result.stdout:
            message += f"\n[stdout before the error]\n{result.stdout}"
        return ToolOutput(name=self.name, error=message, metadata=metadata)

    def forward(self, code: str) -> ToolOutput:
        from rllm_gym.sandbox import run_python  # lazy: the sandbox starts helper processes on first use

        return self._to_output(
            run_python(code, timeout=self.sandbox_timeout, memory_mb=self.memory_mb, run_class="visible")
        )

    async def async_forward(self, code: str) -> ToolOutput:
        from rllm_gym.sandbox import arun_python

        return self._to_output(
            await arun_python(code, timeout=self.sandbox_timeout, memory_mb=self.memory_mb, run_class="visible")
        )


class FinishTool(Tool):
    """``finish(response)``: submit the final answer. Envs end the episode on it and grade ``response``."""

    def __init__(self, **kwargs: Any):
        super().__init__(
            "finish",
            "Submit your final answer and end the task. Put the answer in `response`, e.g. '\\boxed{42}'.",
            {
                "type": "object",
                "properties": {"response": {"type": "string", "description": "The final answer."}},
                "required": ["response"],
            },
            **kwargs,
        )

    def forward(self, response: str) -> ToolOutput:
        return ToolOutput(name=self.name, output=response)
