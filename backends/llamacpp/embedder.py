"""Final hidden states for /api/embed from a separate, lazily created embeddings context.

A second `llama_context` on the same model (weights shared) with embeddings on and no pooling, so an
embedding request never touches the generation context's KV cache or its output buffers.
"""
from __future__ import annotations

import logging

import numpy as np
from .lib import L

from .native import take_recent_errors

log = logging.getLogger(__name__)
_MIN_CTX = 512


class Embedder:
    """Owns the embeddings context: a small one kept, a larger one (up to `max_tokens`) made for a longer input
    and freed after it."""

    def __init__(self, model, n_embd: int, max_tokens: int, n_threads: int):
        self._model, self._n_embd, self._max_tokens, self._n_threads = model, n_embd, max_tokens, n_threads
        self._ctx = None
        self._n_ctx = 0
        self._batch = None

    def embed(self, token_ids: list[int]) -> np.ndarray:
        """[len(token_ids), n_embd] float32, the output-norm hidden state of every token."""
        n = len(token_ids)
        if n == 0:
            return np.zeros((0, self._n_embd), dtype=np.float32)
        if n > self._max_tokens:
            raise ValueError(f"input of {n} tokens exceeds the context length {self._max_tokens}")
        if n > self._n_ctx:
            self._create(n)
        b = self._batch
        b.n_tokens = n
        for i, t in enumerate(token_ids):  # embeddings are rare and short; clarity over speed here
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
            b.seq_id[i][0] = 0
        mem = L.llama_get_memory(self._ctx)
        L.llama_memory_clear(mem, True)
        rc = L.llama_decode(self._ctx, b)
        try:
            if rc != 0:
                raise RuntimeError(f"llama_decode (embeddings) failed with {rc}: {take_recent_errors()}")
            ptr = L.llama_get_embeddings(self._ctx)
            if not ptr:
                raise RuntimeError("llama.cpp returned no embeddings for this model")
            return np.ctypeslib.as_array(ptr, shape=(n, self._n_embd)).astype(np.float32, copy=True)
        finally:
            L.llama_memory_clear(mem, True)  # no KV kept between requests
            if self._n_ctx > _MIN_CTX:
                # A long input's context holds every token's logits and its attention buffers (1.6 GB after one
                # 4096-token input of a 135M model): freed now, not kept until the model unloads.
                self.close()

    def _create(self, n: int) -> None:
        self.close()
        size = _MIN_CTX
        while size < n:
            size *= 2
        size = min(size, self._max_tokens)
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = size
        cp.n_seq_max = 1
        cp.embeddings = True
        cp.pooling_type = L.LLAMA_POOLING_TYPE_NONE
        cp.n_threads = cp.n_threads_batch = self._n_threads
        ctx = L.llama_init_from_model(self._model, cp)
        if not ctx:
            raise RuntimeError(f"could not create an embeddings context of {size} tokens: {take_recent_errors()}")
        self._ctx, self._n_ctx = ctx, size
        self._batch = L.llama_batch_init(size, 0, 1)
        log.debug("embeddings context: %d tokens", size)

    def close(self) -> None:
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
        self._ctx, self._n_ctx = None, 0
