"""Store paths and crash-safe writes (temp file in the same directory, fsync, os.replace, fsync dir)."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import AsyncIterable, Iterable

from .names import ModelName, format_digest, parse_digest

log = logging.getLogger(__name__)

TMP_PREFIX = ".evenflow-tmp-"  # leftovers of a crashed write carry this prefix and are ignored/cleaned
# Start-up pruning spares what may still be wanted: an unreferenced blob this recent may be an upload whose create
# has not come yet (a client uploads every shard of a model, then creates), and a temp file this recent may be a
# write in progress where file locks are not available.
PRUNE_GRACE_S = 24 * 3600
TEMP_GRACE_S = 3600

try:
    import fcntl
except ImportError:  # Windows: temp files in use are told by their age alone
    fcntl = None  # type: ignore[assignment]


def hold_lock(fd: int) -> None:
    """Mark a temp file as being written (an exclusive flock, released when the file is closed)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass


def _in_use(path: Path) -> bool:
    """A temp file some writer (this process or another daemon on the same store) still holds open."""
    if fcntl is None:
        try:
            return time.time() - path.stat().st_mtime < TEMP_GRACE_S
        except OSError:
            return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops our lock too


class DigestMismatch(ValueError):
    """Uploaded bytes do not hash to the digest they were sent under (HTTP 400 upstream)."""


def default_store_root() -> Path:
    """EVENFLOW_MODELS, else OLLAMA_MODELS, else platformdirs user_data_dir("evenflow")/models."""
    for var in ("EVENFLOW_MODELS", "OLLAMA_MODELS"):
        value = os.environ.get(var, "").strip().strip("'\"")
        if value:
            return Path(value).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("evenflow")) / "models"


def default_readonly_roots(root: Path | None = None) -> list[Path]:
    """Existing Ollama stores to read (never write): EVENFLOW_OLLAMA_STORE (os.pathsep list), else
    OLLAMA_MODELS when EVENFLOW_MODELS took precedence, plus ~/.ollama/models; only those that exist."""
    root = (root or default_store_root()).expanduser()
    candidates: list[Path] = []
    explicit = os.environ.get("EVENFLOW_OLLAMA_STORE")
    if explicit is not None:
        candidates = [Path(p).expanduser() for p in explicit.split(os.pathsep) if p.strip()]
    else:
        ollama_env = os.environ.get("OLLAMA_MODELS", "").strip().strip("'\"")
        if ollama_env:
            candidates.append(Path(ollama_env).expanduser())
        candidates.append(Path.home() / ".ollama" / "models")
    out: list[Path] = []
    for c in candidates:
        try:
            if (c / "manifests").is_dir() and not _same_dir(c, root) and all(not _same_dir(c, o) for o in out):
                out.append(c)
        except OSError:  # an unreadable home or mount is simply not a store
            continue
    return out


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def fsync_dir(path: Path) -> None:
    """Make a rename/unlink inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see either the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    hold_lock(fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(Path(tmp))
        raise
    fsync_dir(path.parent)


def _unlink_quiet(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:
        log.warning("could not remove temporary file %s", path, exc_info=True)


class StoreLayout:
    """Paths inside one store root: `manifests/<host>/<ns>/<model>/<tag>` and `blobs/sha256-<hex>`."""

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser()
        self.manifests = self.root / "manifests"
        self.blobs = self.root / "blobs"

    def manifest_path(self, name: ModelName) -> Path:
        return self.manifests.joinpath(*name.parts)

    def blob_path(self, digest: str) -> Path:
        """Path of a blob given `sha256:<hex>` (validated, so it can never leave `blobs/`)."""
        return self.blobs / f"sha256-{parse_digest(digest)}"

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def touch_blob(self, digest: str) -> bool:
        """Mark a blob as just wanted (a client checked it before a create), so start-up pruning spares it for
        PRUNE_GRACE_S; False if this store does not hold it."""
        try:
            os.utime(self.blob_path(digest))
            return True
        except OSError:
            return False

    def blob_writer(self, digest: str) -> "BlobWriter":
        return BlobWriter(self, digest)

    def write_blob(self, digest: str, chunks: Iterable[bytes]) -> bool:
        """Stream `chunks` into the blob `digest`, verifying the hash; True if created, False if present."""
        if self.has_blob(digest):
            for _ in chunks:  # drain so an HTTP body is consumed; the bytes are not needed
                pass
            return False
        writer = self.blob_writer(digest)
        try:
            for chunk in chunks:
                writer.write(chunk)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
        return True

    async def write_blob_async(self, digest: str, chunks: AsyncIterable[bytes]) -> bool:
        """Async twin of `write_blob`: file I/O runs in a worker thread, the event loop stays free."""
        if self.has_blob(digest):
            async for _ in chunks:
                pass
            return False
        writer = self.blob_writer(digest)
        try:
            async for chunk in chunks:
                await asyncio.to_thread(writer.write, chunk)
            await asyncio.to_thread(writer.commit)
        except BaseException:
            writer.abort()
            raise
        return True

    def write_blob_bytes(self, data: bytes) -> str:
        """Store `data` as a blob and return its `sha256:<hex>` digest."""
        digest = format_digest(hashlib.sha256(data).hexdigest())
        self.write_blob(digest, [data])
        return digest

    def add_blob_file(self, path: Path | str, chunk_size: int = 1 << 20) -> str:
        """Copy a local file into the store as a blob (hashing while copying); return its digest."""
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(chunk_size):
                h.update(chunk)
        digest = format_digest(h.hexdigest())

        def chunks() -> Iterable[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(chunk_size):
                    yield chunk

        self.write_blob(digest, chunks())
        return digest

    def clean_temp_files(self) -> int:
        """Remove leftovers of crashed writes (temp files no writer holds); returns how many were removed."""
        removed = 0
        for base in (self.blobs, self.manifests):
            if not base.is_dir():
                continue
            for p in base.rglob(TMP_PREFIX + "*"):
                if p.is_file() and not _in_use(p):
                    _unlink_quiet(p)
                    removed += 1
        return removed


class BlobWriter:
    """Writes one blob to a temp file while hashing; `commit` verifies and renames, `abort` deletes."""

    def __init__(self, layout: StoreLayout, digest: str):
        self.expected = parse_digest(digest)
        self.final = layout.blob_path(digest)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=self.final.parent)
        hold_lock(fd)  # another daemon starting on this store leaves an upload in progress alone
        self.tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self._file.write(chunk)
        self.size += len(chunk)

    def commit(self) -> None:
        got = self._hash.hexdigest()
        if got != self.expected:
            self.abort()
            raise DigestMismatch(f'digest mismatch, expected "sha256:{self.expected}", got "sha256:{got}"')
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        try:
            os.replace(self.tmp, self.final)
        except BaseException:
            _unlink_quiet(self.tmp)
            raise
        fsync_dir(self.final.parent)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        _unlink_quiet(self.tmp)
