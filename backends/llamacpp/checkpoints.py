"""Checkpoints by engine block: the bytes a prefix hit resumes from where llama.cpp cannot cut a sequence back (a
hybrid model's recurrent state, recurrent.py; a window model's window, window.py), in host memory, least recently
used first out within a byte budget."""
from __future__ import annotations

import collections


class Checkpoints:
    """block -> bytes saved after the block's last token; LRU first."""

    def __init__(self) -> None:
        self._data: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.bytes = 0

    def __contains__(self, block: int) -> bool:
        return block in self._data

    def put(self, block: int, data: bytes, budget: int) -> int:
        """Keep `data` after `block` (replacing what was there); older ones go while over `budget`, never the newest.
        Returns how many went."""
        self.forget(block)
        self._data[block] = data
        self.bytes += len(data)
        gone = 0
        while self.bytes > budget and len(self._data) > 1:
            self.forget(next(iter(self._data)))
            gone += 1
        return gone

    def get(self, block: int | None) -> bytes | None:
        data = self._data.get(block) if block is not None else None
        if data is not None:
            self._data.move_to_end(block)
        return data

    def last_in(self, blocks: list[int]) -> int:
        """The longest leading run of `blocks` that ends where a checkpoint was saved (0: none)."""
        for k in range(len(blocks), 0, -1):
            if blocks[k - 1] in self._data:
                return k
        return 0

    def along(self, blocks: list[int]) -> list[tuple[int, bytes]]:
        """(index, bytes) of the checkpoints along a chain of blocks (to save it to disk with them)."""
        return [(i, self._data[b]) for i, b in enumerate(blocks) if b in self._data]

    def forget(self, block: int) -> None:
        data = self._data.pop(block, None)
        if data is not None:
            self.bytes -= len(data)

    def clear(self) -> None:
        self._data.clear()
        self.bytes = 0
