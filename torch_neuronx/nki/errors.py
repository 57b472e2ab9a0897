"""The one exception type of the NKI simulator, and where in the kernel source an error points."""

from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class NKIError(ValueError):
    """A kernel broke an NKI rule (or was called wrongly).

    The message names the instruction, the kernel source ``file:line`` that issued it and the rule;
    the same pieces are attributes: ``instruction``, ``location`` and ``rule``.
    """

    def __init__(self, instruction: str, rule: str, hint: str | None = None, location: str | None = None):
        self.instruction = instruction
        self.rule = rule
        self.hint = hint
        self.location = location if location is not None else kernel_location()
        message = f"{self.location}: {instruction}: {rule}"
        if hint:
            message += f". Fix: {hint}"
        super().__init__(message)


def kernel_location() -> str:
    """`file:line` of the innermost caller outside this package: the kernel line being simulated."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return "<unknown>:0"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"
