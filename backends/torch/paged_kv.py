"""Paged KV memory: per layer K and V tensors [num_blocks, block_size, n_kv_heads, head_dim]."""
from __future__ import annotations

import logging

import numpy as np
import torch

from ..common.kv_plan import host_kv_budget

log = logging.getLogger(__name__)



class PagedKVCache:
    """K/V blocks owned by the runner; the engine decides which blocks a sequence holds."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer K and V viewed as [num_blocks * block_size, n_kv_heads, head_dim] (token slots)."""
        k, v = self.k[layer], self.v[layer]
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])

    def export(self, blocks: list[int]) -> bytes:
        """K and V of `blocks`, every layer, as raw bytes laid out [2 x layers, blocks, block bytes]."""
        idx = torch.tensor(blocks, dtype=torch.long, device=self.k[0].device)
        parts = [t.index_select(0, idx) for kv in zip(self.k, self.v) for t in kv]
        return torch.stack(parts).cpu().contiguous().view(torch.uint8).numpy().tobytes()

    def load(self, blocks: list[int], data: bytes, stored: int) -> bool:
        """The first len(blocks) blocks of an `export` of `stored` blocks into `blocks`; False if it does not fit."""
        shape = self.k[0].shape[1:]
        per_block = shape.numel() * self.k[0].element_size()
        if len(data) != 2 * len(self.k) * stored * per_block or len(blocks) > stored:
            return False
        raw = np.frombuffer(data, dtype=np.uint8).reshape(2 * len(self.k), stored, per_block)[:, : len(blocks)]
        dev = self.k[0].device
        t = torch.from_numpy(raw.copy()).view(self.k[0].dtype).reshape(-1, len(blocks), *shape)
        idx = torch.tensor(blocks, dtype=torch.long, device=dev)
        for layer in range(len(self.k)):
            self.k[layer].index_copy_(0, idx, t[2 * layer].to(dev))
            self.v[layer].index_copy_(0, idx, t[2 * layer + 1].to(dev))
        return True

    def close(self) -> None:
        self.k.clear()
        self.v.clear()


def kv_budget_bytes(device: torch.device, fraction: float) -> int:
    """Bytes the KV may take: a fraction of free CUDA memory, else of available host RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    return host_kv_budget()
