"""Attention metadata for one step over paged KV, planned with numpy once and shared by the torch and MLX backends.

Per step (and shared by every layer): the cache slot each new token's K/V goes to, the cache slots each span
reads, and masks. Every 1-token span (the decodes) joins one padded, batched group; each prompt chunk is a
group of its own, causal inside the chunk. A backend turns the plan into its own arrays with `convert` and
runs one SDPA per group (backends/{torch,mlx}/attention.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..base import Batch
from .paging import cache_slots


@dataclass
class ChunkAttn:
    """One prompt chunk: query rows [start, start+length), keys = cache slots `kv_index`."""

    start: int
    length: int
    # [context_len] flat cache slots; None = attend to the chunk's own new K/V only (a first chunk, an embed pass:
    # its keys are exactly what it writes, so nothing is gathered from the cache)
    kv_index: Any
    mask: Any  # [length, context_len] bool (True = attend); None = plain causal


@dataclass
class DecodeAttn:
    """All 1-token spans batched: query rows, padded cache slots and the padding mask."""

    rows: Any  # [B] flattened token rows
    kv_index: Any  # [B, S] flat cache slots, padded with 0
    mask: Any  # [B, 1, 1, S] bool


@dataclass
class StepAttention:
    """Attention metadata for one forward pass, shared by all layers; its arrays are numpy until `convert`ed."""

    slot_mapping: Any  # [T] flat cache slot of each new token; None = no KV cache (embed)
    chunks: list[ChunkAttn] = field(default_factory=list)
    decode: DecodeAttn | None = None
    # the rows of concat(decode group, chunk groups...) in flattened order; None = already in order. Only asked for
    # by a backend that concatenates the groups' outputs (MLX: no cheap in-place row writes); torch writes each
    # group's rows in place.
    order: Any = None

    def convert(self, to: Callable[[np.ndarray], Any]) -> "StepAttention":
        """The same plan with every array passed through `to` (numpy -> a framework's array on its device)."""
        def opt(a: np.ndarray | None) -> Any:
            return None if a is None else to(a)

        d = self.decode
        return StepAttention(opt(self.slot_mapping),
                             [ChunkAttn(c.start, c.length, opt(c.kv_index), opt(c.mask)) for c in self.chunks],
                             None if d is None else DecodeAttn(to(d.rows), to(d.kv_index), to(d.mask)),
                             opt(self.order))


def plan_step_attention(batch: Batch, with_order: bool = False) -> StepAttention:
    """Slot mapping for the new tokens, gather indices and masks for chunks and the decode group (int64 indices);
    `with_order`: also the output row order (StepAttention.order)."""
    bs = batch.block_size
    slot_mapping = np.empty(batch.num_tokens, dtype=np.int64)
    chunks: list[ChunkAttn] = []
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
        if s.start_pos == 0:  # a first chunk sees only itself: its fresh K/V, no gather
            chunks.append(ChunkAttn(s.start, s.length, None, None))
            continue
        q_pos = np.arange(s.length)[:, None] + s.start_pos  # query i sits at start_pos + i, sees keys 0..start_pos + i
        mask = np.arange(s.context_len)[None, :] <= q_pos
        chunks.append(ChunkAttn(s.start, s.length, cache_slots(table, np.arange(s.context_len, dtype=np.int64), bs),
                                mask))
    decode = None
    if dec_rows:
        width = max(len(ix) for ix in dec_index)
        index = np.zeros((len(dec_rows), width), dtype=np.int64)
        mask = np.zeros((len(dec_rows), 1, 1, width), dtype=bool)
        for i, ix in enumerate(dec_index):
            index[i, : len(ix)] = ix
            mask[i, ..., : len(ix)] = True
        decode = DecodeAttn(np.asarray(dec_rows, dtype=np.int64), index, mask)
    plan = StepAttention(slot_mapping, chunks, decode)
    if with_order:
        plan.order = _output_order(dec_rows, chunks, batch.num_tokens)
    return plan


def _output_order(dec_rows: list[int], chunks: list[ChunkAttn], num_tokens: int) -> np.ndarray | None:
    """Where each flattened row sits in concat(decode group, chunks...); None when that is the identity."""
    produced = np.concatenate([np.asarray(dec_rows, dtype=np.int64)]
                              + [np.arange(c.start, c.start + c.length, dtype=np.int64) for c in chunks])
    if np.array_equal(produced, np.arange(num_tokens)):
        return None
    inverse = np.empty_like(produced)
    inverse[produced] = np.arange(len(produced))
    return inverse


def dense_causal(num_tokens: int) -> StepAttention:
    """Metadata for a cache-free causal pass over one sequence (embeddings); holds no arrays."""
    return StepAttention(None, [ChunkAttn(0, num_tokens, None, None)], None)
