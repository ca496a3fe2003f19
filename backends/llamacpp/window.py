"""Sliding-window models (Gemma 2/3, gpt-oss, Cohere 2...) on llama.cpp: where a cached prefix can resume, and what
the disk cache saves of it.

llama.cpp keeps a window model's full-attention layers and its window layers in two caches. We make the window cache
full-size (`swa_full`, llama.cpp's default), so a finished sequence's window cells stay in memory like the others and
a prefix hit resumes at any block where the cells of the window before it are still held: llama.cpp reuses a cell
only once it fell out of its sequence's window, and then purges every older one, so a sequence holds the window
cells of one contiguous run of positions (`covers`). Where it does not, the hit is cut back (`resumable`).

What llama.cpp writes of a sequence (`llama_state_seq_get_data`) holds the window layers' cells of its last window
only. So a prefix saved to disk is its state cut back to the prefix's end, plus the windows at a few block
boundaries before it (`window_points`: where prompts run on it ended, and a few blocks before each, where the next
question about the same document will part from it), each written after cutting the sequence further back (a
scratch copy in the unified layout; across streams llama.cpp copies cells only at the next decode, so there the
sequence itself, put back afterwards: its window cells before the last window are then gone, which `covers` sees).
A restore keeps those windows as checkpoints by block; a hit resumes at the prefix's end or at the last checkpoint
before it and recomputes the rest, as llama-server's context checkpoints do.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Iterable

from .lib import L

from .checkpoints import Checkpoints, State, kept, state_pointer
from .native import take_recent_errors
from .recurrent import pack_prefix, unpack_prefix

log = logging.getLogger(__name__)

WINDOW_ONLY = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the window layers' cache alone
# window points per prompt end: that block boundary and these many blocks before it (a next question parts from the
# saved prompt within its last few blocks; further back, a hit recomputes from the nearest point before it)
POINT_OFFSETS = (0, 1, 2, 4, 8, 16, 32)
MAX_NEAR = 8  # such points with one prefix (each is a window's cells in every window layer) ...
MAX_SPREAD = 4  # ... and these many spread along it, no closer than a window (a prompt sharing only its start)
MIN_BUDGET = 256 << 20  # checkpoints read back from disk kept in host memory: at least this many bytes ...
BUDGET_WINDOWS = 2 * (MAX_NEAR + MAX_SPREAD)  # ... or this many windows


def window_points(marks: Iterable[int], n_blocks: int, block_size: int, window: int) -> list[int]:
    """Block counts k (0 < k < n_blocks) where a saved prefix of n_blocks keeps the window ending at k * block_size,
    descending: for each prompt end in `marks` (positions, the latest first) its last block boundary and
    POINT_OFFSETS blocks before it (MAX_NEAR in all), and MAX_SPREAD points evenly along the prefix, at least a
    window apart."""
    near: list[int] = []
    for m in sorted(set(marks), reverse=True):
        for d in POINT_OFFSETS:
            k = min(m // block_size, n_blocks) - d
            if 0 < k < n_blocks and k not in near and len(near) < MAX_NEAR:
                near.append(k)
    step = max(-(-window // block_size), -(-n_blocks // (MAX_SPREAD + 1)))
    spread = [k for k in range(step, n_blocks, step)][:MAX_SPREAD]
    return sorted(set(near + spread), reverse=True)


class SlidingWindow:
    """One context's window bookkeeping: coverage tests, checkpoints by engine block, prompt ends per sequence."""

    def __init__(self, ctx, n_swa: int, block_size: int, shared_kv: bool) -> None:
        self._ctx, self._mem = ctx, L.llama_get_memory(ctx)
        self.n_swa, self.block_size, self.shared_kv = n_swa, block_size, shared_kv
        self._cells = None  # the runner's PrefixCells / StreamCells (attach)
        self._points = Checkpoints()  # block -> the window before its end
        self._marks: dict[int, list[int]] = {}  # seq id -> positions where a prompt run in it ended
        self._prompting: set[int] = set()  # seq ids whose prompt has not produced logits yet
        self.loaded = 0

    def attach(self, cells) -> None:
        """The cells bookkeeping of the runner's layout; a stream layout serves hits from streams that hold the window
        first."""
        self._cells = cells
        if not self.shared_kv:
            cells.covers, cells.copy_now = self.covers, self.copy_now

    # ---- what llama.cpp holds ----
    def covers(self, seq: int, n: int) -> bool:
        """Whether `seq` holds the window cells a query at position n attends (positions n - n_swa + 1 .. n - 1)."""
        if n <= 0:
            return True
        lo, hi = L.llama_memory_seq_pos_min(self._mem, seq), L.llama_memory_seq_pos_max(self._mem, seq)
        return 0 <= lo <= max(0, n - self.n_swa + 1) and hi >= n - 1

    def served(self, blocks: list[int]) -> bool:
        """Whether the cells a fresh sequence would be given `blocks` from hold the window before their end."""
        bs, n = self.block_size, len(blocks) * self.block_size
        if not self.shared_kv:
            return any(self.covers(s, n) for s in self._cells.serving(blocks))
        lo = max(0, n - self.n_swa + 1)  # the window's first position; runs from several holders must each hold theirs
        return all(self.covers(src, min(i1 * bs, n)) and L.llama_memory_seq_pos_min(self._mem, src) <= max(i0 * bs, lo)
                   for src, i0, i1 in self._cells.runs(blocks) if i1 * bs > lo)

    def resumable(self, blocks: list[int]) -> int:
        """Leading blocks of a hit a fresh sequence can resume after: all of them when the cells serving it hold the
        window, else up to the last checkpoint among them (0: none)."""
        if not blocks or self.served(blocks):
            return len(blocks)
        return self._points.last_in(blocks)

    def resume(self, spans: list, seqs: list[int]) -> None:
        """Before a step: a span whose sequence lacks the window before it (a hit cut back to a checkpoint) gets it."""
        for s, seq in zip(spans, seqs):
            if s.start_pos and not self.covers(seq, s.start_pos):
                block = s.block_table[s.start_pos // self.block_size - 1] if s.start_pos % self.block_size == 0 \
                    else None
                data = self._points.get(block)
                if data is None:
                    raise RuntimeError(f"sequence {seq} lacks the attention window before position {s.start_pos} and "
                                       "no checkpoint holds it; the engine and the runner disagree")
                self.load(seq, data)
                self.loaded += 1
                if not self.covers(seq, s.start_pos):
                    raise RuntimeError(f"sequence {seq} lacks the window before {s.start_pos} after its checkpoint")

    # ---- prompt ends (where saved prefixes keep windows) ----
    def started(self, seq: int) -> None:
        self._prompting.add(seq)

    def after_step(self, spans: list, seqs: list[int]) -> None:
        """A prompt's last chunk ran: remember where it ended."""
        for s, seq in zip(spans, seqs):
            if s.need_logits and seq in self._prompting:
                self._prompting.discard(seq)
                self._marks.setdefault(seq, []).append(s.start_pos + s.length)

    def removed(self, seq: int, p0: int) -> None:
        """Cells of `seq` from p0 on went (p0 <= 0: all): prompt ends past p0 mean nothing there any more."""
        if p0 <= 0:
            self._marks.pop(seq, None)
            self._prompting.discard(seq)
        elif seq in self._marks:
            self._marks[seq] = [m for m in self._marks[seq] if m <= p0]

    def copied(self, src: int, dst: int, p1: int = -1) -> None:
        """dst's cells became src's (up to p1): so did its prompt ends."""
        marks = [m for m in self._marks.get(src, []) if p1 < 0 or m <= p1]
        if marks:
            self._marks[dst] = sorted(set(self._marks.get(dst, []) + marks))

    def copy_now(self, src: int, dst: int) -> None:
        """Stream dst (empty) gets src's cells through host memory, at once (a window loaded into dst next must not
        be overwritten by llama.cpp's deferred stream copy)."""
        data = self.save(src, 0)
        if data is None or not self.load(dst, data, 0):
            raise RuntimeError(f"llama.cpp could not copy sequence {src} into {dst}: {take_recent_errors() or 'unknown'}")
        self.copied(src, dst)

    # ---- llama.cpp state ----
    def save(self, seq: int, flags: int) -> bytes | None:
        size = L.llama_state_seq_get_size_ext(self._ctx, seq, flags)
        buf = (ctypes.c_uint8 * size)()
        got = L.llama_state_seq_get_data_ext(self._ctx, buf, size, seq, flags)
        return ctypes.string_at(buf, got) if got else None

    def load(self, seq: int, data: State, flags: int = WINDOW_ONLY) -> bool:
        if L.llama_state_seq_set_data_ext(self._ctx, state_pointer(data), len(data), seq, flags) == len(data):
            return True
        if flags == WINDOW_ONLY:
            raise RuntimeError(f"llama.cpp did not take a window back into sequence {seq}: "
                               f"{take_recent_errors() or 'unknown reason'}")
        return False

    # ---- the disk cache ----
    def export(self, seq: int, blocks: list[int]) -> bytes | None:
        """The first len(blocks) blocks of `seq` as bytes `restore` takes: its state there, and windows further back
        (cut from it, and the checkpoints kept along them)."""
        data = self._export(seq, len(blocks))
        if data is None:
            return None
        full, windows = unpack_prefix(data)
        have = {i for i, _ in windows}
        kept = [(i, w) for i, w in self._points.along(blocks[:-1]) if i not in have]
        return pack_prefix(full, sorted(windows + kept, reverse=True)) if kept else data

    def _export(self, seq: int, n_blocks: int) -> bytes | None:
        marks = list(self._marks.get(seq, []))
        if self.shared_kv:  # a scratch slot id sharing the cells (one stream: nothing is copied)
            work = next((s for s in range(self._cells.num_slots) if not self._cells.is_live(s)), None)
            if work is None:
                return None
            L.llama_memory_seq_rm(self._mem, work, -1, -1)
            L.llama_memory_seq_cp(self._mem, seq, work, 0, n_blocks * self.block_size)
            try:
                return self._cut_and_save(work, n_blocks, marks)
            finally:
                L.llama_memory_seq_rm(self._mem, work, -1, -1)
        whole = self.save(seq, 0)  # to put back: the cells past each cut, and the last window
        try:
            return self._cut_and_save(seq, n_blocks, marks)
        finally:
            L.llama_memory_seq_rm(self._mem, seq, -1, -1)
            if whole is None or not self.load(seq, whole, 0):
                raise RuntimeError(f"llama.cpp did not take sequence {seq}'s cells back after saving a prefix of it")

    def _cut_and_save(self, work: int, n_blocks: int, marks: list[int]) -> bytes | None:
        """`work`'s state cut back to n_blocks, then its windows at `window_points`, cutting it further back."""
        bs = self.block_size
        L.llama_memory_seq_rm(self._mem, work, n_blocks * bs, -1)
        if not self.covers(work, n_blocks * bs):
            return None
        full = self.save(work, 0)
        if full is None:
            return None
        windows: list[tuple[int, bytes]] = []
        for k in window_points(marks, n_blocks, bs, self.n_swa):
            L.llama_memory_seq_rm(self._mem, work, k * bs, -1)
            if not self.covers(work, k * bs):
                break  # cut further back, it holds even less
            data = self.save(work, WINDOW_ONLY)
            if data is not None:
                windows.append((k - 1, data))
        return pack_prefix(full, windows)

    def restore(self, seq: int, data: State, blocks: list[int], stored_blocks: int) -> bool:
        """`export`'s bytes into the empty `seq`, cut back to len(blocks); its windows kept as checkpoints. False:
        nothing a hit could resume from (the sequence is left for the caller to clear)."""
        parts = unpack_prefix(data)
        if parts is None:
            return False
        full, windows = parts
        bs, n = self.block_size, len(blocks) * self.block_size
        if not full or not self.load(seq, full, 0) or L.llama_memory_seq_pos_max(self._mem, seq) + 1 != stored_blocks * bs:
            return False
        L.llama_memory_seq_rm(self._mem, seq, n, -1)
        windows = kept([(i, w) for i, w in windows if i < len(blocks)], data)
        for i, window in windows:
            self.put(blocks[i], window)
        # saved again later, the prefix keeps the same points (window_points takes a mark's own block first)
        self._marks[seq] = sorted((i + 1) * bs for i, _ in windows) + ([n] if self.covers(seq, n) else [])
        return bool(windows) or self.covers(seq, n)

    # ---- checkpoints ----
    def put(self, block: int, data: State) -> None:
        self._points.put(block, data, max(MIN_BUDGET, BUDGET_WINDOWS * len(data)))

    def drop(self, blocks: list[int]) -> None:
        """The engine forgot these blocks: their checkpoints go too."""
        for b in blocks:
            self._points.forget(b)

    def reset(self) -> None:
        self._points.clear()
        self._marks.clear()
        self._prompting.clear()
