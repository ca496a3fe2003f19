"""A step that carries image rows: a llama_batch holds token ids OR embeddings, so such a step is several
llama_decode calls over the same KV cells: first every span without image rows (one call, as always), then each
span with image rows, its text and image segments in prompt order (a later segment attends the earlier ones'
KV), as mtmd_helper_decode_image_chunk does. Positions are the engine's (one per row; M-RoPE is refused at load)."""
from __future__ import annotations

import ctypes

import numpy as np
from .lib import L

from ..base import Batch, SeqSpan


def _segments(span: SeqSpan, embeds: list[tuple[int, np.ndarray, bool]]) -> list[tuple[int, int, object, bool]]:
    """(flat start, length, rows or None, causal) pieces of a span, in order."""
    out, at, end = [], span.start, span.start + span.length
    for flat, rows, causal in embeds:
        if flat >= end or flat + len(rows) <= at:
            continue
        if flat > at:
            out.append((at, flat - at, None, True))
        out.append((flat, len(rows), rows, causal))
        at = flat + len(rows)
    if at < end:
        out.append((at, end - at, None, True))
    return out


def decode_with_embeddings(runner, order: list[int], spans: list[SeqSpan], seqs: list[int], tok: np.ndarray,
                           pos: np.ndarray, result: np.ndarray, row_of: dict[int, int], batch: Batch) -> None:
    """The step's spans through llama_decode: token spans together, then each span holding image rows alone."""
    embeds = sorted(batch.embeds, key=lambda e: e[0])
    mixed = {i for i, s in enumerate(spans)
             if any(s.start <= f < s.start + s.length for f, _, _ in embeds)}
    plain = [i for i in order if i not in mixed]
    if plain:
        runner.decode_spans(plain, spans, seqs, tok, pos, result, row_of, batch)
    for i in order:
        if i not in mixed:
            continue
        s = spans[i]
        segs = _segments(s, embeds)
        for k, (flat, n, rows, causal) in enumerate(segs):
            need = s.need_logits and k == len(segs) - 1
            if rows is None:
                sub = SeqSpan(s.slot, flat, n, int(pos[flat]), [], need)
                runner.decode_spans([0], [sub], [seqs[i]], tok, pos, result, {0: row_of[i]} if need else {}, batch)
            else:
                logits = _decode_rows(runner, rows, pos[flat:flat + n], seqs[i], need, causal)
                if need:
                    result[row_of[i]] = logits


def _decode_rows(runner, rows: np.ndarray, positions: np.ndarray, seq: int, need_logits: bool,
                 causal: bool) -> np.ndarray | None:
    """One llama_decode of embedding rows for one sequence; the last row's logits when asked."""
    n = len(rows)
    emb = np.ascontiguousarray(rows, dtype=np.float32)
    p = np.ascontiguousarray(positions, dtype=np.int32)
    nseq = np.ones(n, dtype=np.int32)
    sq = np.full(n, seq, dtype=np.int32)
    ptrs = (sq.ctypes.data + 4 * np.arange(n, dtype=np.uint64)).astype(np.uintp)
    out = np.zeros(n, dtype=np.int8)
    out[-1] = 1 if need_logits else 0
    i32 = ctypes.POINTER(ctypes.c_int32)
    b = L.llama_batch()
    b.n_tokens = n
    b.token = None
    b.embd = emb.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    b.pos = p.ctypes.data_as(i32)
    b.n_seq_id = nseq.ctypes.data_as(i32)
    b.seq_id = ptrs.ctypes.data_as(ctypes.POINTER(i32))
    b.logits = out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
    if not causal:  # the image's rows attend each other both ways (the scheduler placed the span whole)
        L.llama_set_causal_attn(runner.llama_context, False)
    try:
        rc = L.llama_decode(runner.llama_context, b)
    finally:
        if not causal:
            L.llama_set_causal_attn(runner.llama_context, True)
    if rc != 0:
        runner.raise_decode_error(rc, Batch([0] * n, list(map(int, p)), [], 0))
    if not need_logits:
        return None
    ptr = L.llama_get_logits_ith(runner.llama_context, -1)
    return np.ctypeslib.as_array(ptr, shape=(runner.vocab_size,)).copy()
