"""The engine: chunked-prefill scheduler, KV accounting, sampling and the step loop (no backend imports)."""
from .budget import BudgetPolicy, FixedBudget, StepCost
from .engine import Engine, EngineConfig, EngineError, EngineStats, EngineStopped, PromptTooLong, QueueFull
from .params import InvalidParams, SamplingParams
from .sequence import Delta, RequestMetrics, RequestStream, Sequence, Status

__all__ = [
    "BudgetPolicy", "Delta", "Engine", "EngineConfig", "EngineError", "EngineStats", "EngineStopped",
    "FixedBudget", "InvalidParams", "PromptTooLong", "QueueFull", "RequestMetrics", "RequestStream",
    "SamplingParams", "Sequence", "Status", "StepCost",
]
