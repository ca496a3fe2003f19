"""Blob downloads for pulls: ranged parts into a `-partial` file, resumable, sha256-verified, shared by pullers.

As Ollama's server/download.go: the data goes to `blobs/sha256-<hex>-partial`, each part's progress to
`sha256-<hex>-partial-<N>` (JSON `{"N","Offset","Size","Completed"}`), so an interrupted pull asks only for
the bytes it lacks; the file is hashed before it is renamed to its final name, and two pulls of one blob
share one download. A download stops once no puller waits for it (its clients all left), keeping its parts for
the next pull, as Ollama's `release()` cancels a blob download whose last reference is gone.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from .layout import StoreLayout, fsync_dir
from .names import parse_digest

log = logging.getLogger(__name__)

MIN_PART, MAX_PART, MAX_PARTS = 100 * 1000 * 1000, 1000 * 1000 * 1000, 16
RETRIES, BACKOFF_S = 3, 0.25


class DownloadCancelled(Exception):
    """Every puller of this blob left; the bytes fetched so far stay in the part files."""


class DownloadError(Exception):
    """A blob could not be downloaded or verified; the message is what the user sees."""


@dataclass
class Part:
    n: int
    offset: int
    size: int
    completed: int = 0

    def to_json(self) -> dict[str, int]:
        return {"N": self.n, "Offset": self.offset, "Size": self.size, "Completed": self.completed}


def plan_parts(total: int, part_size: int | None = None) -> list[Part]:
    """Ollama's split: total/16 clamped to 100 MB..1000 MB (or `part_size`), in order."""
    size = part_size or min(max(total // MAX_PARTS, MIN_PART), MAX_PART)
    return [Part(i, off, min(size, total - off)) for i, off in enumerate(range(0, total, size))] or [Part(0, 0, 0)]


class BlobDownload:
    """One blob being fetched; pullers watch `completed` and wait on `done`."""

    def __init__(self, layout: StoreLayout, digest: str, total: int, url_for: Callable[[], str],
                 part_size: int | None, headers: dict[str, str]):
        self.digest, self.total = digest, total
        self.final = layout.blob_path(digest)
        self.partial = self.final.with_name(self.final.name + "-partial")
        self._url_for, self._part_size, self._headers = url_for, part_size, headers
        self._lock = threading.Lock()
        self.parts: list[Part] = []
        self.done = threading.Event()
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self._refs = 0  # pullers waiting on it

    def acquire(self) -> bool:
        """One more puller; False once it was cancelled (the caller starts a new download)."""
        with self._lock:
            if self.cancelled.is_set():
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        """A puller is done with it; the last one to leave before the end cancels it."""
        with self._lock:
            self._refs -= 1
            if self._refs == 0 and not self.done.is_set():
                self.cancelled.set()

    @property
    def completed(self) -> int:
        with self._lock:
            return sum(p.completed for p in self.parts)

    def _part_file(self, part: Part) -> Path:
        return self.partial.with_name(f"{self.partial.name}-{part.n}")

    def _load_parts(self) -> list[Part]:
        """Resume from the part files of an earlier attempt when they describe this blob's layout."""
        planned = plan_parts(self.total, self._part_size)
        if not self.partial.is_file():
            return planned
        found = []
        for i in range(len(planned)):
            try:
                obj = json.loads(self._part_file(planned[i]).read_text())
                found.append(Part(int(obj["N"]), int(obj["Offset"]), int(obj["Size"]), int(obj["Completed"])))
            except (OSError, ValueError, KeyError, TypeError):
                break
        layout_ok = len(found) == len(planned) and all(
            (f.n, f.offset, f.size) == (p.n, p.offset, p.size) and 0 <= f.completed <= f.size
            for f, p in zip(found, planned))
        return found if layout_ok else planned

    def _save(self, part: Part) -> None:
        tmp = self._part_file(part).with_suffix(".tmp")
        tmp.write_text(json.dumps(part.to_json()))
        os.replace(tmp, self._part_file(part))

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - handed to every waiting puller
            self.error = e
        finally:
            self.done.set()

    def _run(self) -> None:
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        parts = self._load_parts()
        with self._lock:
            self.parts = parts
        resumed = sum(p.completed for p in parts)
        if resumed:
            log.info("resuming %s at %d of %d bytes", self.digest, resumed, self.total)
        fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, self.total)
            for p in parts:
                self._save(p)
            url = self._url_for()
            todo = [p for p in parts if p.completed < p.size]
            with httpx.Client(timeout=httpx.Timeout(30.0), follow_redirects=True) as client:
                with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARTS, len(todo)))) as pool:
                    for fut in [pool.submit(self._fetch_part, client, url, fd, p) for p in todo]:
                        fut.result()
            os.fsync(fd)
        finally:
            os.close(fd)
        self._verify_and_commit(parts)

    def _fetch_part(self, client: httpx.Client, url: str, fd: int, part: Part) -> None:
        for attempt in range(RETRIES + 1):
            try:
                start = part.offset + part.completed
                end = part.offset + part.size - 1
                headers = {**self._headers, "Range": f"bytes={start}-{end}"}
                with client.stream("GET", url, headers=headers) as r:
                    if r.status_code not in (200, 206):
                        raise DownloadError(f"{r.status_code}: {r.read().decode(errors='replace')[:200]}")
                    if r.status_code == 200 and start != 0:  # the server ignored Range: skip what we have
                        raise DownloadError(f"{url} ignored the Range header")
                    for chunk in r.iter_bytes():  # as received: a dropped connection keeps every byte that came
                        room = part.size - part.completed
                        chunk = chunk[:room]
                        os.pwrite(fd, chunk, part.offset + part.completed)
                        with self._lock:
                            part.completed += len(chunk)
                        if part.completed >= part.size:
                            break
                        if self.cancelled.is_set():
                            raise DownloadCancelled(f"{self.digest}: no puller waits for it")
                if part.completed < part.size:
                    raise DownloadError(f"connection closed after {part.completed} of {part.size} bytes")
                return
            except (httpx.HTTPError, DownloadError) as e:
                if self.cancelled.is_set():
                    raise DownloadCancelled(f"{self.digest}: no puller waits for it") from e
                if attempt == RETRIES:
                    raise DownloadError(f"max retries exceeded: {e}") from e
                log.warning("part %d of %s: %s; retrying", part.n, self.digest, e)
                time.sleep(BACKOFF_S * 2 ** attempt)
            finally:
                self._save(part)

    def _verify_and_commit(self, parts: list[Part]) -> None:
        h = hashlib.sha256()
        with open(self.partial, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        want = parse_digest(self.digest)
        if h.hexdigest() != want:
            self._discard(parts)
            raise DownloadError(f"digest mismatch, file must be downloaded again: want sha256:{want}, "
                                f"got sha256:{h.hexdigest()}")
        os.replace(self.partial, self.final)
        for p in parts:
            self._part_file(p).unlink(missing_ok=True)
        fsync_dir(self.final.parent)

    def _discard(self, parts: list[Part]) -> None:
        self.partial.unlink(missing_ok=True)
        for p in parts:
            self._part_file(p).unlink(missing_ok=True)


class DownloadManager:
    """At most one BlobDownload per digest: a second puller of the same blob joins the first."""

    def __init__(self, layout: StoreLayout, part_size: int | None = None):
        self.layout = layout
        self.part_size = part_size  # None: Ollama's split; tests set a small size to exercise ranged parts
        self._lock = threading.Lock()
        self._active: dict[str, BlobDownload] = {}
        self.started = 0  # downloads begun (a joined one is not counted again)

    def active(self) -> list[BlobDownload]:
        with self._lock:
            return list(self._active.values())

    def get(self, digest: str, total: int, url_for: Callable[[], str],
            headers: dict[str, str] | None = None) -> BlobDownload:
        """The download of `digest`, joined or started, with the caller counted as one of its pullers: pass it to
        `wait_download`-style code that calls `release()` when it stops waiting."""
        while True:
            with self._lock:
                dl = self._active.get(digest)
                if dl is None:
                    dl = BlobDownload(self.layout, digest, total, url_for, self.part_size, headers or {})
                    dl.acquire()
                    self._active[digest] = dl
                    self.started += 1
                    break
                if dl.acquire():
                    return dl
            dl.done.wait()  # cancelled and still stopping: its part files are ours once it has
            with self._lock:
                if self._active.get(digest) is dl:
                    del self._active[digest]

        def run() -> None:
            try:
                dl.run()
            finally:
                with self._lock:
                    if self._active.get(digest) is dl:
                        del self._active[digest]

        threading.Thread(target=run, name=f"pull-{digest[7:19]}", daemon=True).start()
        return dl
