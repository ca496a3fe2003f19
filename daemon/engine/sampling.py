"""Token sampling with Ollama's options, vectorised over the batch in numpy.

Order follows llama.cpp's default chain (what Ollama runs for GGUF models): penalties, top_k,
typical_p, top_p, min_p, temperature, draw. Each request owns a seeded generator and draws exactly one
uniform per sampled token, so a seed gives the same tokens whoever shares the step.
"""
from __future__ import annotations

import secrets
from collections import Counter

import numpy as np

from .params import SamplingParams

_NEG = np.float32(-np.inf)


class RequestRng:
    """A request's own random stream (seed -1 = fresh entropy): one uniform per sampled token, in order."""

    def __init__(self, seed: int) -> None:
        self.seed = seed if seed >= 0 else secrets.randbits(63)
        self._gen = np.random.Generator(np.random.PCG64(self.seed))
        self._ahead: list[float] = []  # drawn by `peek`, not yet used

    def uniform(self) -> float:
        return self._ahead.pop(0) if self._ahead else float(self._gen.random())

    def peek(self, j: int) -> float:
        """The uniform `j` draws ahead, without using it (the rows of a speculative span, sampled at once)."""
        while len(self._ahead) <= j:
            self._ahead.append(float(self._gen.random()))
        return self._ahead[j]

    def skip(self, n: int) -> None:
        """Use up the next `n` uniforms (the rows a speculative span kept)."""
        for _ in range(n):
            self.uniform()

    def at(self, j: int) -> "RngAhead":
        return RngAhead(self, j)


class RngAhead:
    """A row's view of its request's stream, `j` uniforms ahead: a speculative span's row j draws what decoding
    token by token would have drawn for that token, so a seed gives the same tokens with or without drafts."""

    __slots__ = ("rng", "j")

    def __init__(self, rng: RequestRng, j: int) -> None:
        self.rng, self.j = rng, j

    def uniform(self) -> float:
        return self.rng.peek(self.j)


def penalty_window(p: SamplingParams, num_tokens: int) -> int:
    """How many of the latest tokens the penalties look at (0 when no penalty is active)."""
    if p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0:
        return 0
    return num_tokens if p.repeat_last_n == -1 else min(p.repeat_last_n, num_tokens)


def apply_penalties(logits: np.ndarray, history: list[int], p: SamplingParams) -> None:
    """In place on one row, over `history` (the penalty window): repeat (llama.cpp's sign-aware
    divide/multiply), frequency and presence."""
    if not history:
        return
    counts = Counter(history)
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    ids = ids[(ids >= 0) & (ids < logits.shape[0])]
    if ids.size == 0:
        return
    cnt = np.array([counts[int(i)] for i in ids], dtype=np.float32)
    vals = logits[ids]
    if p.repeat_penalty != 1.0:
        vals = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
    vals = vals - cnt * p.frequency_penalty - p.presence_penalty
    logits[ids] = vals


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0))
    return e / np.sum(e, axis=-1, keepdims=True)


def sample_batch(logits: np.ndarray, params: list[SamplingParams], rngs: list["RequestRng | RngAhead"],
                 histories: list[list[int]]) -> np.ndarray:
    """Pick one token per row of `logits` [B, V] (float32, modified in place). Returns int64 [B].
    `histories[i]` is row i's penalty window (see `penalty_window`)."""
    B, V = logits.shape
    for i, p in enumerate(params):
        apply_penalties(logits[i], histories[i], p)
    out = np.argmax(logits, axis=-1).astype(np.int64)
    rows = np.array([i for i, p in enumerate(params) if not p.greedy], dtype=np.int64)
    if rows.size == 0:
        return out
    sub = logits[rows]
    ps = [params[i] for i in rows]
    # Candidates: the largest top_k over the rows (all tokens when any row has top_k off).
    ks = np.array([p.top_k if 0 < p.top_k < V else V for p in ps])
    K = int(ks.max())
    if K < V:
        cand = np.argpartition(-sub, K - 1, axis=-1)[:, :K]
    else:
        cand = np.broadcast_to(np.arange(V), (len(rows), V)).copy()
    vals = np.take_along_axis(sub, cand, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    cand = np.take_along_axis(cand, order, axis=-1)
    vals = np.take_along_axis(vals, order, axis=-1)
    rank = np.arange(K)[None, :]
    keep = rank < ks[:, None]  # top_k
    vals = np.where(keep, vals, _NEG)
    # typical_p: keep the tokens whose surprise is closest to the entropy, up to typical_p mass.
    typ = np.array([p.typical_p for p in ps], dtype=np.float32)
    if np.any(typ < 1.0):
        prob = _softmax(vals)
        logp = np.log(np.where(prob > 0, prob, 1.0))
        ent = -np.sum(prob * logp, axis=-1, keepdims=True)
        dev = np.where(prob > 0, np.abs(-logp - ent), np.inf)
        o = np.argsort(dev, axis=-1, kind="stable")
        cum = np.cumsum(np.take_along_axis(prob, o, axis=-1), axis=-1)
        n_keep = np.sum(cum < typ[:, None], axis=-1) + 1
        keep_sorted = np.arange(K)[None, :] < n_keep[:, None]
        tkeep = np.zeros_like(keep_sorted)
        np.put_along_axis(tkeep, o, keep_sorted, axis=-1)
        vals = np.where(tkeep | (typ[:, None] >= 1.0), vals, _NEG)
    # top_p over the (already sorted) candidates: smallest prefix whose mass reaches top_p.
    top_p = np.array([p.top_p for p in ps], dtype=np.float32)
    if np.any(top_p < 1.0):
        prob = _softmax(vals)
        cum = np.cumsum(prob, axis=-1)
        n_keep = np.sum(cum < top_p[:, None], axis=-1) + 1
        vals = np.where((rank < n_keep[:, None]) | (top_p[:, None] >= 1.0), vals, _NEG)
    # min_p: drop tokens with probability below min_p times the best one's.
    min_p = np.array([p.min_p for p in ps], dtype=np.float32)
    if np.any(min_p > 0.0):
        prob = _softmax(vals)
        vals = np.where(prob >= min_p[:, None] * prob[:, :1], vals, _NEG)
    temp = np.array([p.temperature for p in ps], dtype=np.float32)
    prob = _softmax(vals / temp[:, None])
    cum = np.cumsum(prob, axis=-1)
    u = np.array([rngs[i].uniform() for i in rows], dtype=np.float64)[:, None] * cum[:, -1:]
    pick = np.minimum(np.sum(cum < u, axis=-1), K - 1)
    # Never land on a masked token through rounding at the tail.
    pick = np.where(np.take_along_axis(prob, pick[:, None], axis=-1)[:, 0] > 0, pick, 0)
    out[rows] = cand[np.arange(len(rows)), pick]
    return out
