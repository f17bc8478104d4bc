"""``python_code``: run the model's Python in roll's code sandbox and return what it printed.

The program runs through :func:`roll.pipelines.rewards.sandbox.run_untrusted` (a contained subprocess: rlimits,
no network, private working directory; see that module for the layers). A run that exits non-zero, times out or
hits a limit is a failed call whose output says why.

ROLL's (GEM's) tool_args are accepted: ``timeout`` is ``timeout_s``; ``sandbox_type`` (``none`` or ``bwrap``, GEM's
choice of wrapper) changes nothing, every program runs in roll's sandbox; ``keep_error_last_line: false`` returns the
whole stderr of a failed run (clipped) after its output instead of the last line only (roll's default, true).
"""

from __future__ import annotations

from typing import Any

from roll.agentic.tools.base import Tool, ToolResult, ToolSpec
from roll.pipelines.rewards.sandbox import run_untrusted
from roll.runtime import ConfigError

__all__ = ["PythonCodeTool"]


class PythonCodeTool(Tool):
    """One function, ``python_code(code)``; results are stdout (and the error's last line), capped in length."""

    gem_form = "python"

    def __init__(
        self,
        name: str = "python_code",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 1000,
        description: str | None = None,
        timeout: float | None = None,
        sandbox_type: str = "none",
        keep_error_last_line: bool = True,
    ) -> None:
        if sandbox_type not in ("none", "bwrap"):
            raise ConfigError(
                f"python_code sandbox_type={sandbox_type!r}: use 'none' or 'bwrap' (roll's sandbox runs either way)"
            )
        if timeout is not None:  # ROLL's spelling
            timeout_s = timeout
        self.keep_error_last_line = keep_error_last_line
        self.name = name
        self.timeout_s, self.memory_mb, self.max_output_chars = timeout_s, memory_mb, max_output_chars
        self.description = description or (
            "Run a Python 3 program and return what it prints. Print every value you need to see."
        )

    def specs(self) -> list[ToolSpec]:
        parameters = {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "A complete Python program."}},
            "required": ["code"],
        }
        return [ToolSpec(self.name, self.description, parameters)]

    def _clip(self, text: str) -> str:
        return text if len(text) <= self.max_output_chars else text[: self.max_output_chars] + "\n...(truncated)"

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(False, 'python_code needs a non-empty "code" string argument')
        result = run_untrusted(code, timeout_s=self.timeout_s, cpu_s=self.timeout_s, memory_mb=self.memory_mb)
        if result.ok:
            return ToolResult(True, self._clip(result.stdout) if result.stdout else "(no output)")
        # the sandbox's reason: the timeout or limit that stopped the run, or a failed program's last stderr line;
        # printed output is clipped alone, so the reason always reaches the model
        printed = self._clip(result.stdout) if result.stdout else ""
        if printed and not printed.endswith("\n"):
            printed += "\n"
        if not self.keep_error_last_line and result.stderr.strip():
            return ToolResult(False, f"{printed}{self._clip(result.stderr.strip())}")
        return ToolResult(False, f"{printed}Error: {result.reason or result.status}")
