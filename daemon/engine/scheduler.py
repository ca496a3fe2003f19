"""Decides each step: every running decode, then prompt chunks under the budget, then admissions.

One rule covers prefill, chunking and recompute after preemption (as in vLLM v1): a sequence has
`num_tokens` known and `num_computed` cached; a step advances some sequences' `num_computed`.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

from ...backends.base import Batch
from .budget import BudgetPolicy
from .kv import BlockManager, SlotPool
from .sequence import Sequence, Status


# With a shared KV cache, cached prefixes nobody runs are attended (masked) by every query of every step. While
# sequences run, keep at most as many cached tokens as they hold themselves (a step then pays at most twice its
# own attention), but never fewer than this: a system prompt or a short document stays cached.
MIN_CACHED_TOKENS = 1024


def attention_pairs(start: int, n: int) -> int:
    """Causal (query, key) pairs for n new tokens after `start` cached ones."""
    return n * start + n * (n + 1) // 2


def shared_attention_pairs(held: int, n: int) -> int:
    """(query, key) pairs when each of a step's n tokens attends every cell of a shared KV cache that held
    `held` tokens before the step (llama.cpp's unified cache: other sequences' cells are masked, not skipped)."""
    return n * (held + n)


@dataclass
class ScheduledSpan:
    seq: Sequence
    num_tokens: int
    need_logits: bool = False  # fixed at planning time: this span reaches the sequence's last known token

    def __post_init__(self) -> None:
        self.need_logits = self.seq.num_computed + self.num_tokens == self.seq.num_tokens


@dataclass
class StepPlan:
    spans: list[ScheduledSpan] = field(default_factory=list)
    num_decodes: int = 0
    prefill_tokens: int = 0
    budget: int = 0  # the step's token budget (decodes + prefill allowance)
    preempted: list[Sequence] = field(default_factory=list)
    cache_hit_tokens: int = 0  # tokens of this step's admissions served from the prefix cache
    cache_query_tokens: int = 0  # tokens of this step's admissions
    fallback_tokens: int = 0  # cached prefix tokens the runner could no longer serve: recomputed
    held: int | None = None  # tokens cached by all sequences before the step, when the KV cache is shared
    evicted_cached: int = 0  # cached free blocks evicted so that a shared cache's steps stay cheap

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.spans)

    @property
    def attention_work(self) -> int:
        """(query, key) pairs attended this step: the part of a step's cost that grows with context."""
        if self.held is not None:
            return shared_attention_pairs(self.held, self.num_tokens)
        return sum(attention_pairs(s.seq.num_computed, s.num_tokens) for s in self.spans)

    def to_batch(self, block_size: int) -> Batch:
        return Batch.from_spans(
            [(s.seq.slot, s.seq.tokens(s.seq.num_computed, s.seq.num_computed + s.num_tokens), s.seq.num_computed,
              s.seq.block_table, s.need_logits) for s in self.spans],
            block_size,
        )


@dataclass
class SchedulerConfig:
    prefill_mode: str = "chunked"  # chunked | monolithic
    max_num_seqs: int = 8
    max_prefill_chunk: int | None = None  # cap on one sequence's chunk per step (None = the budget)
    max_step_tokens: int | None = None  # the backend's hard limit on one forward pass (llama.cpp n_batch)
    shared_kv: bool = False  # every query attends every cached cell (llama.cpp's unified cache)

    def __post_init__(self) -> None:
        if self.prefill_mode not in ("chunked", "monolithic"):
            raise ValueError(f"prefill_mode must be 'chunked' or 'monolithic', got {self.prefill_mode!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_prefill_chunk is not None and self.max_prefill_chunk < 1:
            raise ValueError(f"max_prefill_chunk must be >= 1, got {self.max_prefill_chunk}")


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, policy: BudgetPolicy,
                 on_release: Callable[[int], None] | None = None) -> None:
        self.config = config
        self.on_release = on_release  # the runner forgets a slot's KV before the slot is reused
        self.blocks = blocks
        self.slots = SlotPool(config.max_num_seqs)
        self.policy = policy
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []  # admission order: oldest first, preempted from the tail

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        fallback_before = self.blocks.fallback_tokens
        if self.config.shared_kv:
            if self.running:
                running = sum(s.num_computed for s in self.running)
                keep = max(running, MIN_CACHED_TOKENS) // self.blocks.block_size
                plan.evicted_cached = self.blocks.evict_cached(keep)
            # cached prefixes nobody runs still occupy cells of the shared cache (llama.cpp's holders)
            plan.held = sum(s.num_computed for s in self.running) + self.blocks.num_cached_free * self.blocks.block_size
        scheduled: set[int] = set()
        # 1. Decodes: one token each, never paused. Out of blocks -> preempt the newest sequence.
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or not seq.is_decoding:
                continue
            if not self._make_room(seq, 1, plan, scheduled):
                continue
            self.blocks.allocate(seq, 1)
            plan.spans.append(ScheduledSpan(seq, 1))
            scheduled.add(seq.seq_id)
            plan.num_decodes += 1
        nxt = next((s for s in self.running if s.seq_id not in scheduled and s.status is Status.RUNNING), None)
        if nxt is None and self.waiting:
            nxt = self.waiting[0]
        allowance = self._allowance(plan, nxt) if nxt else 0
        hard_left = (self.config.max_step_tokens - plan.num_decodes) if self.config.max_step_tokens else None
        plan.budget = plan.num_decodes + allowance
        monolithic = self.config.prefill_mode == "monolithic"
        # 2. Partial prefills (and recomputes) of running sequences, FCFS.
        for seq in list(self.running):
            if seq.seq_id in scheduled or seq.status is not Status.RUNNING:
                continue
            chunk = self._cap(self._chunk(seq, allowance, monolithic, first=not plan.prefill_tokens), hard_left, plan)
            if chunk <= 0:
                continue
            n = chunk if monolithic else min(chunk, self.blocks.max_new_tokens(seq))
            if n <= 0 or not self.blocks.can_allocate(seq, n):
                if not self._make_room(seq, chunk if monolithic else 1, plan, scheduled):
                    continue
                n = chunk if monolithic else min(chunk, self.blocks.max_new_tokens(seq))
            self._add_prefill(plan, seq, n, scheduled)
            allowance -= n
        # 3. Admissions, FCFS, while slots, blocks and budget allow; none in a step that preempted.
        while self.waiting and not plan.preempted and self.slots.num_free:
            seq = self.waiting[0]
            hit = self.blocks.acquire_prefix(seq)  # a cached prefix counts as computed: no special case below
            n = self._cap(self._chunk(seq, allowance, monolithic, first=not plan.prefill_tokens), hard_left, plan)
            if n <= 0 or not self.blocks.can_allocate(seq, n):
                self.blocks.release_prefix(seq)
                break
            if seq.t_first_scheduled is None:
                seq.metrics.cached_tokens = min(hit, len(seq.prompt_ids))
            plan.cache_hit_tokens += hit
            plan.cache_query_tokens += seq.num_tokens
            self.waiting.popleft()
            seq.slot = self.slots.acquire()
            seq.status = Status.RUNNING
            self.running.append(seq)
            self._add_prefill(plan, seq, n, scheduled)
            allowance -= n
        plan.fallback_tokens = self.blocks.fallback_tokens - fallback_before
        return plan

    def _chunk(self, seq: Sequence, allowance: int, monolithic: bool, first: bool) -> int:
        left = seq.num_uncomputed
        if monolithic:
            # Whole prompts only; at least one per step even if it exceeds the budget.
            return left if first or left <= allowance else 0
        cap = self.config.max_prefill_chunk or left
        return min(left, allowance, cap)

    @staticmethod
    def _cap(n: int, hard_left: int | None, plan: StepPlan) -> int:
        """Never exceed the backend's per-forward limit (a monolithic prompt beyond it is split there)."""
        return n if hard_left is None else min(n, hard_left - plan.prefill_tokens)

    def _add_prefill(self, plan: StepPlan, seq: Sequence, n: int, scheduled: set[int]) -> None:
        self.blocks.allocate(seq, n)
        plan.spans.append(ScheduledSpan(seq, n))
        plan.prefill_tokens += n
        scheduled.add(seq.seq_id)

    def _allowance(self, plan: StepPlan, nxt: Sequence) -> int:
        """The policy's prompt budget, told what the decodes and a chunk of P tokens will attend."""
        d = plan.num_decodes
        if plan.held is None:
            decode_work = sum(s.seq.num_computed + 1 for s in plan.spans)
            return self.policy.prefill_budget(d, decode_work, nxt.num_computed)
        # (d + P) * (held + d + P) = d*(held + d) + P*(held + 2d) + P^2, in the policy's P*start + quad*P*(P+1) form
        h = plan.held
        return self.policy.prefill_budget(d, shared_attention_pairs(h, d), h + 2 * d - 1, quad=1.0)

    def _make_room(self, seq: Sequence, n: int, plan: StepPlan, scheduled: set[int]) -> bool:
        """Preempt the newest running sequences until `seq` can take `n` tokens; False if `seq` itself went."""
        while not self.blocks.can_allocate(seq, n):
            victims = [s for s in self.running if s.seq_id not in scheduled]
            victim = victims[-1] if victims else None
            if victim is None:
                return False
            self.preempt(victim)
            plan.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free its KV and slot; it is recomputed from scratch (prompt + output so far) when readmitted."""
        self._release(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.metrics.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        if seq.status is Status.RUNNING:
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED

    def _release(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        if seq.slot is not None:
            if self.on_release is not None:
                self.on_release(seq.slot)
            self.slots.release(seq.slot)
            seq.slot = None
        if seq in self.running:
            self.running.remove(seq)
