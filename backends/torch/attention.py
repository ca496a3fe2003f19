"""Attention over the paged KV cache for a flattened mixed batch, in torch.

The step's metadata is planned with numpy in backends/common/attn_plan.py (shared with MLX) and moved to the
device once per step. Decodes (and any 1-token span) run as one padded, batched SDPA call; each prompt chunk runs
one SDPA over its gathered prefix + chunk (a first chunk over its own new K/V), causal inside the chunk.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base import Batch
from ..common.attn_plan import StepAttention, dense_causal, plan_step_attention

__all__ = ["StepAttention", "build_step_attention", "dense_causal", "paged_attention"]


def build_step_attention(batch: Batch, device: torch.device) -> StepAttention:
    """The step's attention plan as tensors on `device`. No output order: each group's rows are written in place."""
    return plan_step_attention(batch).convert(lambda a: torch.from_numpy(a).to(device))


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
