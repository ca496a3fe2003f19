"""Paged KV memory for MLX: per layer K and V arrays of [num_blocks * block_size, n_kv_heads, head_dim] token slots.

Why paged rather than per-slot: the engine already hands every span a block table, so paging uses the
engine's accounting as-is (the same blocks the scheduler counts are the memory we hold), preemption and
a future shared prefix need no copy, and capacity is `num_blocks`, not `max_num_seqs x context` reserved
up front. The cost is one gather of each span's context per layer, the same as the torch backend pays.
The logical layout is [num_blocks, block_size, n_kv, head_dim]; we keep it flattened so a token's slot is
`block * block_size + offset` and writes/reads are a single scatter/gather.
"""
from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np

from ..common.kv_plan import host_kv_budget

log = logging.getLogger(__name__)



class PagedKVCache:
    """K/V blocks owned by the runner; the engine decides which blocks a sequence holds."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype: mx.Dtype) -> None:
        shape = (num_blocks * block_size, n_kv_heads, head_dim)
        self.k = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.v = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        mx.eval(self.k, self.v)  # allocate now, so an out-of-memory shows at load time
        self.num_blocks, self.block_size = num_blocks, block_size

    def write(self, layer: int, slot_mapping: mx.array, k: mx.array, v: mx.array) -> None:
        """Scatter the new tokens' K/V [T, n_kv, head_dim] into their slots (in place once evaluated)."""
        self.k[layer][slot_mapping] = k
        self.v[layer][slot_mapping] = v

    def arrays(self) -> list[mx.array]:
        """Every cache array, to evaluate together with the step's logits."""
        return self.k + self.v

    def _slots(self, blocks: list[int]) -> mx.array:
        bs = self.block_size
        return mx.array((np.asarray(blocks, dtype=np.int64)[:, None] * bs + np.arange(bs)).ravel())

    def export(self, blocks: list[int]) -> bytes:
        """K and V of `blocks`, every layer, as raw bytes laid out [2 x layers, blocks, block bytes]."""
        slots = self._slots(blocks)
        parts = mx.stack([t[slots] for kv in zip(self.k, self.v) for t in kv]).view(mx.uint8)
        return np.array(parts).tobytes()

    def load(self, blocks: list[int], data: bytes, stored: int) -> bool:
        """The first len(blocks) blocks of an `export` of `stored` blocks into `blocks`; False if it does not fit."""
        tail = self.k[0].shape[1:]
        per_block = self.block_size * tail[0] * tail[1] * self.k[0].dtype.size
        if len(data) != 2 * len(self.k) * stored * per_block or len(blocks) > stored:
            return False
        raw = np.frombuffer(data, dtype=np.uint8).reshape(2 * len(self.k), stored, per_block)[:, : len(blocks)]
        t = mx.array(np.ascontiguousarray(raw)).view(self.k[0].dtype).reshape(-1, len(blocks) * self.block_size, *tail)
        slots = self._slots(blocks)
        for layer in range(len(self.k)):
            self.k[layer][slots] = t[2 * layer]
            self.v[layer][slots] = t[2 * layer + 1]
        mx.eval(self.k, self.v)
        return True

    def close(self) -> None:
        self.k.clear()
        self.v.clear()


def kv_budget_bytes(device: mx.Device, fraction: float) -> int:
    """Bytes the KV may take: a fraction of Metal's recommended working set left after the weights, else host RAM."""
    if device.type == mx.gpu and mx.metal.is_available():
        info = mx.device_info()
        total = int(info.get("max_recommended_working_set_size", info.get("memory_size", 8 << 30)))
        return max(0, int((total - mx.get_active_memory()) * fraction))
    return host_kv_budget()
