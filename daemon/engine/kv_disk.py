"""The disk KV cache: cached prefixes outlive an unload or a restart.

When an engine stops (keep-alive expiry, eviction, `keep_alive: 0`, shutdown) it exports the KV of its most
recently used long prefixes and this module writes them, one file per prefix, in the background. A later engine of
the same model and KV settings finds the longest saved prefix of a new prompt by the same hash chain over token
blocks as the in-memory cache (kv.block_key), reads it off the engine thread, and the engine puts it back as cached
blocks: the scheduler then sees a prefix hit.

Layout: `<root>/<namespace>/<last block key>.kv`, where the namespace is a hash of everything that changes the KV
bytes (the model's weights, backend, KV element types and layout, block size, format version; see
`Runner.kv_signature`). A file is `MAGIC`, a JSON header (namespace, block count, payload length and checksum),
the block keys, then the runner's payload. It is written to a temporary name, fsynced and renamed, so a kill
mid-write leaves no file that can be read; a file whose header, namespace, length or checksum is wrong is ignored
and deleted.
Files are evicted least recently used (a hit touches its file) to stay under the size budget.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash  # checks a 200 MiB payload in ~25 ms (zlib's CRC-32: ~180 ms), off the engine thread but on the TTFT

log = logging.getLogger(__name__)

MAGIC = b"EVENFLOW-KV\n"
FORMAT = 1
KEY_BYTES = 16  # kv.block_key digests
MAX_BLOCKS = 1 << 22  # 67M tokens at 16 a block: a header claiming more is not ours
_HEAD = struct.Struct("<I")  # header length
DISK_RESERVE = 1 << 30  # never fill the disk: keep this much free after a write
STALE_TMP_S = 3600.0  # a temporary file this old belongs to a writer that died


def namespace_of(signature: dict[str, Any]) -> str:
    """The directory name of one model + KV configuration."""
    blob = json.dumps({"format": FORMAT, **signature}, sort_keys=True, default=str).encode()
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


@dataclass
class Entry:
    path: Path
    keys: list[bytes]  # one per block, in order: keys[i] is the chain key of blocks 0..i
    payload_len: int


@dataclass
class Restore:
    """A saved prefix read back: its first `num_blocks` blocks are what a prompt shares with it."""

    keys: list[bytes]  # the entry's keys (all of them)
    num_blocks: int
    payload: bytes
    meta: dict[str, Any]
    read_s: float = 0.0  # reading and checking the file


class DiskKVCache:
    """One per daemon: the files under `root`, an index per namespace, a background writer, counters."""

    def __init__(self, root: Path, budget_bytes: int, min_tokens: int = 256) -> None:
        self.root = Path(root)
        self.budget = int(budget_bytes)
        self.min_tokens = min_tokens
        self._lock = threading.Lock()
        self._index: dict[str, dict[bytes, tuple[Entry, int]]] = {}  # namespace -> key -> (entry, block index)
        self._entries: dict[str, dict[Path, Entry]] = {}
        self._queue: queue.Queue[tuple[str, list[bytes], bytes, dict] | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._files: dict[Path, tuple[float, int]] | None = None  # every entry file: (last use, size); scanned once
        self.written_bytes = self.written_entries = 0
        self.restored_bytes = self.restored_tokens = 0
        self.rejected_files = 0

    # ---- lookups (any thread) ----
    def lookup(self, ns: str, keys: list[bytes]) -> tuple[Entry, int] | None:
        """The saved entry sharing the most leading blocks with `keys` (a prompt's chain), and how many."""
        index = self._namespace(ns)
        with self._lock:
            best = None
            for i, k in enumerate(keys):
                hit = index.get(k)
                if hit is None:
                    break
                best = (hit[0], i + 1)
            return best

    def read(self, ns: str, entry: Entry, num_blocks: int) -> Restore | None:
        """The entry's payload, checked; None (and the file removed) when it is damaged or gone."""
        t0 = time.perf_counter()
        try:
            with open(entry.path, "rb") as f:
                meta, keys = _read_header(f, ns)
                payload = f.read(meta["payload_len"] + 1)
        except FileNotFoundError:
            self._remove(ns, entry.path)
            return None
        except (OSError, ValueError) as e:
            self._reject(ns, entry.path, str(e))
            return None
        if len(payload) != meta["payload_len"] or keys != entry.keys or \
                xxhash.xxh3_64_intdigest(payload) != meta["payload_xxh3"]:
            self._reject(ns, entry.path, "payload length or checksum mismatch")
            return None
        try:
            os.utime(entry.path)  # least recently used goes first (after a restart too)
        except OSError:
            pass
        self._track(entry.path)
        return Restore(keys, min(num_blocks, len(keys)), payload, meta, time.perf_counter() - t0)

    def count_restored(self, tokens: int, nbytes: int) -> None:
        with self._lock:
            self.restored_tokens += tokens
            self.restored_bytes += nbytes

    def index(self, ns: str) -> None:
        """Read the namespace's file headers now (at model load, off the event loop) rather than at a lookup."""
        self._namespace(ns)

    def has(self, ns: str, key: bytes) -> bool:
        index = self._namespace(ns)
        with self._lock:
            return key in index

    # ---- writing ----
    def save(self, ns: str, keys: list[bytes], payload: bytes, meta: dict[str, Any]) -> None:
        """Queue a prefix for writing (the caller does not wait for the disk)."""
        with self._lock:
            self._pending += 1
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
                self._writer.start()
        self._queue.put((ns, keys, payload, meta))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is on disk; False if `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._write(*item)
            except Exception:  # noqa: BLE001 - a full disk must not take the daemon down
                log.exception("writing a KV cache entry failed")
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _write(self, ns: str, keys: list[bytes], payload: bytes, meta: dict[str, Any]) -> None:
        if len(payload) > self.budget:
            log.info("KV cache entry of %d tokens (%.1f MiB) exceeds the disk cache budget; not saved",
                     meta.get("tokens", 0), len(payload) / 2**20)
            return
        d = self.root / ns
        d.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(d).free < len(payload) + DISK_RESERVE:
            log.warning("KV cache: not saving %.1f MiB to %s: the disk is nearly full", len(payload) / 2**20, d)
            return
        sig = d / "signature.json"
        if not sig.exists() and "signature" in meta:
            _atomic_write(sig, json.dumps(meta["signature"], indent=1, default=str).encode())
        head = {k: v for k, v in meta.items() if k != "signature"}
        head.update(namespace=ns, format=FORMAT, blocks=len(keys), payload_len=len(payload),
                    payload_xxh3=xxhash.xxh3_64_intdigest(payload), keys_crc=zlib.crc32(b"".join(keys)),
                    created=time.time())
        hj = json.dumps(head, default=str).encode()
        path = d / f"{keys[-1].hex()}.kv"
        _atomic_write(path, [MAGIC, _HEAD.pack(len(hj)), hj, b"".join(keys), payload])
        entry = Entry(path, list(keys), len(payload))
        index = self._namespace(ns)
        with self._lock:
            self.written_bytes += path.stat().st_size
            self.written_entries += 1
            old = self._entries[ns].get(path)
            self._entries[ns][path] = entry
            # a shorter saved prefix of this one is now redundant: its keys are all here
            shorter = {hit[0].path: hit[0] for k in keys if (hit := index.get(k)) is not None}
            covered = [p for p, e in shorter.items() if p != path and e.keys == keys[: len(e.keys)]]
            for i, k in enumerate(keys):
                index[k] = (entry, i)
        if old is None:
            for p in covered:
                self._remove(ns, p)
        log.info("KV cache: saved %d tokens (%.1f MiB) to %s", meta.get("tokens", 0), len(payload) / 2**20, path)
        self._track(path)
        self._enforce_budget()

    # ---- housekeeping ----
    def _namespace(self, ns: str) -> dict[bytes, tuple[Entry, int]]:
        """The namespace's index, scanning its directory the first time (headers only)."""
        with self._lock:
            index = self._index.get(ns)
            if index is not None:
                return index
        entries: dict[Path, Entry] = {}
        d = self.root / ns
        for p in sorted(d.glob("*.kv")) if d.is_dir() else []:
            try:
                with open(p, "rb") as f:
                    meta, keys = _read_header(f, ns)
                size = p.stat().st_size
                if size != f_size(meta, keys):
                    raise ValueError(f"file is {size} bytes, header says {f_size(meta, keys)}")
                entries[p] = Entry(p, keys, meta["payload_len"])
            except (OSError, ValueError) as e:
                self._reject(ns, p, str(e))
        now = time.time()
        for p in d.glob(".*.tmp*") if d.is_dir() else []:
            try:
                if now - p.stat().st_mtime > STALE_TMP_S:
                    p.unlink()
            except OSError:
                pass
        with self._lock:
            if ns in self._index:  # another thread scanned meanwhile
                return self._index[ns]
            index: dict[bytes, tuple[Entry, int]] = {}
            for e in sorted(entries.values(), key=lambda e: len(e.keys)):  # longest wins a shared key
                for i, k in enumerate(e.keys):
                    index[k] = (e, i)
            self._index[ns], self._entries[ns] = index, entries
            return index

    def _reject(self, ns: str, path: Path, why: str) -> None:
        log.warning("KV cache: ignoring and removing %s: %s", path, why)
        with self._lock:
            self.rejected_files += 1
        self._remove(ns, path)

    def _remove(self, ns: str, path: Path) -> None:
        with self._lock:
            if self._files is not None:
                self._files.pop(path, None)
            entry = self._entries.get(ns, {}).pop(path, None)
            index = self._index.get(ns, {})
            if entry is not None:
                for k in entry.keys:
                    if (hit := index.get(k)) is not None and hit[0] is entry:
                        del index[k]
        _unlink(path)

    def _scan_files(self) -> dict[Path, tuple[float, int]]:
        """Every entry file under the root, once; kept up to date by writes, reads and removals after that."""
        with self._lock:
            if self._files is not None:
                return self._files
        found = {}
        for p in self.root.glob("*/*.kv") if self.root.is_dir() else []:
            try:
                st = p.stat()
            except OSError:
                continue
            found[p] = (st.st_mtime, st.st_size)
        with self._lock:
            if self._files is None:
                self._files = found
            return self._files

    def _track(self, path: Path) -> None:
        files = self._scan_files()
        try:
            st = path.stat()
        except OSError:
            return
        with self._lock:
            files[path] = (st.st_mtime, st.st_size)

    def _enforce_budget(self) -> None:
        files = self._scan_files()
        with self._lock:
            oldest = sorted(files.items(), key=lambda f: f[1][0])
            total = sum(size for _, (_, size) in oldest)
        for p, (_, size) in oldest:
            if total <= self.budget:
                break
            log.info("KV cache over its budget (%.1f of %.1f MiB): evicting %s", total / 2**20, self.budget / 2**20, p)
            self._remove(p.parent.name, p)
            total -= size

    def usage(self) -> dict[str, Any]:
        """Size on disk and counters, for /api/ps, /metrics and the monitor (no disk access after the first)."""
        files = self._scan_files()
        with self._lock:
            return {"path": str(self.root), "size": sum(size for _, size in files.values()), "entries": len(files),
                    "budget": self.budget, "written_bytes": self.written_bytes,
                    "restored_tokens": self.restored_tokens, "restored_bytes": self.restored_bytes,
                    "rejected_files": self.rejected_files}

    def close(self, timeout: float = 60.0) -> None:
        """Finish queued writes (bounded), then stop the writer."""
        if not self.flush(timeout):
            log.warning("KV cache: %d writes still queued at shutdown are dropped", self._pending)
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            self._queue.put(None)


def f_size(meta: dict[str, Any], keys: list[bytes]) -> int:
    """The length of a whole file with this header (a shorter one was cut off mid-write by something)."""
    return len(MAGIC) + _HEAD.size + meta["_header_len"] + len(keys) * KEY_BYTES + meta["payload_len"]


def _read_header(f: Any, ns: str) -> tuple[dict[str, Any], list[bytes]]:
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a KV cache file")
    raw = f.read(_HEAD.size)
    if len(raw) != _HEAD.size:
        raise ValueError("cut off in its header")
    (n,) = _HEAD.unpack(raw)
    if not 0 < n < 1 << 20:
        raise ValueError("bad header length")
    meta = json.loads(f.read(n))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("namespace") != ns:
        raise ValueError("written for another model, KV configuration or format")
    blocks, plen = meta.get("blocks"), meta.get("payload_len")
    if not isinstance(blocks, int) or not isinstance(plen, int) or not (0 < blocks <= MAX_BLOCKS and 0 < plen):
        raise ValueError("bad header")
    kb = f.read(blocks * KEY_BYTES)
    if len(kb) != blocks * KEY_BYTES or zlib.crc32(kb) != meta.get("keys_crc"):
        raise ValueError("block keys truncated or damaged")
    meta["_header_len"] = n
    return meta, [kb[i : i + KEY_BYTES] for i in range(0, len(kb), KEY_BYTES)]


def _atomic_write(path: Path, parts: bytes | list[bytes]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            for part in [parts] if isinstance(parts, bytes) else parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        log.warning("KV cache: could not remove %s", path, exc_info=True)
