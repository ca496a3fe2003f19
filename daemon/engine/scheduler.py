"""Decides each step: every running decode, then prompt chunks in rank order under the token budget.

One rule covers prefill, chunking and recompute after preemption (as in vLLM v1): a sequence has
`num_tokens` known and `num_computed` cached; a step advances some sequences' `num_computed`.

Who gets the prompt budget (running partial prefills and queued requests alike, one order): the request's priority,
then the least prompt left to compute (shortest remaining prefill first: a user's next question overtakes a
document being ingested), then arrival. Aging bounds the wait: a prompt passed over `AGING_STEPS` steps in a row goes
first (the oldest of such first; background priorities wait longer), and a request's first step always brings it a
chunk of at least the budget's floor, or its whole prompt when that is short (the policy's `short_prompt`): a user's
next question gets its first token one step after it arrives, whatever the budget leaves and whatever goes first.
A queued request that outranks a running prefill by far takes its slot when none is free; the prefill's computed
blocks stay in the prefix cache, so it resumes where it stopped when a slot frees.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

from ...backends.base import Batch, embeds_in
from .budget import BudgetPolicy
from .blocks import BlockManager, SlotPool
from .sequence import Sequence, Status


# With a shared KV cache, cached prefixes nobody runs are attended (masked) by every query of every step. While
# sequences run, keep at most as many cached tokens as they hold themselves (a step then pays at most twice its
# own attention), but never fewer than this: a system prompt or a short document stays cached.
MIN_CACHED_TOKENS = 1024

# A prompt passed over this many steps in a row goes first for a step (x2 per background priority level, up to x16).
AGING_STEPS = 2
WAIT_SLOT, WAIT_KV, WAIT_PREFILL = "slot", "kv", "prefill"  # why a prompt got nothing this step


def aging_limit(priority: int) -> int:
    return AGING_STEPS << min(max(priority, 0), 4)


def checkpoint_chunk(start: int, n: int, total: int, block_size: int, every: int) -> int:
    """A recurrent model's chunk of `n` tokens from `start` (of `total` known): at most `every`, ending on a block
    boundary where it crosses one, and a prompt's last chunk stopping at its last full block (the furthest a later
    prefix hit can reach), so that the runner saves the state where hits resume."""
    n = min(n, every)
    end = start + n
    if end >= total:
        last = (total - 1) // block_size * block_size
        return last - start if start < last else n
    aligned = end // block_size * block_size
    return aligned - start if aligned > start else n


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
    # a decode's draft tokens (speculative.py), after its known token: num_tokens == 1 + len(draft)
    draft: list[int] = field(default_factory=list)
    draft_bucket: int = 0  # where the draft came from (speculative.py keeps acceptance rates per source)

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
    rewind_tokens: int = 0  # cached prefix tokens past a recurrent model's last checkpoint: recomputed
    parked: list[Sequence] = field(default_factory=list)  # running prefills that gave their slot to a queued request
    waiting: list[Sequence] = field(default_factory=list)  # prompts that got nothing this step (their .wait says why)
    held: int | None = None  # tokens cached by all sequences before the step, when the KV cache is shared
    evicted_cached: int = 0  # cached free blocks evicted so that a shared cache's steps stay cheap

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.spans)

    @property
    def draft_tokens(self) -> int:
        return sum(len(s.draft) for s in self.spans)

    @property
    def attention_work(self) -> int:
        """(query, key) pairs attended this step: the part of a step's cost that grows with context."""
        if self.held is not None:
            return shared_attention_pairs(self.held, self.num_tokens)
        return sum(attention_pairs(s.seq.num_computed, s.num_tokens) for s in self.spans)

    def to_batch(self, block_size: int) -> Batch:
        batch = Batch.from_spans(
            [(s.seq.slot, s.seq.tokens(s.seq.num_computed, s.seq.num_computed + s.num_tokens - len(s.draft)) + s.draft,
              s.seq.num_computed, s.seq.block_table, s.need_logits, bool(s.draft)) for s in self.spans],
            block_size,
        )
        for s, span in zip(self.spans, batch.spans):
            if s.seq.embeds:  # image spans: the runner feeds these rows instead of the placeholder ids
                for flat, rows, causal in embeds_in(s.seq.embeds, span.start_pos, span.length, span.start):
                    batch.token_ids[flat:flat + len(rows)] = [0] * len(rows)
                    batch.embeds.append((flat, rows, causal))
        return batch


@dataclass
class SchedulerConfig:
    prefill_mode: str = "chunked"  # chunked | monolithic
    max_num_seqs: int = 8
    max_prefill_chunk: int | None = None  # cap on one sequence's chunk per step (None = the budget)
    max_step_tokens: int | None = None  # the backend's hard limit on one forward pass (llama.cpp n_batch)
    shared_kv: bool = False  # every query attends every cached cell (llama.cpp's unified cache)
    checkpoint_every: int | None = None  # a recurrent model's checkpoint spacing (Runner.checkpoint_every)

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
        self.running: list[Sequence] = []  # admission order: oldest first

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.uncached_estimate = seq.num_tokens - self.blocks.cached_prefix_tokens(seq)
        self.waiting.append(seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        fallback_before, rewind_before = self.blocks.fallback_tokens, self.blocks.rewind_tokens
        if self.config.shared_kv:
            if self.running:
                running = sum(s.num_computed for s in self.running)
                keep = max(running, MIN_CACHED_TOKENS) // self.blocks.block_size
                plan.evicted_cached = self.blocks.evict_cached(keep)
            # cached prefixes nobody runs still occupy cells of the shared cache (llama.cpp's holders)
            plan.held = sum(s.num_computed for s in self.running) + self.blocks.num_cached_free * self.blocks.block_size
        scheduled: set[int] = set()
        # 1. Decodes: one token each, never paused. Out of blocks -> preempt the least urgent sequence.
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or not seq.is_decoding:
                continue
            if not self._make_room(seq, 1, plan, scheduled):
                continue
            self.blocks.allocate(seq, 1)
            plan.spans.append(ScheduledSpan(seq, 1))
            scheduled.add(seq.seq_id)
            plan.num_decodes += 1
        self._schedule_prompts(plan, scheduled)
        plan.fallback_tokens = self.blocks.fallback_tokens - fallback_before
        plan.rewind_tokens = self.blocks.rewind_tokens - rewind_before
        return plan

    def remaining(self, seq: Sequence) -> int:
        """Prompt tokens `seq` has left to compute (a queued one: as estimated, cache hits counted, when queued)."""
        return seq.num_uncomputed if seq.status is Status.RUNNING else seq.uncached_estimate

    def rank(self, seq: Sequence) -> tuple[int, int, int]:
        return seq.priority, self.remaining(seq), seq.t_arrival

    def _prompt_order(self, scheduled: set[int]) -> list[Sequence]:
        """Running prefills (and recomputes) and queued requests in the order they get the prompt budget."""
        partial = [s for s in self.running if s.seq_id not in scheduled and s.status is Status.RUNNING]
        if self.config.prefill_mode == "monolithic":  # the baseline: first come, first served
            return partial + list(self.waiting)
        # the starved first, oldest first (under overload the queue of short prompts ages too); then by rank
        return sorted(partial + list(self.waiting),
                      key=lambda s: (0, s.t_arrival, 0) if s.skipped >= aging_limit(s.priority) else (1, *self.rank(s)))

    def _schedule_prompts(self, plan: StepPlan, scheduled: set[int]) -> None:
        hard_left = (self.config.max_step_tokens - plan.num_decodes) if self.config.max_step_tokens else None
        order = self._prompt_order(scheduled)
        for pos, seq in enumerate(order):
            queued = seq.status is Status.WAITING
            if queued and (plan.preempted or not self._slot_for(seq, plan, scheduled)):
                seq.wait = (pos + 1, WAIT_KV if plan.preempted else WAIT_SLOT)  # none admitted in a preempting step
                continue
            hit = self.blocks.acquire_prefix(seq) if queued else 0  # a cached prefix counts as computed
            n = self._chunk(seq, plan, hard_left)
            if not plan.spans[plan.num_decodes:]:
                plan.budget = plan.num_decodes + n
            reason = WAIT_PREFILL
            if n > 0 and not self.blocks.can_allocate(seq, n):
                if queued:
                    n, reason = 0, WAIT_KV
                elif self._make_room(seq, 1, plan, scheduled):
                    n = min(n, self.blocks.max_new_tokens(seq))
                else:
                    continue  # it was preempted itself
            if n <= 0:
                if queued:
                    self.blocks.release_prefix(seq)
                seq.wait = (pos + 1, reason)
                continue
            if queued:
                self._admit(seq, hit, plan)
            self._add_prefill(plan, seq, n, scheduled)
        for pos, seq in enumerate(order):
            if seq.seq_id in scheduled:
                seq.skipped, seq.wait = 0, None
            else:
                seq.skipped += 1
                if seq.status is not Status.FINISHED:
                    plan.waiting.append(seq)
        plan.budget = max(plan.budget, plan.num_tokens)

    def _admit(self, seq: Sequence, hit: int, plan: StepPlan) -> None:
        if seq.t_first_scheduled is None:
            seq.metrics.cached_tokens = min(hit, len(seq.prompt_ids))
        plan.cache_hit_tokens += hit
        plan.cache_query_tokens += seq.num_tokens
        self.waiting.remove(seq)
        seq.slot = self.slots.acquire()
        seq.status = Status.RUNNING
        self.running.append(seq)

    def _slot_for(self, seq: Sequence, plan: StepPlan, scheduled: set[int]) -> bool:
        """A free slot, or the slot of a running prefill that `seq` outranks by far (same priority: twice the work
        left), parked: its computed blocks stay cached and it is readmitted when a slot frees."""
        if self.slots.num_free:
            return True
        if self.config.prefill_mode == "monolithic":
            return False
        mine = self.remaining(seq)
        victims = [v for v in self.running if v.seq_id not in scheduled and not v.is_decoding
                   and (v.priority > seq.priority or (v.priority == seq.priority and self.remaining(v) > 2 * mine))]
        if not victims:
            return False
        victim = max(victims, key=lambda v: (v.priority, self.remaining(v)))
        self.preempt(victim)
        plan.parked.append(victim)
        return True

    def _chunk(self, seq: Sequence, plan: StepPlan, hard_left: int | None) -> int:
        """How many of `seq`'s tokens this step takes, given what it already holds."""
        left = seq.num_uncomputed
        offer = self._offer(plan, seq)
        if self.config.prefill_mode == "monolithic":
            # Whole prompts only; at least one per step even if it exceeds the budget.
            n = left if not plan.prefill_tokens or left <= offer else 0
        else:
            if seq.t_first_scheduled is None:  # a request's first step brings it a chunk: all of a short prompt
                room = self.policy.max_tokens - plan.num_tokens
                offer = max(offer, min(left if left <= self.policy.short_prompt else self.policy.floor, room))
            n = min(left, offer, self.config.max_prefill_chunk or left)
        # never exceed the backend's per-forward limit (a monolithic prompt beyond it is split there)
        n = n if hard_left is None else min(n, hard_left - plan.prefill_tokens)
        if self.config.checkpoint_every and n > 0 and self.config.prefill_mode == "chunked":
            n = checkpoint_chunk(seq.num_computed, n, seq.num_tokens, self.blocks.block_size,
                                 self.config.checkpoint_every)
        if seq.embeds and n > 0:  # an image that must run whole: up to it, or all of it (a step can run long)
            whole = seq.fit_chunk(n)
            n = whole if hard_left is None or whole <= hard_left - plan.prefill_tokens else 0
        return n

    def _add_prefill(self, plan: StepPlan, seq: Sequence, n: int, scheduled: set[int]) -> None:
        self.blocks.allocate(seq, n)
        plan.spans.append(ScheduledSpan(seq, n))
        plan.prefill_tokens += n
        scheduled.add(seq.seq_id)

    def _offer(self, plan: StepPlan, seq: Sequence) -> int:
        """The policy's tokens for one more chunk (of `seq`), told what the step already attends."""
        d, planned, spans = plan.num_decodes, plan.prefill_tokens, len(plan.spans) - plan.num_decodes
        if plan.held is None:
            work = sum(attention_pairs(s.seq.num_computed, s.num_tokens) for s in plan.spans)
            return self.policy.prefill_budget(d, work, seq.num_computed, planned=planned, spans=spans)
        # (T + P) * (held + T + P) = T*(held + T) + P*(held + 2T) + P^2 with T tokens planned, in the policy's
        # P*start + quad*P*(P+1) form
        t, h = d + planned, plan.held
        return self.policy.prefill_budget(d, shared_attention_pairs(h, t), h + 2 * t - 1, quad=1.0, planned=planned,
                                          spans=spans)

    def _make_room(self, seq: Sequence, n: int, plan: StepPlan, scheduled: set[int]) -> bool:
        """Preempt the least urgent running sequences (prefills before decodes, then the newest) until `seq` can take
        `n` tokens; False if `seq` itself went."""
        while not self.blocks.can_allocate(seq, n):
            victims = [s for s in self.running if s.seq_id not in scheduled]
            if not victims:
                return False
            victim = max(victims, key=lambda v: (v.priority, not v.is_decoding, v.t_arrival))
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
        seq.uncached_estimate = seq.num_tokens - self.blocks.cached_prefix_tokens(seq)
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
