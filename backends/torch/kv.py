"""Paged KV memory: per layer K and V tensors [num_blocks, block_size, n_kv_heads, head_dim]."""
from __future__ import annotations

import logging
import math
import os

import torch

log = logging.getLogger(__name__)

CPU_MEMORY_FRACTION = 0.5  # of MemAvailable: the KV must not push a desktop into swap


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


def _available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30  # unknown platform: assume a modest desktop


def plan_num_blocks(*, requested: int | None, max_num_seqs: int, context_length: int, block_size: int,
                    block_bytes: int, device: torch.device, memory_fraction: float) -> int:
    """Blocks to allocate: `requested`, else enough for every slot at full context, capped by memory."""
    if requested is not None:
        if requested <= 0:
            raise ValueError(f"num_kv_blocks={requested} must be a positive int")
        return requested
    wanted = max_num_seqs * math.ceil(context_length / block_size)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * memory_fraction)
    else:
        budget = int(_available_host_bytes() * CPU_MEMORY_FRACTION)
    cap = max(1, budget // block_bytes)
    blocks = min(wanted, cap)
    if blocks < wanted:
        log.warning("KV cache capped by memory: %d blocks (%d tokens) instead of %d", blocks, blocks * block_size, wanted)
    return blocks
