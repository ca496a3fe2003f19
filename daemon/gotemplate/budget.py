"""How much work one template render may do: steps and output characters. A request may carry its own template
(`/api/generate`'s `template`), so a loop of loops must end in a clear error, not hold a worker for minutes."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TemplateError

MAX_STEPS = 500_000  # real chat templates take well under 1,000 per message
MAX_OUTPUT = 64 * 2**20  # characters: a prompt this long is far past any context window anyway


class TemplateBudgetExceeded(TemplateError):
    """The render took more steps or wrote more text than its budget allows (HTTP 400 upstream)."""


@dataclass
class Budget:
    """Counters for one render (every execution of a multi-turn chat shares one)."""

    max_steps: int = MAX_STEPS
    max_output: int = MAX_OUTPUT
    steps: int = 0
    output: int = 0

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise TemplateBudgetExceeded(f"template execution exceeded its budget of {self.max_steps} steps "
                                         f"(a loop too large?)")

    def emit(self, n: int) -> None:
        self.output += n
        if self.output > self.max_output:
            raise TemplateBudgetExceeded(f"template output exceeded its budget of {self.max_output} characters")
