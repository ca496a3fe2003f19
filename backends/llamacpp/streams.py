"""Per-sequence KV streams in llama.cpp (`kv_unified=false`), mirroring the engine's cached blocks.

Each llama.cpp sequence id owns a stream: a KV buffer of its own, one context window long, which only its own
queries attend. So a decode pays for the tokens its sequence holds, not for a long document another sequence is
ingesting (in a unified cache every query attends every occupied cell). The engine's slots map onto streams here;
a finished slot's stream keeps its cells ("parked") for the prefix cache until the stream is needed again.

A prefix hit is served from a stream holding its blocks: a parked one is taken over in place (its cells beyond the
prefix removed), a live one is copied (llama.cpp copies whole streams). A block the engine forgets has its cells
removed; a parked stream handed to an unrelated sequence loses its blocks, which are reported back as uncached.
"""
from __future__ import annotations

import collections
from typing import Callable, Iterable

from .prefix import BlockCells, RemoveFn

StreamCopyFn = Callable[[int, int], None]  # (src, dst): dst's cells become a copy of src's


class StreamCells(BlockCells):
    """Which engine slot runs in which stream, and which blocks each stream's cells hold (seq id = stream)."""

    def __init__(self, num_streams: int, block_size: int, remove: RemoveFn, copy: StreamCopyFn) -> None:
        super().__init__(block_size, remove)
        self.num_streams, self._copy = num_streams, copy
        # a window model's test of whether a stream holds the attention window before a position (window.py): a hit
        # is served from such a stream first
        self.covers: Callable[[int, int], bool] | None = None
        self.copy_now: Callable[[int, int], None] | None = None  # ... and its copy that is done when called
        self._stream: dict[int, int] = {}  # live slot -> its stream
        self._slot: dict[int, int] = {}  # live stream -> its slot
        self._parked: collections.OrderedDict[int, None] = collections.OrderedDict()  # least recent first

    @property
    def num_parked(self) -> int:
        return len(self._parked)

    def stream_of(self, slot: int) -> int | None:
        return self._stream.get(slot)

    def place(self, spans: Iterable[tuple[int, int, int, list[int]]]) -> list[int]:
        """(slot, start_pos, length, block_table) of a step's spans -> each span's stream, in the same order.

        Fresh slots get streams before any cells move: the longest prefix hits first (a parked holder is taken over
        in place, truncated to the hit), then copies of live holders and fresh starts into the remaining streams,
        parked ones holding nothing this step needs before the others."""
        spans = list(spans)
        fresh = [i for i, (slot, start, _, _) in enumerate(spans) if slot not in self._stream or start == 0]
        for i in fresh:
            if spans[i][0] in self._stream:  # a restart from position 0 on a live slot (the engine frees first)
                self.free(spans[i][0])
        bs = self.block_size
        hits = {i: spans[i][3][: spans[i][1] // bs] for i in fresh}
        needed = {b for h in hits.values() for b in h}
        later: list[int] = []
        for i in sorted(fresh, key=lambda j: -len(hits[j])):
            parked = [s for s in self._holders(hits[i]) if s in self._parked] if hits[i] else []
            if parked:  # one holding the window before the hit, then the one whose takeover drops the fewest blocks
                s = min(parked, key=lambda p: (self._lacks_window(p, len(hits[i])), len(self._tables[p])))
                self._bind(spans[i][0], s)
                self._truncate(s, len(hits[i]))
            else:
                later.append(i)
        for i in later:
            slot, hit = spans[i][0], hits[i]
            src = min(self._holders(hit), key=lambda p: self._lacks_window(p, len(hit)), default=None)
            if hit and src is None:
                raise RuntimeError(f"prefix of {len(hit)} blocks is not held in any llama.cpp stream; the engine and "
                                   "the runner disagree")
            s = self._spare_stream(needed)
            self._bind(slot, s)
            if src is None:
                self._remove(s, -1, -1)
            else:
                if self._lacks_window(src, len(hit)) and self.copy_now is not None:
                    # the hit resumes at a window checkpoint loaded into `s` before this step's decode; llama.cpp
                    # copies a stream's tensors at that decode, over it: this copy goes through host memory now
                    self._remove(s, -1, -1)
                    self.copy_now(src, s)
                else:
                    self._copy(src, s)
                self._remove(s, len(hit) * bs, -1)
                for j, b in enumerate(hit):
                    self._add(s, j, b)
        out = []
        for slot, start, length, table in spans:
            s = self._stream[slot]
            known = self._tables[s]
            for j in range(len(known), min(-(-(start + length) // bs), len(table))):
                self._add(s, j, table[j])
            out.append(s)
        return out

    def servable(self, blocks: list[int]) -> int:
        """llama.cpp copies whole streams, so a hit is served from one stream: the longest run it holds."""
        best = 0
        for s in self._where.get(blocks[0], ()) if blocks else ():
            table, n = self._tables[s], 0
            while n < min(len(table), len(blocks)) and table[n] == blocks[n]:
                n += 1
            best = max(best, n)
        return best

    def _lacks_window(self, stream: int, n_blocks: int) -> bool:
        """A window model's stream that does not hold the window before its first n_blocks (window.py)."""
        return self.covers is not None and not self.covers(stream, n_blocks * self.block_size)

    def serving(self, blocks: list[int]) -> list[int]:
        """The streams a fresh sequence could be given these blocks from."""
        return self._holders(blocks)

    def is_live(self, slot: int) -> bool:
        return slot in self._stream

    def holder(self, blocks: list[int]) -> int | None:
        """A stream whose cells hold exactly these blocks from position 0 (a parked one first), to export them."""
        found = self._holders(blocks)
        return next((s for s in found if s in self._parked), found[0] if found else None)

    def restore_target(self) -> int | None:
        """An empty stream no slot runs in, for a prefix read back from disk (None: every stream is running)."""
        if len(self._slot) >= self.num_streams:
            return None
        return self._spare_stream(set())

    def adopt(self, stream: int, blocks: list[int]) -> None:
        """`stream`'s cells now hold `blocks` from position 0: parked, the most recently used."""
        self._tables[stream] = []
        for j, b in enumerate(blocks):
            self._add(stream, j, b)
        self._parked[stream] = None
        self._parked.move_to_end(stream)

    def release(self, stream: int) -> None:
        """A restore into `stream` failed: it holds nothing."""
        self._parked.pop(stream, None)
        self._tables.pop(stream, None)

    def _holders(self, blocks: list[int]) -> list[int]:
        """Streams whose cells hold exactly these blocks at positions 0..len-1."""
        if not blocks:
            return []
        n = len(blocks)
        return sorted(s for s in self._where.get(blocks[-1], ()) if self._tables[s][:n] == blocks)

    def _spare_stream(self, needed: set[int]) -> int:
        """A stream no slot runs in: an empty one, else a parked one holding nothing `needed`, from the least
        recently parked half (the recent half is what the next chat turns will ask for).

        llama.cpp puts only consecutive stream ids into one micro-batch, so decoding streams with a gap between them
        cost a weight pass per run of consecutive ids: among those candidates, a stream next to running ones (best,
        one that closes a gap) goes first, then the least recently parked."""
        idle = [s for s in range(self.num_streams) if s not in self._slot]
        order = list(self._parked)
        usable = [s for s in idle if s not in self._parked]
        if not usable:
            spare = [p for p in order if not needed.intersection(b for b in self._tables[p] if b is not None)]
            usable = spare[: max(1, len(spare) // 2)] or order[:1]
        age = {p: i for i, p in enumerate(order)}
        s = min(usable, key=lambda x: (-((x - 1) in self._slot) - ((x + 1) in self._slot), age.get(x, 0), x))
        if s in self._parked:
            self._truncate(s, 0)
        return s

    def _bind(self, slot: int, stream: int) -> None:
        self._parked.pop(stream, None)
        self._stream[slot], self._slot[stream] = stream, slot
        self._tables.setdefault(stream, [])

    def _truncate(self, stream: int, n: int) -> None:
        """Keep the stream's first n blocks; cells beyond go, blocks held nowhere else become uncached."""
        table = self._tables.setdefault(stream, [])
        for b in table[n:]:
            if b is None:
                continue
            holders = self._where[b]
            holders.discard(stream)
            if not holders:
                del self._where[b], self._index[b]
                self.uncached.append(b)
        del table[n:]
        self._remove(stream, n * self.block_size, -1)

    def free(self, slot: int) -> None:
        """The slot's sequence ended: its stream keeps the cells (parked) while any block is still known."""
        s = self._stream.pop(slot, None)
        if s is None:
            return
        del self._slot[s]
        if any(b is not None for b in self._tables.get(s, [])):
            self._parked[s] = None
        else:
            self._tables.pop(s, None)
            self._remove(s, -1, -1)

    def _live(self, stream: int) -> bool:
        return stream in self._slot

    def _emptied(self, stream: int) -> None:
        self._parked.pop(stream, None)
        self._tables.pop(stream)

    def reset(self) -> None:
        """Forget every stream's cells (a new engine starts with an empty cache)."""
        for s in range(self.num_streams):
            self._remove(s, -1, -1)
        self._stream.clear()
        self._slot.clear()
        self._tables.clear()
        self._where.clear()
        self._index.clear()
        self._parked.clear()
        self.uncached.clear()
