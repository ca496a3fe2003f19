"""How many KV blocks a runner allocates: what was asked, else every slot at full context, capped by memory."""
from __future__ import annotations

import logging
import math
import os

log = logging.getLogger(__name__)

CPU_MEMORY_FRACTION = 0.5  # of MemAvailable: the KV must not push a desktop into swap


def available_host_bytes() -> int:
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


def host_kv_budget() -> int:
    """Bytes the KV may take in host memory."""
    return int(available_host_bytes() * CPU_MEMORY_FRACTION)


def plan_num_blocks(*, requested: int | None, max_num_seqs: int, context_length: int, block_size: int,
                    block_bytes: int, budget_bytes: int) -> int:
    """Blocks to allocate: `requested`, else enough for every slot at full context, capped by `budget_bytes`."""
    if requested is not None:
        if requested <= 0:
            raise ValueError(f"num_kv_blocks={requested} must be a positive int")
        return requested
    wanted = max_num_seqs * math.ceil(context_length / block_size)
    blocks = min(wanted, max(1, budget_bytes // block_bytes))
    if blocks < wanted:
        log.warning("KV cache capped by memory: %d blocks (%d tokens) instead of %d", blocks, blocks * block_size, wanted)
    return blocks
