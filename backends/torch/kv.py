"""Paged KV memory: per layer K and V tensors [num_blocks, block_size, n_kv_heads, head_dim]."""
from __future__ import annotations

import logging

import torch

from ..common.memory import host_kv_budget

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

    def close(self) -> None:
        self.k.clear()
        self.v.clear()


def bytes_per_block(num_layers: int, block_size: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * n_kv_heads * head_dim * elem


def kv_budget_bytes(device: torch.device, fraction: float) -> int:
    """Bytes the KV may take: a fraction of free CUDA memory, else of available host RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    return host_kv_budget()
