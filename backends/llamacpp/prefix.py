"""Prefix sharing in llama.cpp's unified KV cache, mirroring the engine's cached blocks.

The engine decides hits (daemon/engine/blocks.py); here we keep the cells of those blocks alive and hand them to
a new sequence. In a unified cache a cell can belong to several sequences, so `llama_memory_seq_cp` shares
cells without copying data. A finished slot's cells move to a spare "holder" sequence id; a hit copies the
prefix's positions from whichever sequence holds each block; a block the engine forgets (freed uncached or
evicted) has its cells removed with `llama_memory_seq_rm`. Holder ids are finite: when none is left the
least recently used holder is dropped and its blocks reported back, so the engine stops counting on them.
`BlockCells` is the bookkeeping both layouts share (streams.py is the per-sequence-stream one).
"""
from __future__ import annotations

import collections
from typing import Callable

# (seq_id, p0, p1) -> remove positions [p0, p1) of seq_id (-1 = open end); (src, dst, p0, p1) -> share
RemoveFn = Callable[[int, int, int], None]
CopyFn = Callable[[int, int, int, int], None]


class BlockCells:
    """Which llama.cpp sequences' cells hold which engine blocks; what both KV layouts share."""

    def __init__(self, block_size: int, remove: RemoveFn) -> None:
        self.block_size, self._remove = block_size, remove
        self._tables: dict[int, list[int | None]] = {}  # seq id -> its blocks by position (None: dropped)
        self._where: dict[int, set[int]] = {}  # block -> seq ids whose cells hold it
        self._index: dict[int, int] = {}  # block -> its position in every table that holds it
        self.uncached: list[int] = []  # blocks whose last cells went, for the engine to uncache

    def _add(self, seq: int, i: int, block: int) -> None:
        self._tables[seq].append(block)
        self._where.setdefault(block, set()).add(seq)
        self._index[block] = i

    def _live(self, seq: int) -> bool:
        raise NotImplementedError

    def _emptied(self, seq: int) -> None:
        """Every block a kept (not live) sequence held was dropped."""
        raise NotImplementedError

    def drop_blocks(self, blocks: list[int]) -> None:
        """The engine will never read these blocks again: remove their cells from every sequence keeping them."""
        bs = self.block_size
        for b in blocks:
            seqs = self._where.pop(b, None)
            if not seqs:
                continue
            i = self._index.pop(b)
            for s in seqs:
                if self._live(s):
                    raise RuntimeError(f"block {b} dropped while live sequence {s} holds it")
                self._remove(s, i * bs, (i + 1) * bs)
                table = self._tables[s]
                table[i] = None
                if all(x is None for x in table):
                    self._emptied(s)

    def take_uncached(self) -> list[int]:
        out, self.uncached = self.uncached, []
        return out

    def trim(self, seq: int | None, num_tokens: int) -> None:
        """A live sequence's cells at positions >= num_tokens go (rejected draft tokens), and with them the blocks
        wholly past them (the engine frees those: they were written this step, nobody else holds them)."""
        if seq is None:
            return
        keep = -(-num_tokens // self.block_size)
        table = self._tables.get(seq, [])
        for b in table[keep:]:
            holders = self._where.get(b) if b is not None else None
            if holders is not None:
                holders.discard(seq)
                if not holders:
                    del self._where[b], self._index[b]
        del table[keep:]
        self._remove(seq, num_tokens, -1)

    def servable(self, blocks: list[int]) -> int:
        """How many leading blocks of a cached chain a fresh sequence can be given (the rest is recomputed)."""
        raise NotImplementedError


class PrefixCells(BlockCells):
    """Unified layout: which llama.cpp sequences (live slots and holders) hold the cells of which engine blocks."""

    def __init__(self, num_slots: int, num_holders: int, block_size: int, remove: RemoveFn, copy: CopyFn) -> None:
        super().__init__(block_size, remove)
        self.num_slots, self._copy = num_slots, copy
        self._spare = list(range(num_slots + num_holders - 1, num_slots - 1, -1))
        self._holders: collections.OrderedDict[int, None] = collections.OrderedDict()  # least recent first
        # slot -> first position it writes in the step being set up (cleared once decoded): a block at or past it has
        # no cells there yet (a recurrent model's sequence resuming short of its hit computes cached blocks again, and
        # another may share them)
        self._writing: dict[int, int] = {}

    def new_step(self) -> None:
        self._writing.clear()

    @property
    def num_holders(self) -> int:
        return len(self._holders)

    def begin(self, slot: int, start_pos: int, length: int, table: list[int]) -> None:
        """Before a span is decoded: on a fresh slot share its cached prefix; record the blocks it writes."""
        known = self._tables.get(slot)
        if known is None or start_pos == 0:
            if known is not None:
                self.free(slot)
            if start_pos == 0 or table:
                self._remove(slot, -1, -1)  # whatever an earlier user of the slot left
            known = self._tables[slot] = []
            if start_pos and table:
                self._share(slot, table[: start_pos // self.block_size])
        # a caller without block tables (a test driving the runner directly) gets no prefix cache
        bs = self.block_size
        self._writing[slot] = start_pos
        for i in range(len(known), min(-(-(start_pos + length) // bs), len(table))):
            self._add(slot, i, table[i])

    def runs(self, blocks: list[int]) -> list[tuple[int, int, int]]:
        """(sequence, first block, end block) runs a fresh sequence is given `blocks` from, in order."""
        src, run_start = None, 0
        runs: list[tuple[int, int, int]] = []
        bs = self.block_size
        for i, b in enumerate(blocks):
            holders = {s for s in self._where.get(b, ()) if self._writing.get(s, (i + 1) * bs) >= (i + 1) * bs}
            if not holders or self._index.get(b) != i:
                raise RuntimeError(f"prefix block {b} (position {i * self.block_size}) is not held in the llama.cpp "
                                   "cache; the engine and the runner disagree")
            if src not in holders:
                if src is not None:
                    runs.append((src, run_start, i))
                src, run_start = min(holders), i
        if src is not None:
            runs.append((src, run_start, len(blocks)))
        return runs

    def _share(self, slot: int, blocks: list[int]) -> None:
        bs = self.block_size
        for s, i0, i1 in self.runs(blocks):
            self._copy(s, slot, i0 * bs, i1 * bs)
            if s in self._holders:
                self._holders.move_to_end(s)
        for i, b in enumerate(blocks):
            self._add(slot, i, b)

    def free(self, slot: int) -> None:
        """The slot's sequence ended: keep its cells under a holder id unless other sequences hold them all."""
        table = self._tables.pop(slot, None) or []
        alone = [b for b in table if b is not None and self._where.get(b) == {slot}]
        holder = None
        if alone and not self._spare and not self._holders:  # no holder ids at all: nothing can stay cached
            for b in alone:
                del self._where[b], self._index[b]
            self.uncached.extend(alone)
            alone = []
        if alone:
            if not self._spare:
                self._drop_holder(next(iter(self._holders)))
            holder = self._spare.pop()
            self._copy(slot, holder, -1, -1)
            self._tables[holder] = list(table)
            self._holders[holder] = None
        for b in table:
            if b is None or b not in self._where:
                continue
            seqs = self._where[b]
            seqs.discard(slot)
            if holder is not None:
                seqs.add(holder)
        self._remove(slot, -1, -1)

    def servable(self, blocks: list[int]) -> int:
        """Cells are shared position by position, from whichever sequences hold each block."""
        for i, b in enumerate(blocks):
            if not self._where.get(b) or self._index.get(b) != i:
                return i
        return len(blocks)

    def is_live(self, slot: int) -> bool:
        return slot in self._tables

    def holder(self, blocks: list[int]) -> int | None:
        """A sequence whose cells hold exactly these blocks from position 0, to export them."""
        n = len(blocks)
        return min((s for s in self._where.get(blocks[-1], ()) if self._tables[s][:n] == blocks), default=None) \
            if blocks else None

    def restore_target(self) -> int | None:
        """A holder id for a prefix read back from disk (the least recently used holder gives way)."""
        if not self._spare:
            if not self._holders:
                return None
            self._drop_holder(next(iter(self._holders)))
        return self._spare.pop()

    def adopt(self, holder: int, blocks: list[int]) -> None:
        """`holder`'s cells now hold `blocks` from position 0."""
        self._tables[holder] = []
        for j, b in enumerate(blocks):
            self._add(holder, j, b)
        self._holders[holder] = None

    def release(self, holder: int) -> None:
        """A restore into `holder` failed: it holds nothing."""
        self._release_holder(holder)

    def _live(self, seq: int) -> bool:
        return seq < self.num_slots

    def _emptied(self, seq: int) -> None:
        self._release_holder(seq)

    def _drop_holder(self, h: int) -> None:
        for b in self._tables.get(h, []):
            if b is None:
                continue
            seqs = self._where[b]
            seqs.discard(h)
            if not seqs:
                del self._where[b]
                del self._index[b]
                self.uncached.append(b)
        self._remove(h, -1, -1)
        self._release_holder(h)

    def _release_holder(self, h: int) -> None:
        self._tables.pop(h, None)
        self._holders.pop(h, None)
        self._spare.append(h)

    def reset(self) -> None:
        """Forget every holder and slot (a new engine starts with an empty cache)."""
        for seq in list(self._tables):
            self._remove(seq, -1, -1)
        for h in list(self._holders):
            self._release_holder(h)
        self._tables.clear()
        self._where.clear()
        self._index.clear()
        self.uncached.clear()
