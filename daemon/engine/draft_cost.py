"""What a draft token costs: a small model of decode-only step time, fitted online like the budget's.

    step_seconds ~= a + b*decodes + c*draft_tokens + g*extra_passes + h*draft_passes

fitted by weighted least squares over the recent steps that carried no prompt chunk (recent ones weigh more).
`extra_passes` counts the micro-batches a step runs beyond one: llama.cpp's per-sequence KV streams run a span of
several tokens as a pass of its own unless it is the step's only span, so a draft there costs a pass over the
weights on top of its rows. `draft_passes` are a draft model's forward passes (one per draft position, shared by
the sequences drafting). Until drafts have been measured, c and g are pulled towards half and most of a decode's
cost (a ridge prior of about two steps' weight), so the first drafts are sized conservatively and then measured.

A line misses the kernels' steps: on llama.cpp's CPU backend a Gemma 3 270M step with 5 logits rows cost 2.1 decodes
and one with 4 rows 1.5 (its 262k-row output matrix; docs/bench/speculative_ceiling.md). So each count of tokens in
a step keeps the mean of what the line missed at that count (its residual), added to the line's prediction there.
"""
from __future__ import annotations

import collections

import numpy as np

# a draft row, an extra pass and a draft model's pass, as fractions of one decode step's time
PRIOR_ROW, PRIOR_PASS, PRIOR_DRAFT_PASS = 0.5, 0.8, 0.5
N = 5
REFIT_EVERY = 4  # observations between least-squares fits (a fit costs about a millisecond of Python)
RESIDUAL_PRIOR = 1.0  # a residual is shrunk towards 0 as if by this many (weighted) observations of 0


class DraftCost:
    def __init__(self, window: int = 64, decay: float = 0.96) -> None:
        self._x: collections.deque[tuple[float, ...]] = collections.deque(maxlen=window)
        self._y: collections.deque[float] = collections.deque(maxlen=window)
        self.decay = decay
        self.coef: tuple[float, ...] | None = None  # (a, b, c, g, h)
        self._new = 0  # observations since the last fit
        self._residual: dict[int, float] = {}  # tokens in the step -> mean of (seconds - the line's prediction)

    @property
    def ready(self) -> bool:
        return len(self._y) >= 3

    def observe(self, decodes: int, drafts: int, extra_passes: int, draft_passes: int, seconds: float) -> None:
        """A finished step that carried `decodes` decodes (and no prompt chunk) with `drafts` draft tokens."""
        if decodes <= 0:
            return
        self._x.append((1.0, float(decodes), float(drafts), float(extra_passes), float(draft_passes)))
        self._y.append(seconds)
        self._new += 1

    def predict(self, decodes: int, drafts: int, extra_passes: int, draft_passes: int = 0) -> float:
        if self._new and (self.coef is None or self._new >= REFIT_EVERY) and self.ready:
            self._fit()
        if self.coef is None:
            return 0.0
        t = self._line((1.0, decodes, drafts, extra_passes, draft_passes)) + self._residual.get(decodes + drafts, 0.0)
        return max(t, 0.0)

    def _line(self, x: tuple[float, ...]) -> float:
        return sum(c * v for c, v in zip(self.coef, x))  # type: ignore[arg-type]

    def _fit(self) -> None:
        X, y = np.array(self._x), np.array(self._y)
        w = self.decay ** np.arange(len(y))[::-1]
        plain = X[:, 2] == 0
        per_decode = float(np.average(y[plain] / X[plain, 1], weights=w[plain])) if plain.any() else \
            float(np.average(y / X[:, 1], weights=w))
        prior = np.array([0.0, 0.0, PRIOR_ROW, PRIOR_PASS, PRIOR_DRAFT_PASS]) * per_decode
        lam = np.diag([0.0, 0.0, 2.0, 2.0, 2.0])  # ~two observations of one draft token / pass
        A = X.T @ (w[:, None] * X) + lam
        rhs = X.T @ (w * y) + lam @ prior
        keep = np.ones(N, dtype=bool)
        for _ in range(N):  # every coefficient >= 0: a negative cost is noise; refit with it held at 0
            sol = np.zeros(N)
            sol[keep] = np.linalg.lstsq(A[np.ix_(keep, keep)], rhs[keep], rcond=None)[0]
            if not (sol < 0).any():
                break
            keep &= sol >= 0
        coef = np.maximum(sol, 0.0)
        self.coef = tuple(float(v) for v in coef)
        self._new = 0
        miss, count = y - X @ coef, X[:, 1] + X[:, 2]
        self._residual = {int(n): float(np.sum(w[m] * miss[m]) / (np.sum(w[m]) + RESIDUAL_PRIOR))
                          for n in np.unique(count) if (m := count == n).any()}
