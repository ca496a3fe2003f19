"""KV accounting: fixed-size blocks and sequence slots. The backend owns the memory; this owns who holds what.

Automatic prefix caching (as in vLLM and nano-vllm): a block full of computed tokens is keyed by a hash of
(its parent's key, its token ids), so equal prefixes have equal keys. Blocks are reference counted; a block
nobody holds keeps its contents and key on an LRU list until it is handed out again, so a finished
conversation stays cached while memory allows. Only full blocks are shared and a sequence only ever writes
past its cached prefix, so a shared block is never written (but by a recurrent model's sequence resuming short of
its hit with per-sequence KV, which computes the rest again into cells of its own).
"""
from __future__ import annotations

import collections
import hashlib
import logging
from array import array
from typing import Callable

from .sequence import Sequence

log = logging.getLogger(__name__)

def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def block_key(parent: bytes, tokens: list[int]) -> bytes:
    """128-bit key of a full block: its parent's key chained with its token ids (collisions: ~2^-64)."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


class BlockManager:
    """Reference-counted KV blocks; full computed blocks are cached by prefix key until evicted (LRU)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True,
                 servable: Callable[[list[int]], int] | None = None,
                 resumable: Callable[[list[int]], int] | None = None, rewind_in_place: bool = True,
                 whole_chains: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._ref = [0] * num_blocks
        self._key: list[bytes | None] = [None] * num_blocks  # set while the block is in the cache
        self._cached: dict[bytes, int] = {}  # key -> block
        self._free = list(range(num_blocks - 1, -1, -1))  # free and uncached; pop() hands out low ids first
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # free but cached, oldest first
        # The block before each cached block in the chain that cached it (-1: the first), to find a chain's cached
        # continuations when one of its blocks loses its key to a twin (`_unchain`).
        self._prev = [-1] * num_blocks
        # whole_chains: a hit must be one run held together (llama.cpp's streams copy whole sequences); a shared pool
        # (llama.cpp's unified cache) serves a chain position by position, so its twins' continuations stay cached.
        self.whole_chains = whole_chains
        # Blocks whose contents nobody will read again (freed uncached, or evicted from the cache) since the
        # engine last looked: a runner that keeps KV outside the block pool (llama.cpp) drops them.
        self.forgotten: list[int] = []
        # A runner whose KV lives outside the pool says how much of a cached prefix it can still serve; a hit it
        # cannot honour is cut there and recomputed (counted, never an error).
        self.servable = servable
        self.fallback_tokens = 0
        # A recurrent model resumes a hit only where the runner saved its state (Runner.resumable_prefix): the rest of
        # the hit is recomputed (counted here). `rewind_in_place`: into the hit's own blocks, which stay cached and
        # keep the chain whole (per-sequence KV: the recomputed cells are the sequence's own); else into new blocks
        # (a shared KV pool: cells computed again are cells the pool must count).
        self.resumable = resumable
        self.rewind_in_place = rewind_in_place
        self.rewind_tokens = 0

    @property
    def num_free(self) -> int:
        """Blocks nobody holds, cached ones included: those are evicted before anyone is preempted."""
        return len(self._free) + len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks holding a cached prefix (in use or free)."""
        return len(self._cached)

    @property
    def num_cached_free(self) -> int:
        """Blocks nobody holds that still keep a cached prefix."""
        return len(self._lru)

    def refcount(self, block: int) -> int:
        return self._ref[block]

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, blocks_for(seq.num_computed + num_new_tokens, self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free

    def max_new_tokens(self, seq: Sequence) -> int:
        """How many new tokens `seq` could take with the blocks it holds plus every free block."""
        return (len(seq.block_table) + self.num_free) * self.block_size - seq.num_computed

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        need = self.blocks_needed(seq, num_new_tokens)
        if need > self.num_free:
            raise RuntimeError(f"out of KV blocks: need {need}, {self.num_free} free")
        for _ in range(need):
            b = self._take()
            self._ref[b] = 1
            seq.block_table.append(b)

    def _take(self) -> int:
        if self._free:
            return self._free.pop()
        b, _ = self._lru.popitem(last=False)  # evict the least recently used cached block
        key = self._key[b]
        self._key[b] = None
        if key is not None and self._cached.get(key) == b:
            del self._cached[key]
        self.forgotten.append(b)
        return b

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so that the LRU list evicts a sequence's end before its (more shared) start.
        for b in reversed(seq.block_table):
            if self._ref[b] <= 0:
                raise RuntimeError(f"block {b} freed by seq {seq.seq_id} but nobody holds it")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._key[b] is not None:
                    self._lru[b] = None
                else:
                    self._free.append(b)
                    self.forgotten.append(b)
        seq.block_table = []
        seq.num_registered = 0

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past `seq`'s computed tokens (those of draft tokens the model rejected): it holds
        what decoding token by token would hold. They are unkeyed (never full of computed tokens) and held by none
        else (written this step)."""
        keep = blocks_for(seq.num_computed, self.block_size)
        for b in reversed(seq.block_table[keep:]):
            if self._ref[b] != 1 or self._key[b] is not None:
                raise RuntimeError(f"block {b} past seq {seq.seq_id}'s computed tokens is shared or cached")
            self._ref[b] = 0
            self._free.append(b)
            self.forgotten.append(b)
        del seq.block_table[keep:]

    def acquire_prefix(self, seq: Sequence) -> int:
        """At admission: share the longest cached run of `seq`'s full blocks and count it as computed.

        At least the last known token is left to compute (its logits are needed). Returns the tokens shared."""
        if seq.block_table or seq.num_computed:
            raise RuntimeError(f"seq {seq.seq_id} already holds KV; a prefix is acquired only at admission")
        if not self.prefix_caching:
            return 0
        hit: list[int] = []
        for i in range(min((seq.num_tokens - 1) // self.block_size, len(self._cached))):
            b = self._cached.get(self._seq_key(seq, i))
            if b is None:
                break
            hit.append(b)
        if hit and self.servable is not None and (n := self.servable(hit)) < len(hit):
            lost = len(hit) - n
            self.fallback_tokens += lost * self.block_size
            log.warning("seq %d: the runner no longer holds %d of the %d cached prefix blocks it was counted on for; "
                        "recomputing them", seq.seq_id, lost, len(hit))
            self.uncache(hit[n:])
            del hit[n:]
        resume = len(hit)
        if hit and self.resumable is not None and (resume := self.resumable(hit)) < len(hit):
            # In place, the sequence holds the whole hit but computes it again from the checkpoint: the chain stays
            # one, and stays cached (a block the runner dropped meanwhile is cached again once recomputed: it is
            # registered from the checkpoint on).
            self.rewind_tokens += (len(hit) - resume) * self.block_size
            log.info("seq %d: its recurrent state resumes after %d of the %d cached prefix blocks (the last "
                     "checkpoint); recomputing the other %d", seq.seq_id, resume, len(hit), len(hit) - resume)
            if not self.rewind_in_place:
                del hit[resume:]
        for b in hit:
            if self._ref[b] == 0:
                del self._lru[b]
            self._ref[b] += 1
            seq.block_table.append(b)
        n = resume * self.block_size
        seq.num_computed = n
        seq.num_registered = resume
        return n

    def cached_prefix_tokens(self, seq: Sequence) -> int:
        """Tokens a hit would serve `seq` now, taking no references (to order a queue by work left)."""
        if not self.prefix_caching:
            return 0
        n = 0
        while n < min((seq.num_tokens - 1) // self.block_size, len(self._cached)) and \
                self._seq_key(seq, n) in self._cached:
            n += 1
        return n * self.block_size

    def release_prefix(self, seq: Sequence) -> None:
        """Undo `acquire_prefix` for a sequence that could not be admitted after all."""
        self.free(seq)
        seq.num_computed = 0

    def commit(self, seq: Sequence) -> None:
        """After a step: cache `seq`'s blocks that are now full of computed tokens."""
        if not self.prefix_caching:
            return
        full = seq.num_computed // self.block_size
        table = seq.block_table
        last = 0
        for i in range(seq.num_registered, full):
            key = self._seq_key(seq, i)
            b = table[i]
            if key in self._cached or self._key[b] is not None:
                continue  # a twin computed concurrently keeps the entry
            self._cached[key] = b
            self._key[b] = key
            self._prev[b] = table[i - 1] if i else -1
            last = i
        # The cache keeps chains whole: when `seq` extends past twins of its earlier blocks, its own blocks take
        # their keys, so a later hit is one run of blocks (llama.cpp serves a hit from one stream).
        moved = [old for j in range(last) if (old := self._repoint(self._seq_key(seq, j), table[j],
                                                                    table[j - 1] if j else -1)) is not None]
        self._unchain(moved)
        seq.num_registered = max(seq.num_registered, full)

    def _repoint(self, key: bytes, b: int, prev: int) -> int | None:
        """`key` now names block b (after `prev` in its chain); returns the block that lost it, if any."""
        old = self._cached.get(key)
        if old == b:
            return None
        if old is not None:
            self._key[old] = None
            if self._ref[old] == 0:  # free and cached: now simply free
                del self._lru[old]
                self._free.append(old)
                self.forgotten.append(old)
        self._cached[key] = b
        self._key[b] = key
        self._prev[b] = prev
        return old

    def _unchain(self, olds: list[int]) -> None:
        """Blocks that lost their keys to twins: their chains' cached continuations that no twin took over (a
        request that parted from the twin's) are uncached. Their cells sit after the old blocks, in sequences (llama.cpp
        streams) that do not hold the twins, so a hit running through the twins could not be served from one."""
        if not olds or not self.whole_chains:
            return
        children: dict[int, list[int]] = {}
        for c, key in enumerate(self._key):
            if key is not None and self._prev[c] >= 0:
                children.setdefault(self._prev[c], []).append(c)
        orphans, stack = [], list(olds)
        while stack:
            for c in children.pop(stack.pop(), ()):
                orphans.append(c)
                stack.append(c)
        if orphans:
            log.debug("uncaching %d blocks whose chains ran through blocks that twins replaced", len(orphans))
            self.uncache(orphans)

    def _seq_key(self, seq: Sequence, i: int) -> bytes:
        """Key of `seq`'s i-th full block; memoised on the sequence (its known tokens never change)."""
        keys = seq.block_keys
        bs = self.block_size
        while len(keys) <= i:
            j = len(keys)
            keys.append(block_key(keys[-1] if keys else b"", seq.tokens(j * bs, (j + 1) * bs)))
        return keys[i]

    def evict_cached(self, keep: int) -> int:
        """Evict least recently used cached free blocks until at most `keep` remain; returns how many went."""
        n = 0
        while len(self._lru) > max(keep, 0):
            b, _ = self._lru.popitem(last=False)
            key, self._key[b] = self._key[b], None
            if key is not None and self._cached.get(key) == b:
                del self._cached[key]
            self._free.append(b)
            self.forgotten.append(b)
            n += 1
        return n

    # ---- prefixes restored from outside the pool (the disk KV cache, kv_disk.py) ----
    def hit_blocks(self, keys: list[bytes]) -> int:
        """How many leading blocks of a key chain the cache holds now."""
        n = 0
        while n < len(keys) and keys[n] in self._cached:
            n += 1
        return n

    def cached_block(self, key: bytes) -> int | None:
        return self._cached.get(key)

    def take_free(self, n: int) -> list[int] | None:
        """`n` blocks nobody holds (cached ones evicted, least recently used first) for a prefix being restored;
        they belong to no one until `adopt` or `give_back`. None when fewer are free."""
        if n > self.num_free:
            return None
        return [self._take() for _ in range(n)]

    def adopt(self, blocks: list[int], keys: list[bytes]) -> None:
        """Blocks now holding a restored prefix join the cache as cached blocks nobody holds (the chain's keys
        move to them, as when a twin computed concurrently extends past an older copy)."""
        self._unchain([old for j, (key, b) in enumerate(zip(keys, blocks))
                       if (old := self._repoint(key, b, blocks[j - 1] if j else -1)) is not None])
        for b in reversed(blocks):  # as `free` does: the tail is evicted first
            self._lru[b] = None

    def give_back(self, blocks: list[int]) -> None:
        """Undo `take_free` for a restore that did not happen."""
        for b in blocks:
            self._free.append(b)
            self.forgotten.append(b)

    def take_forgotten(self) -> list[int]:
        out, self.forgotten = self.forgotten, []
        return out

    def uncache(self, blocks: list[int]) -> None:
        """The runner lost these blocks' contents (llama.cpp dropped a cached sequence): no more hits on them.
        Free ones are also forgotten, so that cells the runner may still keep of them go before reuse."""
        for b in blocks:
            key = self._key[b]
            if key is None:
                continue
            self._key[b] = None
            if self._cached.get(key) == b:
                del self._cached[key]
            if self._ref[b] == 0:
                del self._lru[b]
                self._free.append(b)
                self.forgotten.append(b)


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
