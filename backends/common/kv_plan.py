"""How big a runner's KV pool is and how many sequences share it (`plan_kv`)."""
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


AUTO_MIN_SEQS = 8  # by default a model serves as many sequences as its KV pool holds, but at least 8 ...
AUTO_MAX_SEQS = 256  # ... and at most 256 (llama.cpp's sequence limit, vLLM's default max_num_seqs)


def plan_kv(*, requested_blocks: int | None, max_num_seqs: int | None, context_length: int, block_size: int,
            block_bytes: int, budget_bytes: int, dedicated_pool: bool = False) -> tuple[int, int]:
    """(KV blocks, sequence slots) for a runner.

    Slots: `max_num_seqs` when set; else (auto) as many full context windows as the pool holds, clamped to
    [AUTO_MIN_SEQS, AUTO_MAX_SEQS]. The pool: `requested_blocks` when set; else, in auto mode on a
    `dedicated_pool` (GPU memory, where the KV may take what the weights left), the whole `budget_bytes` up to
    AUTO_MAX_SEQS windows; else every slot at full context (8 in auto mode), capped by `budget_bytes`. Host
    RAM and unified memory are never dedicated: a desktop keeps its memory for its other programs.
    """
    if requested_blocks is not None and requested_blocks <= 0:
        raise ValueError(f"num_kv_blocks={requested_blocks} must be a positive int")
    if max_num_seqs is not None and max_num_seqs <= 0:
        raise ValueError(f"max_num_seqs={max_num_seqs} must be a positive int")
    window = math.ceil(context_length / block_size)
    budget_blocks = max(1, budget_bytes // block_bytes)
    if requested_blocks is not None:
        blocks = requested_blocks
    else:
        if max_num_seqs is None and dedicated_pool:
            blocks = min(budget_blocks, AUTO_MAX_SEQS * window)
            wanted = AUTO_MIN_SEQS * window
        else:
            wanted = (max_num_seqs or AUTO_MIN_SEQS) * window
            blocks = min(wanted, budget_blocks)
        if blocks < wanted:
            log.warning("KV cache capped by memory: %d blocks (%d tokens) instead of %d", blocks, blocks * block_size,
                        wanted)
    seqs = max_num_seqs or max(AUTO_MIN_SEQS, min(AUTO_MAX_SEQS, blocks // window))
    return blocks, seqs
