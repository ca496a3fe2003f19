"""Framework-neutral helpers for paged KV: validating a Batch against the pool, and flat cache slots."""
from __future__ import annotations

import numpy as np

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
