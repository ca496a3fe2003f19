"""Prompt-lookup drafting: the next tokens guessed from where the sequence's latest tokens occurred before.

A model answering from a document copies names, dates and clauses out of it; where the last few tokens of the
sequence (prompt and output) occurred earlier, the tokens that followed them there are a likely continuation. The
search is a vectorised scan over the sequence's own tokens (no index to build or keep), a few microseconds for a
2k-token prompt, so a step pays almost nothing for a sequence whose drafts keep failing.
"""
from __future__ import annotations

import numpy as np

MAX_MATCH = 8  # longest suffix compared; a longer match says no more about the next tokens


class TokenHistory:
    """A sequence's known tokens as a growing int64 array (appended as the sequence grows, never rebuilt; an image's
    placeholder ids are negative 64-bit numbers)."""

    def __init__(self, shifts: int = 0) -> None:
        self._buf = np.zeros(64, dtype=np.int64)
        self.n = 0
        self.shifts = shifts  # the sequence's context shifts when this was started: one more, and it is stale

    def sync(self, tokens_of, num_tokens: int) -> None:
        """Bring the array up to `num_tokens` (the sequence only grows): `tokens_of(start, end)` gives the known
        tokens [start, end)."""
        if num_tokens <= self.n:
            return
        if num_tokens > len(self._buf):
            buf = np.zeros(max(num_tokens, 2 * len(self._buf)), dtype=np.int64)
            buf[: self.n] = self._buf[: self.n]
            self._buf = buf
        self._buf[self.n:num_tokens] = tokens_of(self.n, num_tokens)
        self.n = num_tokens

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[: self.n]


def lookup(tokens: np.ndarray, k: int, min_match: int = 1) -> tuple[list[int], int]:
    """(draft, match length): up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` (at least `min_match` long, at most MAX_MATCH); ([], 0) when there is none."""
    n = len(tokens)
    if n < 2 or k <= 0:
        return [], 0
    # candidate j: tokens[j] equals the last token, j < n - 1; its continuation starts at j + 1
    cand = np.flatnonzero(tokens[: n - 1] == tokens[n - 1])
    if len(cand) == 0:
        return [], 0
    m = 1
    while m < MAX_MATCH:
        ok = cand >= m
        nxt = cand[ok][tokens[cand[ok] - m] == tokens[n - 1 - m]]
        if len(nxt) == 0:
            break
        cand, m = nxt, m + 1
    if m < min_match:
        return [], 0
    start = int(cand[-1]) + 1  # the latest occurrence: nearest context, most likely what is being copied now
    draft = tokens[start: start + k].tolist()
    cut = next((i for i, t in enumerate(draft) if t < 0), len(draft))  # an image's rows are never a draft
    return (draft[:cut], m) if cut else ([], 0)


class PromptLookup:
    """The drafter of speculative.py that needs no model: a sequence's own tokens, searched each step."""

    sequential = False  # drafting costs no forward pass

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._histories: dict[int, TokenHistory] = {}
        self._found: dict[int, list[int]] = {}

    def offer(self, seq, cap: int) -> tuple[int, int]:
        """(draft tokens available, acceptance bucket = the match length, at most 4) for a sequence about to
        decode; (0, 0) when its latest tokens occurred nowhere before."""
        h = self._histories.get(seq.seq_id)
        if h is None or h.shifts != seq.metrics.shifts:  # a context shift rewrote the sequence's tokens
            h = self._histories[seq.seq_id] = TokenHistory(seq.metrics.shifts)
        h.sync(seq.tokens, seq.num_tokens)
        draft, match = lookup(h.tokens, cap)
        # an image's placeholder ids (negative) are no tokens: the draft stops before one
        n = next((i for i, t in enumerate(draft) if not 0 <= t < self.vocab_size), len(draft))
        self._found[seq.seq_id] = draft[:n]
        return n, min(match, 4) if n else 0

    def follow(self, spans) -> None:
        """Nothing to read along: the sequence's tokens are its state."""

    def draft(self, wants: list[tuple[object, int]]) -> list[list[int]]:
        """The first k tokens offered to each (sequence, k)."""
        return [self._found.pop(seq.seq_id, [])[:k] for seq, k in wants]  # type: ignore[attr-defined]

    def rejected(self, seq, num_computed: int) -> None:
        """Nothing to take back: no KV of its own."""

    def forget(self, seq_id: int) -> None:
        self._histories.pop(seq_id, None)
        self._found.pop(seq_id, None)
