"""How many prompt tokens a step may take on top of its decodes.

Fixed policy: Sarathi's `chunk = min(C_max, T_budget - N_decodes)`. The adaptive, latency-targeted
policy lives beside it and is chosen by `make_budget_policy`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class StepCost:
    """What a finished step did and how long it took; fed back to the policy."""

    num_decodes: int
    prefill_tokens: int
    context_tokens: int  # sum over spans of tokens attended (cached prefix + new), a proxy for attention cost
    seconds: float


class BudgetPolicy(Protocol):
    def prefill_budget(self, num_decodes: int, decode_context: int) -> int:
        """Prompt tokens this step may take, given its decodes and their summed context length."""
        ...

    def observe(self, cost: StepCost) -> None:
        ...


class FixedBudget:
    """A fixed token budget per step shared by decodes and prompt chunks."""

    def __init__(self, max_num_batched_tokens: int) -> None:
        self.max_num_batched_tokens = max_num_batched_tokens

    def prefill_budget(self, num_decodes: int, decode_context: int) -> int:
        return max(0, self.max_num_batched_tokens - num_decodes)

    def observe(self, cost: StepCost) -> None:
        pass
