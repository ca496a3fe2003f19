"""Framework-neutral helpers for paged KV: validating a Batch (and token ids) against the pool, flat cache slots."""
from __future__ import annotations

import numpy as np

from typing import Any

from ..base import Batch


def cache_slots(table: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Flat cache index of each position, through the block table."""
    return table[positions // block_size] * block_size + positions % block_size


def check_batch(batch: Batch, num_blocks: int) -> None:
    """Raise ValueError naming the first span whose block table or range cannot hold its tokens."""
    bs = batch.block_size
    for s in batch.spans:
        need = -(-(s.start_pos + s.length) // bs)
        if len(s.block_table) < need:
            raise ValueError(f"slot {s.slot}: block_table has {len(s.block_table)} blocks, positions up to "
                             f"{s.start_pos + s.length} need {need} of size {bs}")
        bad = [b for b in s.block_table[:need] if not 0 <= b < num_blocks]
        if bad:
            raise ValueError(f"slot {s.slot}: block ids {bad[:4]} outside [0, {num_blocks})")
        if s.length <= 0 or s.start < 0 or s.start + s.length > batch.num_tokens:
            raise ValueError(f"slot {s.slot}: span [{s.start}, {s.start + s.length}) outside the "
                             f"{batch.num_tokens}-token batch")


def check_ids(token_ids: list[int], vocab_size: int) -> None:
    """Raise ValueError naming the first id outside the vocabulary (on CUDA it would be a device-side assert,
    which poisons the whole context)."""
    if token_ids and not (0 <= min(token_ids) and max(token_ids) < vocab_size):
        bad = next(t for t in token_ids if not 0 <= t < vocab_size)
        raise ValueError(f"token id {bad} outside [0, {vocab_size})")


def check_step(batch: Batch, block_size: int, num_blocks: int, vocab_size: int) -> None:
    """ValueError for a step a paged pool cannot run: another block size, a span its blocks cannot hold, an id
    outside the vocabulary."""
    if batch.block_size != block_size:
        raise ValueError(f"batch.block_size={batch.block_size} but the runner's KV uses {block_size}")
    if batch.num_tokens:
        check_batch(batch, num_blocks)
        check_ids(batch.token_ids, vocab_size)


class PagedPrefixIO:
    """The disk KV cache's hooks for a runner whose KV is the engine's block pool (torch, MLX): a prefix is its
    blocks' bytes, every layer (the pool's `export` / `load`)."""

    backend: str
    block_size: int
    kv: Any  # a PagedKVCache with export(blocks) and load(blocks, data, stored); None once closed
    dtype: Any
    args: Any

    def kv_signature(self) -> dict[str, Any] | None:
        a = self.args
        return {"backend": self.backend, "block_size": self.block_size, "dtype": str(self.dtype),
                "layers": a.num_hidden_layers, "kv_heads": a.num_key_value_heads, "head_dim": a.head_dim}

    def export_prefix(self, blocks: list[int]) -> bytes | None:
        return None if self.kv is None or not blocks else self.kv.export(blocks)

    def import_prefix(self, blocks: list[int], data: bytes, stored_blocks: int) -> bool:
        return self.kv is not None and bool(blocks) and self.kv.load(blocks, data, stored_blocks)
