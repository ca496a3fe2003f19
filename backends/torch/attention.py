"""Attention over the paged KV cache for a flattened mixed batch.

The per-step metadata (where each new token's K/V goes, which cache slots each span reads) is built once
per step from the Batch and shared by every layer. Decodes (and any 1-token span) are padded and run as one
batched SDPA call; prompt chunks run one SDPA each over their gathered prefix + chunk, causal inside the chunk.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..base import Batch
from ..common.paging import cache_slots


@dataclass
class ChunkAttn:
    """One prompt chunk: query rows [start, start+length), keys = cache slots `kv_index`."""

    start: int
    length: int
    kv_index: torch.Tensor | None  # [context_len] flat cache slots; None = attend to the new tokens only
    mask: torch.Tensor | None  # [length, context_len] bool (True = attend); None = plain causal


@dataclass
class DecodeAttn:
    """All 1-token spans batched: query rows, padded cache slots and the padding mask."""

    rows: torch.Tensor  # [B] flattened token rows
    kv_index: torch.Tensor  # [B, S] flat cache slots, padded with 0
    mask: torch.Tensor  # [B, 1, 1, S] bool


@dataclass
class StepAttention:
    """Attention metadata for one forward pass, shared by all layers."""

    slot_mapping: torch.Tensor | None  # [T] flat cache slot of each new token; None = no KV cache (embed)
    chunks: list[ChunkAttn] = field(default_factory=list)
    decode: DecodeAttn | None = None


def build_step_attention(batch: Batch, device: torch.device) -> StepAttention:
    """Slot mapping for the new tokens, gather indices and masks for chunks and the decode group."""
    bs = batch.block_size
    slot_mapping = np.empty(batch.num_tokens, dtype=np.int64)
    chunks: list[ChunkAttn] = []
    dec_rows: list[int] = []
    dec_index: list[np.ndarray] = []
    for s in batch.spans:
        table = np.asarray(s.block_table, dtype=np.int64)
        new_pos = np.arange(s.start_pos, s.start_pos + s.length, dtype=np.int64)
        slot_mapping[s.start : s.start + s.length] = cache_slots(table, new_pos, bs)
        kv_index = cache_slots(table, np.arange(s.context_len, dtype=np.int64), bs)
        if s.length == 1:
            dec_rows.append(s.start)
            dec_index.append(kv_index)
            continue
        mask = None
        if s.start_pos > 0:  # query i sits at position start_pos + i and sees keys 0..start_pos + i
            q_pos = np.arange(s.length)[:, None] + s.start_pos
            mask = torch.from_numpy(np.arange(s.context_len)[None, :] <= q_pos).to(device)
        chunks.append(ChunkAttn(s.start, s.length, torch.from_numpy(kv_index).to(device), mask))
    decode = None
    if dec_rows:
        width = max(len(ix) for ix in dec_index)
        index = np.zeros((len(dec_rows), width), dtype=np.int64)
        mask = np.zeros((len(dec_rows), 1, 1, width), dtype=bool)
        for i, ix in enumerate(dec_index):
            index[i, : len(ix)] = ix
            mask[i, ..., : len(ix)] = True
        decode = DecodeAttn(torch.tensor(dec_rows, device=device), torch.from_numpy(index).to(device),
                            torch.from_numpy(mask).to(device))
    return StepAttention(torch.from_numpy(slot_mapping).to(device), chunks, decode)


def dense_causal(num_tokens: int) -> StepAttention:
    """Metadata for a cache-free causal pass over one sequence (embeddings)."""
    return StepAttention(None, [ChunkAttn(0, num_tokens, None, None)], None)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
          scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None,
                    meta: StepAttention, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] for the new tokens -> attention output [T, H, D]; writes k/v to the cache."""
    if cache is not None and meta.slot_mapping is not None:
        cache_k, cache_v = cache
        cache_k.index_copy_(0, meta.slot_mapping, k)
        cache_v.index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    for c in meta.chunks:
        qs = q[c.start : c.start + c.length].transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
        if c.kv_index is None or cache is None:
            ks, vs = k[c.start : c.start + c.length], v[c.start : c.start + c.length]
        else:
            ks, vs = cache[0][c.kv_index], cache[1][c.kv_index]  # [S, Hkv, D]
        o = _sdpa(qs, ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0), c.mask, c.mask is None, scale)
        out[c.start : c.start + c.length] = o[0].transpose(0, 1)
    d = meta.decode
    if d is not None:
        assert cache is not None, "decode spans need the KV cache"
        qd = q[d.rows].unsqueeze(2)  # [B, H, 1, D]
        kd = cache[0][d.kv_index].transpose(1, 2)  # [B, Hkv, S, D]
        vd = cache[1][d.kv_index].transpose(1, 2)
        out[d.rows] = _sdpa(qd, kd, vd, d.mask, False, scale).squeeze(2)
    return out
