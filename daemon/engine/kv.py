"""KV accounting: fixed-size blocks and sequence slots. The backend owns the memory; this owns who holds what."""
from __future__ import annotations

from .sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    """A free list of KV blocks; a sequence's block table grows as its computed tokens grow."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._owner: dict[int, int] = {}  # block -> seq_id, to catch double frees

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, blocks_for(seq.num_computed + num_new_tokens, self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= len(self._free)

    def max_new_tokens(self, seq: Sequence) -> int:
        """How many new tokens `seq` could take with the blocks it holds plus every free block."""
        return (len(seq.block_table) + len(self._free)) * self.block_size - seq.num_computed

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        need = self.blocks_needed(seq, num_new_tokens)
        if need > len(self._free):
            raise RuntimeError(f"out of KV blocks: need {need}, {len(self._free)} free")
        for _ in range(need):
            b = self._free.pop()
            self._owner[b] = seq.seq_id
            seq.block_table.append(b)

    def free(self, seq: Sequence) -> None:
        for b in seq.block_table:
            if self._owner.pop(b, None) != seq.seq_id:
                raise RuntimeError(f"block {b} freed by seq {seq.seq_id} which does not own it")
            self._free.append(b)
        seq.block_table = []


class SlotPool:
    """Slot ids 0..n-1 (llama.cpp seq_id, per-slot caches); at most `n` sequences run at once."""

    def __init__(self, n: int) -> None:
        self.size = n
        self._free = list(range(n - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        return self._free.pop()

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.size:
            raise RuntimeError(f"slot {slot} released twice or out of range")
        self._free.append(slot)
