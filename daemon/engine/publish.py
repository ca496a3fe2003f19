"""What an engine tells its subscribers (the daemon's EventHub: /api/events, the monitor, /metrics): each step, each
request's moments, the disk cache's writes. The events are built here, on the engine thread, and only while someone
listens, so engine.py keeps its loop and an unwatched engine builds nothing."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .blocks import BlockManager
from .scheduler import Scheduler, StepPlan
from .sequence import Sequence

log = logging.getLogger(__name__)


class Publisher:
    """One engine's subscribers and the events it sends them."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.subscribers: list[Callable[[dict], None]] = []
        self._told_wait: dict[int, tuple[int, str]] = {}  # the last (position, reason) told per waiting sequence

    def subscribe(self, fn: Callable[[dict], None]) -> Callable[[], None]:
        """Call `fn(event)` on the engine thread for every event from now on; returns the unsubscribe function."""
        self.subscribers = self.subscribers + [fn]  # copied, never mutated: the engine thread iterates it unlocked

        def unsubscribe() -> None:
            self.subscribers = [f for f in self.subscribers if f is not fn]

        return unsubscribe

    def __bool__(self) -> bool:
        """Whether anyone listens (callers skip building what nobody reads)."""
        return bool(self.subscribers)

    def emit(self, event: dict) -> None:
        for fn in self.subscribers:
            try:
                fn(event)
            except Exception:  # noqa: BLE001 - a broken subscriber must not stop the engine
                log.exception("event subscriber failed")

    def disk(self, event: dict) -> None:
        if self.subscribers:
            self.emit({"type": "kv_disk", "time": time.time(), "model": self.model, **event})

    def request(self, seq: Sequence, event: str, **extra: Any) -> None:
        if self.subscribers:
            self.emit({"type": "request", "event": event, "time": time.time(), "model": self.model,
                       "seq_id": seq.seq_id, "user": seq.user, "prompt_tokens": seq.metrics.prompt_eval_count,
                       "output_tokens": seq.num_generated, **extra})

    def waits(self, plan: StepPlan) -> None:
        """A "waiting" event for each prompt whose place in the queue, or reason to wait, changed this step."""
        if not self.subscribers:
            return
        for seq in plan.waiting:
            if seq.wait is not None and seq.wait != self._told_wait.get(seq.seq_id):
                self._told_wait[seq.seq_id] = seq.wait
                self.request(seq, "waiting", position=seq.wait[0], reason=seq.wait[1], prefilled=seq.num_computed)
        for span in plan.spans[plan.num_decodes:]:
            self._told_wait.pop(span.seq.seq_id, None)

    def forget(self, seq_id: int) -> None:
        self._told_wait.pop(seq_id, None)

    def step(self, plan: StepPlan, step_s: float, forward_s: float, scheduler: Scheduler, blocks: BlockManager,
             target_ms: float | None, accepted: int) -> None:
        """The step just run: what it carried, how long it took, the queue and the KV pool after it."""
        if not self.subscribers:
            return
        self.emit({
            "type": "step", "time": time.time(), "model": self.model, "decodes": plan.num_decodes,
            "prefill_tokens": plan.prefill_tokens, "prefill_seqs": len(plan.spans) - plan.num_decodes,
            "attention_work": plan.attention_work, "held": plan.held,  # tokens in a shared KV cache (else None)
            "running_tokens": sum(s.num_computed for s in scheduler.running),  # after the step
            "step_ms": step_s * 1e3, "forward_ms": forward_s * 1e3, "budget": plan.budget, "kv_used": blocks.num_used,
            "kv_total": blocks.num_blocks, "running": len(scheduler.running),
            "waiting": len(scheduler.waiting), "preempted": len(plan.preempted), "parked": len(plan.parked),
            "cached_tokens": plan.cache_hit_tokens, "admitted_tokens": plan.cache_query_tokens,
            "kv_cached": blocks.num_cached,
            "prefix_fallback_tokens": plan.fallback_tokens,
            "prefix_rewind_tokens": plan.rewind_tokens,
            # [seq_id, tokens computed] per prompt chunk: lets a monitor draw each ingestion's progress
            "prefilled": [[s.seq.seq_id, s.seq.num_computed] for s in plan.spans[plan.num_decodes:]],
            "target_ms": target_ms,
            # speculative decoding: draft tokens verified this step, how many were kept, decodes that carried them
            "draft_tokens": plan.draft_tokens, "accepted_tokens": accepted,
            "spec_spans": sum(1 for s in plan.spans if s.draft),
        })
