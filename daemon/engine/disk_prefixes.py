"""One engine's side of the disk KV cache (kv_disk.py): which prefixes to save when it stops, which to read back.

Saving: every finished sequence's chain of cached blocks is remembered (its longest, the newest last); when the
engine stops, the chains whose blocks are all still cached are exported by the runner (the newest first) and queued
for the disk writer. Restoring: a new prompt's block keys are looked up on disk by the submitting thread; when the
disk holds more of it than memory, a reader thread reads and checks the file, and the engine thread puts the blocks
back (`restore`) just before it queues the request, so admission sees an ordinary prefix hit.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from typing import Any, Callable

from ...backends.base import Runner
from ...backends.common.kv_plan import available_host_bytes
from .blocks import BlockManager, block_key
from .kv_disk import DiskKVCache, Entry, Restore, namespace_of

log = logging.getLogger(__name__)

MAX_CHAINS = 64  # finished chains remembered for saving
MIN_GAIN_BLOCKS = 2  # read from disk only when it holds at least this many blocks more than memory
EXPORT_RAM_SHARE = 0.25  # exports wait in memory for the writer: at most this share of the RAM available at unload


def prompt_keys(prompt_ids: list[int], block_size: int) -> list[bytes]:
    """Chain keys of the prompt's full blocks that a prefix hit may cover (the last token is always computed)."""
    keys: list[bytes] = []
    for j in range((len(prompt_ids) - 1) // block_size):
        keys.append(block_key(keys[-1] if keys else b"", prompt_ids[j * block_size : (j + 1) * block_size]))
    return keys


class DiskPrefixes:
    def __init__(self, disk: DiskKVCache, signature: dict[str, Any], block_size: int, name: str) -> None:
        self.disk, self.block_size, self.name = disk, block_size, name
        self.signature = signature
        self.ns = namespace_of(signature)
        self.min_blocks = max(1, -(-disk.min_tokens // block_size))
        self._chains: collections.OrderedDict[bytes, list[bytes]] = collections.OrderedDict()
        self.restored_tokens = self.restored_bytes = self.failed = 0
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None

    # ---- the submitting thread ----
    def candidate(self, keys: list[bytes], blocks: BlockManager) -> tuple[Entry, int] | None:
        """The saved entry worth reading for a prompt with these keys, and how many of its blocks (memory is read
        here from another thread: a stale answer costs a needless read or a recompute, never a wrong token)."""
        if len(keys) < self.min_blocks:
            return None
        hit = self.disk.lookup(self.ns, keys)
        if hit is None or hit[1] < self.min_blocks or hit[1] - blocks.hit_blocks(keys[: hit[1]]) < MIN_GAIN_BLOCKS:
            return None
        return hit

    def read_later(self, hit: tuple[Entry, int], then: Callable[[Restore | None], None]) -> None:
        """Read the saved prefix on a reader thread (neither the submitting thread nor the engine's), then
        `then(restore)`: None when the read failed, and the request goes on without it."""
        if self._reader is None:
            self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"kv-read-{self.name}")
        self._reader.submit(self._read, hit, then)

    def stop_reading(self) -> None:
        """Wait for the reads under way (their `then` runs)."""
        if self._reader is not None:
            self._reader.shutdown(wait=True, cancel_futures=False)

    # ---- the reader thread ----
    def _read(self, hit: tuple[Entry, int], then: Callable[[Restore | None], None]) -> None:
        restore = None
        try:
            restore = self.disk.read(self.ns, *hit)
        except Exception:  # noqa: BLE001 - the request goes on without the saved prefix
            log.exception("reading a saved prefix failed")
        finally:
            then(restore)

    # ---- the engine thread ----
    def restore(self, r: Restore, blocks: BlockManager, runner: Runner) -> dict[str, Any] | None:
        """Put a prefix read from disk back as cached blocks; the event to publish, None if memory held it by now."""
        keys = r.keys[: r.num_blocks]
        if len(keys) - blocks.hit_blocks(keys) < MIN_GAIN_BLOCKS:
            return None
        t0 = time.perf_counter()
        taken = blocks.take_free(len(keys))
        ok = False
        if taken is not None:
            forgotten = blocks.take_forgotten()
            if forgotten:
                runner.drop_blocks(forgotten)
            try:
                ok = runner.import_prefix(taken, r.payload, len(r.keys))
            except Exception:  # noqa: BLE001 - a bad restore is a recompute, never a failed request
                log.exception("restoring a saved prefix failed")
            blocks.uncache(runner.take_uncached())
            if ok:
                blocks.adopt(taken, keys)
            else:
                blocks.give_back(taken)
        tokens = len(keys) * self.block_size
        if not ok:
            self.failed += 1
            log.warning("%s: a saved prefix of %d tokens could not be restored (%s); recomputing it", self.name,
                        tokens, "no free KV blocks" if taken is None else "the backend refused it")
            return {"event": "restore_failed", "tokens": tokens}
        nbytes = len(r.payload)
        self.restored_tokens += tokens
        self.restored_bytes += nbytes
        self.disk.count_restored(tokens, nbytes)
        return {"event": "restored", "tokens": tokens, "bytes": nbytes, "read_ms": r.read_s * 1e3,
                "ms": (time.perf_counter() - t0) * 1e3}

    def record(self, block_keys: list[bytes]) -> None:
        """A sequence finished holding these cached blocks (its chain's keys): a prefix worth saving later."""
        if len(block_keys) < self.min_blocks:
            return
        for k in block_keys[:-1]:
            self._chains.pop(k, None)  # a prefix of this one
        last = block_keys[-1]
        self._chains[last] = list(block_keys)
        self._chains.move_to_end(last)
        while len(self._chains) > MAX_CHAINS:
            self._chains.popitem(last=False)

    def persist(self, blocks: BlockManager, runner: Runner) -> dict[str, Any]:
        """At stop: export the remembered chains still cached, newest first, and queue them for writing."""
        t0 = time.perf_counter()
        saved: set[bytes] = set()
        n_entries = n_bytes = 0
        cap = min(self.disk.budget, int(available_host_bytes() * EXPORT_RAM_SHARE))
        for keys in reversed(self._chains.values()):
            table: list[int] = []
            for k in keys:
                b = blocks.cached_block(k)
                if b is None:
                    break
                table.append(b)
            n = len(table)
            # what a saved prefix (this time or earlier) already holds is not written again: a chain is saved when it
            # adds at least the minimum beyond it (the same document asked twice is one file, not two)
            covered = next((i + 1 for i in range(n - 1, -1, -1) if keys[i] in saved or self.disk.has(self.ns, keys[i])),
                           0)
            if n - covered < self.min_blocks:
                continue
            if n_bytes >= cap:
                log.info("%s: the disk KV cache takes no more prefixes at this unload (%.1f MiB queued)", self.name,
                         n_bytes / 2**20)
                break
            try:
                data = runner.export_prefix(table)
            except Exception:  # noqa: BLE001 - saving is best effort
                log.exception("exporting a cached prefix failed")
                continue
            if not data:
                continue
            saved.update(keys[:n])
            n_entries += 1
            n_bytes += len(data)
            self.disk.save(self.ns, keys[:n], data, {"tokens": n * self.block_size, "model": self.name,
                                                     "signature": self.signature})
        self._chains.clear()
        return {"event": "saving", "entries": n_entries, "bytes": n_bytes, "ms": (time.perf_counter() - t0) * 1e3}
