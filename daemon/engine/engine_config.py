"""What an Engine is built with and reports: its config, its stats, its errors, and the step budget it picks."""
from __future__ import annotations

from dataclasses import dataclass

from ...backends.base import Runner
from .budget import AdaptiveBudget, BudgetPolicy, FixedBudget


class EngineError(Exception):
    pass


class PromptTooLong(EngineError, ValueError):
    """The prompt does not fit the context window (or the whole KV pool)."""


class QueueFull(EngineError):
    pass


class EngineStopped(EngineError):
    pass


@dataclass
class EngineConfig:
    prefill_mode: str = "chunked"  # chunked | monolithic
    max_num_batched_tokens: int = 256  # fixed token budget per step (decodes + prompt chunks)
    max_prefill_chunk: int | None = None
    max_num_seqs: int | None = None  # None = the runner's slots
    target_itl_ms: float | None = 0.0  # > 0: adaptive, latency-targeted budget; None: by device; 0: fixed
    max_queue: int = 512
    context_length: int | None = None  # per-sequence window; None = the model's
    prefix_caching: bool = True  # reuse the KV of cached prompt prefixes (where the runner supports it)
    speculative: str = "ngram"  # speculative decoding (speculative.py): ngram (prompt lookup) | off

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.target_itl_ms is not None and self.target_itl_ms < 0:
            raise ValueError(f"target_itl_ms must be >= 0, got {self.target_itl_ms}")


@dataclass
class EngineStats:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    steps: int
    block_size: int
    kv_blocks_cached: int = 0  # blocks holding a reusable prefix (in use or free)
    cache_hit_tokens: int = 0  # tokens served from the prefix cache at admission, since load
    cache_query_tokens: int = 0  # tokens looked up at admission, since load
    prefix_fallback_tokens: int = 0  # cached prefix tokens the runner could no longer serve (recomputed), since load
    # speculative decoding, since load: decode passes (one per decoding sequence per step), draft tokens verified
    # in them and draft tokens kept
    decode_passes: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    kv_blocks_cached_free: int = 0  # blocks nobody holds that keep a cached prefix (evicted before anyone waits)
    # cached prefix tokens past a recurrent model's last state checkpoint (recomputed), since load
    prefix_rewind_tokens: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / self.cache_query_tokens if self.cache_query_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Draft tokens kept / draft tokens verified (0 before any)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens generated per decode pass: 1 without speculation, 1 + the kept drafts with it."""
        return (self.decode_passes + self.accepted_tokens) / self.decode_passes if self.decode_passes else 0.0


def runs_on_cpu(runner: Runner) -> bool:
    return str(runner.device).startswith("cpu")


def default_target_itl_ms(runner: Runner) -> float:
    """50 ms on an accelerator; on a CPU a prompt token costs milliseconds, so 150 ms keeps ingestion moving."""
    return 150.0 if runs_on_cpu(runner) else 50.0


def make_budget_policy(config: EngineConfig, runner: Runner) -> BudgetPolicy:
    target = default_target_itl_ms(runner) if config.target_itl_ms is None else config.target_itl_ms
    if target > 0:
        # On a CPU a chunk deep into a long prompt can cost more than the target even at a few tokens (attention
        # over the prefix dominates), so the floor there is small; on a GPU 16 rows cost what 1 does. Not below 4:
        # a 2-token floor made a 16k prompt's TTFT 728 s instead of 443 s on a 2-core EPYC, and the P99 no better
        # (217 vs 226 ms), since the streams decoding meanwhile grow and their own steps get dearer.
        cpu = runs_on_cpu(runner)
        # A user's next question (a one-line prompt, or a chat turn past its cached history) runs whole in its first
        # step, so its first token comes one step after it arrives, however little the target leaves a document's
        # chunks (deep in its prefill, or on a busy machine). 32 tokens cost a 250M-parameter model about 160 ms on 2
        # CPU cores: one longer gap for the streams per question.
        return AdaptiveBudget(target, max_tokens=config.max_num_batched_tokens, tile=1 if cpu else 16,
                              floor=4 if cpu else 16, short_prompt=32 if cpu else 256)
    return FixedBudget(config.max_num_batched_tokens)
