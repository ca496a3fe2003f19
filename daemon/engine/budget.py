"""How many prompt tokens a step may take on top of its decodes.

Fixed policy: Sarathi's `chunk = min(C_max, T_budget - N_decodes)`. The adaptive, latency-targeted
policy lives beside it and is chosen by `make_budget_policy` (config.py).
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class StepCost:
    """What a finished step did and how long it took; fed back to the policy."""

    num_decodes: int
    prefill_tokens: int
    attention_work: int  # (query, key) pairs attended, summed over spans: what grows with context
    seconds: float
    prefill_spans: int = -1  # prompt chunks in the step; -1: one if prefill_tokens else none

    def __post_init__(self) -> None:
        if self.prefill_spans < 0:
            self.prefill_spans = int(self.prefill_tokens > 0)


class BudgetPolicy(Protocol):
    floor: int  # the smallest chunk worth a step (ingestion always progresses by at least this)
    max_tokens: int  # no step carries more tokens than this, decodes included
    short_prompt: int  # a new request with at most this many prompt tokens to compute runs whole in its first step

    def prefill_budget(self, num_decodes: int, work: int, prefill_start: int = 0, quad: float = 0.5,
                       planned: int = 0, spans: int = 0) -> int:
        """Tokens one more prompt chunk may take in a step that already holds `num_decodes` decodes and `planned`
        prompt tokens in `spans` chunks, attending `work` (query, key) pairs; the new chunk of P tokens attends
        P*prefill_start + quad*P*(P+1) more."""
        ...

    def observe(self, cost: StepCost) -> None:
        ...


class FixedBudget:
    """A fixed token budget per step shared by decodes and prompt chunks."""

    floor = 1
    short_prompt = 0  # the budget is fixed: a prompt gets what it leaves

    def __init__(self, max_num_batched_tokens: int) -> None:
        self.max_tokens = max_num_batched_tokens

    def prefill_budget(self, num_decodes: int, work: int, prefill_start: int = 0, quad: float = 0.5,
                       planned: int = 0, spans: int = 0) -> int:
        return max(0, self.max_tokens - num_decodes - planned)

    def observe(self, cost: StepCost) -> None:
        pass


class AdaptiveBudget:
    """Sizes each prompt chunk so the step stays under a target inter-token latency.

    Cost model, refitted every step by least squares over a sliding window of measured steps, recent ones
    weighted more:
        step_seconds ~= a + b*decodes + e*[prefill_tokens > 0] + g*(chunks - 1) + c*prefill_tokens + d*attention_work
    where attention_work counts the (query, key) pairs attended: a decode at context n adds n, a chunk of
    P tokens after s cached ones adds P*s + P(P+1)/2, so a chunk deep into a long prompt costs more than
    the same chunk at its start; e is the fixed price of a step carrying any chunk (llama.cpp switches to
    its batched kernels), g that of each further chunk (llama.cpp's per-sequence streams run every chunk as a
    micro-batch of its own: one more pass over the weights). The chunk is the largest P with
        a + b*D + e + d*(W_D + P*s + P(P+1)/2) + c*P <= margin*target - tail*noise
    and a step that already plans chunks sizes the next one the same way, with their tokens, work and g added
    (a quadratic in P; with a shared KV cache, where every query attends every cached cell, the scheduler
    passes the terms of (D + P) * (held + D + P) instead), rounded down to
    a multiple of `tile` (16 on GPUs, where GEMMs run in tile waves and 257 rows cost like 272; 1 on
    CPUs, whose matmul cost is linear in rows, where rounding 28 down to 16 would waste 40% of the
    step), never below `floor` so ingestion always progresses. With no decodes
    in the step nobody is waiting on a token, so the prompt runs at full speed (`max_tokens`).
    Limits: the model is linear, so a backend whose cost jumps at tile/ubatch boundaries is fitted on
    average (the margin and one residual standard deviation absorb that and timing noise); a chunk never
    exceeds 1.5x the largest chunk measured in the window (no blind extrapolation) and is halved for one step
    when the number of decodes changed since the last mixed step; until enough distinct
    steps are seen, chunks
    grow geometrically from the floor to probe the curve; the window forgets old steps, so the fit
    follows a cost that changes (thermal throttling, another process on the machine). Steps that took over
    twice their predicted time (a burst of contention) are left out of the fit unless among the last 8, and a
    window left with a single chunk size probes up from its last step's cost scaled by tokens.
    """

    def __init__(self, target_ms: float, max_tokens: int, tile: int = 16, floor: int = 16, window: int = 96,
                 margin: float = 0.97, short_prompt: int = 0, tail: float = 2.33) -> None:
        if target_ms <= 0:
            raise ValueError(f"target_ms must be > 0, got {target_ms}")
        self.target = target_ms / 1e3
        self.max_tokens = max_tokens
        self.floor = max(1, min(floor, max_tokens))
        self.short_prompt = max(0, min(short_prompt, max_tokens))
        self.margin = margin
        # The aim stays this many residual deviations under the target: 2.33 is normal noise's 99th percentile, so the
        # P99 of the steps, not their mean, is what meets it. With 1 (until issue 39) the streams' P99 gap sat 5-15 ms
        # over the target; in virtual time (docs/bench/stall_replay.py --tails) 2.33 brings it under at 5-10% jitter
        # for a 5-12% longer TTFT of the document going in.
        self.tail = tail
        self.tile = max(1, tile)
        self._rows: collections.deque[tuple[float, ...]] = collections.deque(maxlen=window)
        self._y: collections.deque[float] = collections.deque(maxlen=window)
        self.coef: np.ndarray | None = None  # (a, b, e, g, c, d) once fitted
        self.noise = 0.0  # residual standard deviation of the fit, seconds
        self._probe = self.floor
        self.decay = 0.95
        self._last_mix_decodes = -1
        self._last_mix: tuple[int, int, float] | None = None  # (decodes, chunk, seconds) of the last mixed step
        self._stale = False  # the window lost the variety of chunk sizes a fit needs

    def prefill_budget(self, num_decodes: int, work: int, prefill_start: int = 0, quad: float = 0.5,
                       planned: int = 0, spans: int = 0) -> int:
        room = self.max_tokens - num_decodes - planned
        if room <= 0:
            return 0
        if num_decodes == 0:
            return room
        # The floor keeps the first chunk of a step moving; a further chunk takes only what the target leaves.
        floor = min(self.floor, room) if not spans else 0
        if self._stale and self._last_mix is not None:
            # Probe from the last mixed step: a step's cost grows at most in proportion to its tokens (the fixed
            # part does not grow), so scaling its measured time gives a chunk that cannot overshoot the aim.
            d0, p0, t0 = self._last_mix
            chunk = self.margin * self.target / max(t0, 1e-9) * (d0 + p0) - num_decodes - planned
            chunk = int(min(chunk, room)) // self.tile * self.tile
            return max(floor, min(chunk, room))
        if self.coef is None:
            return max(floor, min(self._probe - planned, room))
        a, b, e, g, c, d = self.coef
        slack = self.aim(self.noise) - (a + b * num_decodes + e + g * spans + c * planned + d * work)
        lin = c + d * (prefill_start + quad)  # cost per chunk token, plus quad*d per token squared
        q = quad * d
        if spans:
            slack -= g  # this chunk is one more
        if slack <= 0:
            chunk = 0.0
        elif q > 0:
            chunk = (-lin + math.sqrt(lin * lin + 4.0 * q * slack)) / (2.0 * q)
        else:
            chunk = slack / lin if lin > 0 else room
        # Trust region: never extrapolate far beyond the step sizes the fit has actually measured, and when
        # the number of decodes differs from the last mixed step's, take half a step to validate the fit first.
        measured = max((r[4] for r in self._rows if r[1] > 0), default=0)
        chunk = min(chunk, max(self.floor, 1.5 * measured) - planned)
        if num_decodes != self._last_mix_decodes:
            chunk /= 2
        chunk = int(max(min(chunk, room), 0)) // self.tile * self.tile
        return max(floor, min(chunk, room))

    def aim(self, noise: float) -> float:
        """The step time to plan for, given the standard deviation of what the cost model misses (seconds)."""
        return self.margin * self.target - self.tail * noise

    def observe(self, cost: StepCost) -> None:
        if cost.num_decodes == 0 and cost.prefill_tokens == 0:
            return
        self._rows.append(self._features(cost.num_decodes, cost.prefill_tokens, cost.attention_work,
                                         cost.prefill_spans))
        self._y.append(cost.seconds)
        if cost.num_decodes and cost.prefill_tokens:
            self._last_mix_decodes = cost.num_decodes
            self._last_mix = (cost.num_decodes, cost.prefill_tokens, cost.seconds)
        if cost.num_decodes and cost.prefill_tokens and self.coef is None and not self._stale:
            # Probing before the fit: only mixed steps say anything about the prompt-token cost.
            over = cost.seconds > self.margin * self.target
            self._probe = max(self.floor, self._probe // 2) if over else min(self._probe * 2, self.max_tokens)
        if len(self._y) >= 4:
            self._fit()  # a 96x4 least squares costs tens of microseconds: refit every step

    def _fit(self) -> None:
        X = np.array(self._rows)
        y = np.array(self._y)
        if np.linalg.matrix_rank(X) < 3 or len(set(X[:, 4])) < 2:
            # Every step in the window took the same chunk (the floor, say, after a burst of contention): the fit
            # cannot tell what another size costs; rather than trust a stale fit for ever, probe (prefill_budget).
            self._stale = self.coef is not None or self._stale
            return
        self._stale = False
        # Recent steps weigh more (half-life ~14 steps), so the fit follows the cost of what runs now.
        w = np.sqrt(self.decay ** np.arange(len(y))[::-1])
        coef = self._lstsq(X, y, w)
        # A burst of contention (another process taking the cores) makes some steps many times dearer; fitted,
        # they pin chunks to the floor long after it ends. Contention only ever adds time, so refit without the
        # steps that took over twice their predicted time, a few rounds; the last 8 steps always count, so a
        # lasting slowdown is followed.
        keep_recent = np.arange(len(y)) >= len(y) - 8
        use = np.ones(len(y), dtype=bool)
        for _ in range(3):
            pred = X @ coef
            nxt = (y - pred <= np.maximum(pred, 0.1 * self.target)) | keep_recent
            if (nxt == use).all() or np.linalg.matrix_rank(X[nxt]) < 3 or len(set(X[nxt, 4])) < 2:
                break
            use = nxt
            coef = self._lstsq(X[use], y[use], w[use])
        X, y, w = X[use], y[use], w[use]
        self.coef = coef
        # Timing noise: the aim stays `tail` residual standard deviations below the target so the tail, not just
        # the mean, stays under it; measured on the steps that carried a chunk, the ones being sized.
        mixed = X[:, 4] > 0
        r = (y - X @ self.coef)[mixed]
        wm = (w ** 2)[mixed]
        self.noise = float(np.sqrt(np.sum(wm * r ** 2) / np.sum(wm))) if len(r) >= 3 else 0.0

    @staticmethod
    def _lstsq(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Weighted least squares with every coefficient >= 0 (a negative cost is noise: refit without it)."""
        scale = np.maximum(np.abs(X).max(axis=0), 1e-12)  # columns span 1..1e6: normalise for lstsq
        Xs = X / scale
        keep = np.ones(X.shape[1], dtype=bool)
        for _ in range(X.shape[1]):
            sub, *_ = np.linalg.lstsq(Xs[:, keep] * w[:, None], y * w, rcond=None)
            coef = np.zeros(X.shape[1])
            coef[keep] = sub
            if not (coef < 0).any():
                break
            keep &= coef >= 0
        return np.maximum(coef, 0.0) / scale

    @staticmethod
    def _features(num_decodes: int, prefill_tokens: int, attention_work: int, spans: int) -> tuple[float, ...]:
        return (1.0, num_decodes, float(prefill_tokens > 0), max(spans - 1, 0), prefill_tokens, attention_work)
