"""Attention over the paged MLX KV cache for a flattened mixed batch.

Metadata (slot of each new token, cache slots each span reads, masks) is built once per step with numpy
and shared by every layer. All 1-token spans (decodes) run as one padded, batched SDPA; each prompt chunk
runs one SDPA over its cached prefix + the chunk, causal inside the chunk. The per-group outputs are
concatenated and put back in flattened-row order with one gather.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ..base import Batch
from ..common.paging import cache_slots
from .kv import PagedKVCache


@dataclass
class ChunkAttn:
    """One prompt chunk: query rows [start, start+length); keys are cache slots `kv_index` (None: the chunk only)."""

    start: int
    length: int
    kv_index: mx.array | None
    mask: mx.array | None  # [length, context_len] bool (True = attend); None = plain causal


@dataclass
class DecodeAttn:
    """All 1-token spans batched: their query rows, padded cache slots and the padding mask."""

    rows: mx.array  # [B]
    kv_index: mx.array  # [B, S] padded with slot 0
    mask: mx.array  # [B, 1, 1, S] bool


@dataclass
class StepAttention:
    """Attention metadata for one forward pass."""

    slot_mapping: mx.array | None  # [T] cache slot of each new token; None = no KV cache (embed)
    chunks: list[ChunkAttn] = field(default_factory=list)
    decode: DecodeAttn | None = None
    order: mx.array | None = None  # rows of concat(decode, chunks...) in flattened order; None = already in order


def build_step_attention(batch: Batch) -> StepAttention:
    """Slot mapping, gather indices, masks and the output row order for one step."""
    bs = batch.block_size
    slot_mapping = np.empty(batch.num_tokens, dtype=np.int32)
    chunks: list[ChunkAttn] = []
    chunk_rows: list[np.ndarray] = []
    dec_rows: list[int] = []
    dec_index: list[np.ndarray] = []
    for s in batch.spans:
        table = np.asarray(s.block_table, dtype=np.int64)
        new_pos = np.arange(s.start_pos, s.start_pos + s.length, dtype=np.int64)
        slot_mapping[s.start : s.start + s.length] = cache_slots(table, new_pos, bs)
        if s.length == 1:
            dec_rows.append(s.start)
            dec_index.append(cache_slots(table, np.arange(s.context_len, dtype=np.int64), bs))
            continue
        chunk_rows.append(np.arange(s.start, s.start + s.length))
        if s.start_pos == 0:  # a first chunk sees only itself: use its fresh K/V, no gather
            chunks.append(ChunkAttn(s.start, s.length, None, None))
            continue
        q_pos = np.arange(s.length)[:, None] + s.start_pos  # query i sees keys 0..start_pos + i
        mask = mx.array(np.arange(s.context_len)[None, :] <= q_pos)
        kv_index = mx.array(cache_slots(table, np.arange(s.context_len, dtype=np.int64), bs).astype(np.int32))
        chunks.append(ChunkAttn(s.start, s.length, kv_index, mask))
    decode = None
    if dec_rows:
        width = max(len(ix) for ix in dec_index)
        index = np.zeros((len(dec_rows), width), dtype=np.int32)
        mask = np.zeros((len(dec_rows), 1, 1, width), dtype=bool)
        for i, ix in enumerate(dec_index):
            index[i, : len(ix)] = ix
            mask[i, ..., : len(ix)] = True
        decode = DecodeAttn(mx.array(np.asarray(dec_rows, dtype=np.int32)), mx.array(index), mx.array(mask))
    produced = np.concatenate([np.asarray(dec_rows, dtype=np.int64)] + chunk_rows) if (dec_rows or chunk_rows) else None
    order = None
    if produced is not None and not np.array_equal(produced, np.arange(batch.num_tokens)):
        inverse = np.empty_like(produced)
        inverse[produced] = np.arange(len(produced))
        order = mx.array(inverse.astype(np.int32))
    return StepAttention(mx.array(slot_mapping), chunks, decode, order)


def dense_causal(num_tokens: int) -> StepAttention:
    """Metadata for a cache-free causal pass over one sequence (embeddings)."""
    return StepAttention(None, [ChunkAttn(0, num_tokens, None, None)], None, None)


def _heads_first(x: mx.array) -> mx.array:
    """[S, H, D] -> [1, H, S, D]."""
    return x.transpose(1, 0, 2)[None]


def paged_attention(q: mx.array, k: mx.array, v: mx.array, kv: PagedKVCache | None, layer: int,
                    meta: StepAttention, scale: float) -> mx.array:
    """q [T, H, D], k/v [T, Hkv, D] for the new tokens -> attention output [T, H, D]; writes k/v to the cache."""
    if kv is not None and meta.slot_mapping is not None:
        kv.write(layer, meta.slot_mapping, k, v)
    parts: list[mx.array] = []
    d = meta.decode
    if d is not None:
        assert kv is not None, "decode spans need the KV cache"
        qd = q[d.rows][:, :, None, :]  # [B, H, 1, D]
        kd = kv.k[layer][d.kv_index].transpose(0, 2, 1, 3)  # [B, Hkv, S, D]
        vd = kv.v[layer][d.kv_index].transpose(0, 2, 1, 3)
        parts.append(mx.fast.scaled_dot_product_attention(qd, kd, vd, scale=scale, mask=d.mask)[:, :, 0, :])
    for c in meta.chunks:
        sl = slice(c.start, c.start + c.length)
        if c.kv_index is None or kv is None:
            ks, vs = k[sl], v[sl]
        else:
            ks, vs = kv.k[layer][c.kv_index], kv.v[layer][c.kv_index]
        mask = "causal" if c.mask is None else c.mask
        o = mx.fast.scaled_dot_product_attention(_heads_first(q[sl]), _heads_first(ks), _heads_first(vs),
                                                 scale=scale, mask=mask)
        parts.append(o[0].transpose(1, 0, 2))
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
    return out if meta.order is None else out[meta.order]
