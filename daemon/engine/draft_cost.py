"""What a draft token costs: a small model of decode-only step time, fitted online like the budget's.

    step_seconds ~= a + b*decodes + c*draft_tokens + g*extra_passes + h*draft_passes

fitted by weighted least squares over the recent steps that carried no prompt chunk (recent ones weigh more).
`extra_passes` counts the micro-batches a step runs beyond one: llama.cpp's per-sequence KV streams run a span of
several tokens as a pass of its own unless it is the step's only span, so a draft there costs a pass over the
weights on top of its rows. `draft_passes` are a draft model's forward passes (one per draft position, shared by
the sequences drafting). Until drafts have been measured, c is pulled towards half a decode's cost and g towards
most of a step's (a ridge prior of about two steps' weight), so the first drafts are sized conservatively and then
measured. Steps that carried drafts keep a window of their own: a long run of plain steps (drafts failing, a prompt
going in) does not forget what a draft costs, so the prior does not come back to price the next one.

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
    def __init__(self, window: int = 64, decay: float = 0.96, draft_window: int = 32) -> None:
        # (features, seconds) of plain steps and of steps with drafts, each window its own
        self._plain: collections.deque[tuple[tuple[float, ...], float]] = collections.deque(maxlen=window)
        self._drafted: collections.deque[tuple[tuple[float, ...], float]] = collections.deque(maxlen=draft_window)
        self.decay = decay
        self.coef: tuple[float, ...] | None = None  # (a, b, c, g, h)
        self._new = 0  # observations since the last fit
        self._residual: dict[int, float] = {}  # tokens in the step -> mean of (seconds - the line's prediction)
        self.noise = 0.0  # standard deviation of what the prediction misses, seconds

    @property
    def ready(self) -> bool:
        return len(self._plain) + len(self._drafted) >= 3

    @property
    def most_drafts(self) -> int:
        """The most draft tokens a step in the window was measured with."""
        return int(max((x[2] for x, _ in self._drafted), default=0))

    def observe(self, decodes: int, drafts: int, extra_passes: int, draft_passes: int, seconds: float) -> None:
        """A finished step that carried `decodes` decodes (and no prompt chunk) with `drafts` draft tokens."""
        if decodes <= 0:
            return
        x = (1.0, float(decodes), float(drafts), float(extra_passes), float(draft_passes))
        (self._drafted if drafts or draft_passes else self._plain).append((x, seconds))
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
        rows = list(self._plain) + list(self._drafted)
        X, y = np.array([x for x, _ in rows]), np.array([t for _, t in rows])
        w = np.concatenate([self.decay ** np.arange(len(q))[::-1] for q in (self._plain, self._drafted)])
        plain = X[:, 2] == 0
        ref = plain if plain.any() else np.ones(len(y), dtype=bool)
        per_decode = float(np.average(y[ref] / X[ref, 1], weights=w[ref]))
        # a pass of its own reads the weights again, which is most of a batched step on a CPU (four Gemma 3 270M
        # decodes took 45 ms, and each span with its own pass added about 20 ms), so it is priced like a whole step
        per_step = float(np.average(y[ref], weights=w[ref]))
        prior = np.array([0.0, 0.0, PRIOR_ROW * per_decode, PRIOR_PASS * per_step, PRIOR_DRAFT_PASS * per_decode])
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
        # what the prediction still misses on the steps that carried drafts (the plain ones where none did yet)
        left = miss - np.array([self._residual[int(n)] for n in count])
        on = ~plain if (~plain).sum() >= 3 else np.ones(len(y), dtype=bool)
        self.noise = float(np.sqrt(np.average(left[on] ** 2, weights=w[on])))
