"""Log-probabilities of sampled tokens: the model's log-softmax over its raw logits, as Ollama and vLLM report them.

Computed only for the rows of a step whose request asked (`logprobs` >= 0 alternatives), before penalties,
grammar masks, temperature and truncation touch the logits, so they describe the model, not the sampler.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's and Ollama's upper bound for top_logprobs


@dataclass
class TokenLogprob:
    """One generated token's log-probability and the `k` most likely tokens at its position (best first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of float32 logits [B, V], in float64 so the sums stay exact to ~1e-12."""
    x = rows.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    x -= np.where(np.isfinite(m), m, 0.0)
    return x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))


def token_logprob(logp: np.ndarray, token: int, k: int) -> TokenLogprob:
    """The chosen `token`'s entry from one row of `log_softmax`, with the top `k` alternatives."""
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, logp.shape[0])
        idx = np.argpartition(-logp, k - 1)[:k]
        idx = idx[np.argsort(-logp[idx], kind="stable")]
        top = [(int(i), float(logp[i])) for i in idx]
    return TokenLogprob(int(token), float(logp[token]), top)
