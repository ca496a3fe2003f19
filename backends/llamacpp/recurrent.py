"""Recurrent-state checkpoints for hybrid models (LFM2, Qwen3.5, Granite 4, Nemotron-H...) on llama.cpp.

An attention layer keeps one KV cell per position, so a cached prefix can be cut anywhere. A recurrent layer (a
convolution window, an SSM or a delta-net state) keeps one state per sequence, at its last position: it cannot be
cut back. So a prefix hit, or a prefix read back from disk, resumes only where a state was saved. After each step
the runner saves the recurrent part of every sequence whose computed tokens end on a block boundary (llama.cpp's
`llama_state_seq_get_data_ext` with `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`, what llama-server's context checkpoints
hold), keyed by the engine block that ends there; the scheduler makes prompt chunks end on such boundaries. A hit
is cut back to the last block with a checkpoint (`resumable`), its attention cells are shared as for any model, and
the checkpoint is loaded into the new sequence. What lies past the checkpoint is recomputed, and counted.

Sequences other than live ones (llama.cpp holder ids, parked streams) never keep a recurrent state: it is cleared
when a slot is freed, and before any cut of a sequence's cells (llama.cpp refuses to cut one that has a state).
"""
from __future__ import annotations

import ctypes
import logging
import struct

from .lib import L

from ..common.kv_plan import available_host_bytes
from .checkpoints import Checkpoints, State, state_pointer
from .native import take_recent_errors

log = logging.getLogger(__name__)

PARTIAL = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the memory that cannot be cut: the recurrent states
MIN_BUDGET = 64 << 20  # checkpoints kept in host memory: at least this many bytes ...
STATES_PER_SLOT = 4  # ... or this many states per slot ...
RAM_SHARE = 0.1  # ... but no more than this share of the memory available when the first one is taken


class RecurrentStates:
    """Save, clear and load the recurrent part of llama.cpp sequences; checkpoints by engine block, LRU-bounded."""

    def __init__(self, ctx, block_size: int, num_slots: int, empty_seq: int) -> None:
        self._ctx, self.block_size = ctx, block_size
        self._empty = self.save(empty_seq)  # a sequence without a state: loading it clears one
        self.state_bytes = 0  # one sequence's state, learnt from the first checkpoint
        self.budget = MIN_BUDGET
        self._num_slots = num_slots
        self._points = Checkpoints()  # block -> state
        self._transient: dict[int, int] = {}  # slot -> block of its latest decode checkpoint
        # llama.cpp sequence -> (slot, position) its recurrent state was left at by the last step. Where a new sequence's
        # cells are shared from a live one (the unified layout), llama.cpp shares that one's state too: only this says
        # whether a sequence continues its own.
        self._at: dict[int, tuple[int, int]] = {}
        self.saved = self.loaded = self.evicted = 0

    # ---- llama.cpp ----
    def save(self, seq: int) -> bytes:
        size = L.llama_state_seq_get_size_ext(self._ctx, seq, PARTIAL)
        buf = (ctypes.c_uint8 * size)()
        got = L.llama_state_seq_get_data_ext(self._ctx, buf, size, seq, PARTIAL)
        if got != size:
            raise RuntimeError(f"llama.cpp saved {got} of {size} bytes of sequence {seq}'s recurrent state")
        return ctypes.string_at(buf, got)

    def load(self, seq: int, data: State) -> None:
        if L.llama_state_seq_set_data_ext(self._ctx, state_pointer(data), len(data), seq, PARTIAL) != len(data):
            raise RuntimeError(f"llama.cpp did not take a recurrent state back into sequence {seq}: "
                               f"{take_recent_errors() or 'unknown reason'}")

    def clear(self, seq: int) -> None:
        """Drop `seq`'s recurrent state, leaving its attention cells (which can then be cut)."""
        self.load(seq, self._empty)
        self._at.pop(seq, None)

    # ---- checkpoints ----
    def checkpoint(self, slot: int, seq: int, block: int, decode: bool) -> None:
        """Save `seq`'s state as the one after `block`'s last token. A decode's checkpoint replaces the slot's previous
        decode checkpoint (the last block boundary of an answer is what a follow-up turn resumes from)."""
        data = self.save(seq)
        if not self.state_bytes:
            self.state_bytes = len(data)
            want = min(STATES_PER_SLOT * self._num_slots * len(data), int(available_host_bytes() * RAM_SHARE))
            self.budget = max(MIN_BUDGET, want, 2 * len(data))
            log.info("recurrent state: %d bytes per sequence; checkpoints keep up to %.0f MiB", len(data),
                     self.budget / 2**20)
        if decode:
            old = self._transient.pop(slot, None)
            if old is not None and old != block:
                self._points.forget(old)
            self._transient[slot] = block
        self.put(block, data)
        self.saved += 1

    def put(self, block: int, data: State) -> None:
        self.evicted += self._points.put(block, data, self.budget)

    def restore(self, seq: int, block: int) -> None:
        """Load the checkpoint after `block` into `seq` (a fresh sequence whose attention cells hold the prefix)."""
        data = self._points.get(block)
        if data is None:
            raise RuntimeError(f"no recurrent-state checkpoint after block {block}; the engine and the runner disagree")
        self.load(seq, data)
        self.loaded += 1

    def resumable(self, blocks: list[int]) -> int:
        """The longest leading run of `blocks` that ends where a checkpoint was saved (0: none)."""
        return self._points.last_in(blocks)

    def along(self, blocks: list[int]) -> list[tuple[int, State]]:
        """(index, state) of the checkpoints saved along a chain of blocks, to save it to disk with them."""
        return self._points.along(blocks)

    def drop(self, blocks: list[int]) -> None:
        """The engine forgot these blocks: their checkpoints go too."""
        gone = set(blocks)
        for b in gone:
            self._points.forget(b)
        self._transient = {s: b for s, b in self._transient.items() if b not in gone}

    def release(self, slot: int) -> None:
        """The slot's sequence ended; its last decode checkpoint stays (a follow-up turn resumes from it)."""
        self._transient.pop(slot, None)

    # ---- the runner's step ----
    def resume(self, mem, spans: list, seqs: list[int]) -> None:
        """Before a step: a span starting a sequence on a cached prefix gets the checkpoint where the prefix ends."""
        for s, seq in zip(spans, seqs):
            if s.start_pos and self._at.get(seq) != (s.slot, s.start_pos):
                self.restore(seq, s.block_table[s.start_pos // self.block_size - 1])
                if L.llama_memory_seq_pos_max(mem, seq) + 1 != s.start_pos:
                    raise RuntimeError(f"sequence {seq} holds {L.llama_memory_seq_pos_max(mem, seq) + 1} positions "
                                       f"after its checkpoint was loaded, not {s.start_pos}")

    def after_step(self, spans: list, seqs: list[int]) -> None:
        """Checkpoint every sequence whose computed tokens now end on a block boundary."""
        bs = self.block_size
        for s, seq in zip(spans, seqs):
            end = s.start_pos + s.length
            self._at[seq] = (s.slot, end)
            if end % bs == 0 and 0 < end // bs <= len(s.block_table):
                self.checkpoint(s.slot, seq, s.block_table[end // bs - 1], decode=s.length == 1)

    def reset(self) -> None:
        self._points.clear()
        self._transient.clear()
        self._at.clear()


# A saved prefix of a recurrent model: llama.cpp's state of the sequence holding its attention cells, then the
# checkpoints saved along it (block index, state), so that a restore can resume where one of them was taken.
_MAGIC = b"EVENFLOW-RS1\n"


def pack_prefix(attention: State, points: list[tuple[int, State]]) -> bytes:
    head = struct.pack("<II", len(attention), len(points)) + b"".join(struct.pack("<II", i, len(d)) for i, d in points)
    return b"".join([_MAGIC, head, attention, *(d for _, d in points)])


def unpack_prefix(data: State) -> tuple[memoryview, list[tuple[int, memoryview]]] | None:
    """(attention state, checkpoints) of `pack_prefix`'s bytes, as views into `data` (no copy: a restored window
    model's payload is tens of MiB); None when they are not such bytes."""
    view = memoryview(data)
    if bytes(view[: len(_MAGIC)]) != _MAGIC or len(view) < len(_MAGIC) + 8:
        return None
    at = len(_MAGIC)
    n_attn, n_points = struct.unpack_from("<II", view, at)
    at += 8
    if len(view) < at + 8 * n_points:
        return None
    sizes = [struct.unpack_from("<II", view, at + 8 * j) for j in range(n_points)]
    at += 8 * n_points
    if at + n_attn + sum(n for _, n in sizes) != len(view):
        return None
    attention = view[at:at + n_attn]
    at += n_attn
    points = []
    for i, n in sizes:
        points.append((i, view[at:at + n]))
        at += n
    return attention, points
