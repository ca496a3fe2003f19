"""Attention over the paged MLX KV cache for a flattened mixed batch.

The step's metadata is planned with numpy in backends/common/attn_plan.py (shared with torch) and turned into
MLX arrays once per step. All 1-token spans (decodes) run as one padded, batched SDPA; each prompt chunk runs one
SDPA over its cached prefix + the chunk (a first chunk over its own new K/V), causal inside the chunk. The
per-group outputs are concatenated and put back in flattened-row order with one gather (`StepAttention.order`).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..base import Batch
from ..common.attn_plan import StepAttention, dense_causal, plan_step_attention
from .paged_kv import PagedKVCache

__all__ = ["StepAttention", "build_step_attention", "dense_causal", "paged_attention"]


def _mx(a: np.ndarray) -> mx.array:
    return mx.array(a.astype(np.int32) if a.dtype == np.int64 else a)  # int32 indices, as MLX gathers like them


def build_step_attention(batch: Batch) -> StepAttention:
    """Slot mapping, gather indices, masks and the output row order for one step, as MLX arrays."""
    return plan_step_attention(batch, with_order=True).convert(_mx)


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
