"""Checkpoints by engine block: the bytes a prefix hit resumes from where llama.cpp cannot cut a sequence back (a
hybrid model's recurrent state, recurrent.py; a window model's window, window.py), in host memory, least recently
used first out within a byte budget.

A checkpoint read back from disk is a view into the payload it came in where checkpoints are most of that payload
(copying a restored window model's windows out of it cost more than the rest of the restore), else a copy (a view
would keep the rest alive: a long prefix's attention state, which llama.cpp has taken by then). So the budget counts
the memory a checkpoint keeps alive: a whole payload, once, while any view into it is kept."""
from __future__ import annotations

import collections
import ctypes

import numpy as np

State = bytes | bytearray | memoryview  # a view: into a payload read back from disk


def state_pointer(data: State) -> "ctypes._Pointer[ctypes.c_uint8]":
    """A pointer to the bytes of `data` for llama.cpp to read, without a copy (valid while `data` lives)."""
    return np.frombuffer(data, dtype=np.uint8).ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def kept(points: list[tuple[int, State]], payload: State) -> list[tuple[int, State]]:
    """Checkpoints read back in `payload`, to keep: as they are (views into it) when they make up at least half of
    it, else copies."""
    if 2 * sum(len(d) for _, d in points) >= len(payload):
        return points
    return [(i, bytes(d)) for i, d in points]


def _owner(data: State) -> tuple[int, int]:
    """(id, bytes) of the memory `data` keeps alive."""
    if isinstance(data, memoryview) and data.obj is not None:
        return id(data.obj), memoryview(data.obj).nbytes
    return id(data), len(data)


class Checkpoints:
    """block -> bytes saved after the block's last token; LRU first."""

    def __init__(self) -> None:
        self._data: collections.OrderedDict[int, State] = collections.OrderedDict()
        self._owners: dict[int, list[int]] = {}  # owner id -> [checkpoints viewing it, its bytes]
        self.bytes = 0

    def __contains__(self, block: int) -> bool:
        return block in self._data

    def put(self, block: int, data: State, budget: int) -> int:
        """Keep `data` after `block` (replacing what was there); older ones go while over `budget`, never the newest.
        Returns how many went."""
        self.forget(block)
        self._data[block] = data
        key, size = _owner(data)
        held = self._owners.setdefault(key, [0, size])
        held[0] += 1
        if held[0] == 1:
            self.bytes += size
        gone = 0
        while self.bytes > budget and len(self._data) > 1:
            self.forget(next(iter(self._data)))
            gone += 1
        return gone

    def get(self, block: int | None) -> State | None:
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

    def along(self, blocks: list[int]) -> list[tuple[int, State]]:
        """(index, bytes) of the checkpoints along a chain of blocks (to save it to disk with them)."""
        return [(i, self._data[b]) for i, b in enumerate(blocks) if b in self._data]

    def forget(self, block: int) -> None:
        data = self._data.pop(block, None)
        if data is None:
            return
        key, _ = _owner(data)
        held = self._owners[key]
        held[0] -= 1
        if not held[0]:
            del self._owners[key]
            self.bytes -= held[1]

    def clear(self) -> None:
        self._data.clear()
        self._owners.clear()
        self.bytes = 0
