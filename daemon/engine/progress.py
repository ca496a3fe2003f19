"""Prompt progress told to the requests that ask for it (llama-server's `return_progress`): while a prompt waits
and is computed, its stream gets reports of the tokens computed, cached and in all, the time since it arrived,
and while it waits its place in the prompt order and why. Reports are throttled (a chunk can be a handful of
tokens), except the first (when the request is queued), the last (when its prompt is done) and the news that it
waits for a slot or for KV memory (not for the step's prompt budget: that comes and goes every step)."""
from __future__ import annotations

import time
from typing import Any

from .scheduler import WAIT_KV, WAIT_SLOT, StepPlan
from .sequence import Delta, Sequence

REPORT_EVERY_S = 0.25  # at most four reports a second per request, besides its first and last
BLOCKED = (WAIT_SLOT, WAIT_KV)  # waiting reasons told at once


def report(seq: Sequence, now_ns: int) -> dict[str, Any]:
    """llama-server's prompt_progress fields (`processed` counts the cached tokens too), and where it waits."""
    out: dict[str, Any] = {"total": len(seq.prompt_ids), "cache": seq.metrics.cached_tokens,
                           "processed": min(seq.num_computed, len(seq.prompt_ids)),
                           "time_ms": max(now_ns - seq.t_arrival, 0) // 1_000_000}
    if seq.wait is not None:
        out["position"], out["reason"] = seq.wait
    return out


class PromptProgress:
    """The engine's reporter: which sequences asked, and when each was last told."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, str | None]] = {}  # seq id -> (monotonic time, BLOCKED reason) last told

    def __bool__(self) -> bool:
        return bool(self._last)

    def add(self, seq: Sequence) -> None:
        """A request that asked for progress reached the engine: its first report (nothing computed yet)."""
        if seq.report_progress:
            self._last[seq.seq_id] = (time.monotonic(), None)
            self._push(seq)

    def forget(self, seq_id: int) -> None:
        self._last.pop(seq_id, None)

    def after_step(self, plan: StepPlan) -> None:
        """After a step's prompt chunks are computed: report the watched prompts that ran or waited."""
        now = time.monotonic()
        for seq in [s.seq for s in plan.spans[plan.num_decodes:]] + plan.waiting:
            told = self._last.get(seq.seq_id)
            if told is None:
                continue
            reason = seq.wait[1] if seq.wait is not None and seq.wait[1] in BLOCKED else None
            done = seq.num_computed >= len(seq.prompt_ids)
            if done or reason != told[1] or now - told[0] >= REPORT_EVERY_S:
                self._last[seq.seq_id] = (now, reason)
                self._push(seq)
            if done:  # its first token comes next: no more progress for it
                del self._last[seq.seq_id]

    @staticmethod
    def _push(seq: Sequence) -> None:
        if seq.stream is not None:
            seq.stream.push(Delta("", [], progress=report(seq, time.perf_counter_ns())))
