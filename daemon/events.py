"""The event hub: what the engines, the model manager and the API publish (any thread) fanned out to /api/events
subscribers on the event loop, coalesced and bounded per reader. The route that streams it is api/http/event_routes.py."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Iterator

log = logging.getLogger(__name__)

QUEUE_SIZE = 1024  # per subscriber; a reader this far behind loses events (counted), the engine never waits
# Events reach the loop in batches, at most this often: a decoding stream publishes two per token (its token and
# the step), and a loop wake-up, a GIL hand-over and a socket write for each took 28% of single-stream decode on
# 2 cores (issue 40). 20 per second is what a monitor draws anyway; each event keeps its own time.
FLUSH_EVERY_S = 0.05
PULL_EVERY_S = 0.25  # a pull's progress event at most this often (its HTTP client gets Ollama's 60 ms ticks)
_CONTENT_KEYS = ("text", "prompt")


class EventHub:
    """Fans engine events (any thread) out to /api/events subscribers on the event loop, bounded per reader."""

    def __init__(self, log_content: bool, on_drop=None) -> None:
        self.log_content = log_content
        self.on_drop = on_drop
        self.loop: asyncio.AbstractEventLoop | None = None
        self._subs: list[_Subscriber] = []
        self._pulls: dict[int, dict[str, Any]] = {}  # id -> the pull's last progress (for hello)
        self._pull_lock = threading.Lock()
        self._pull_ids = 0
        self._batch_lock = threading.Lock()
        self._batch: list[dict[str, Any]] = []  # shaped events not yet handed to the loop
        self._armed = False  # a flush is scheduled on the loop

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def publish(self, event: dict[str, Any]) -> None:
        """Any thread: queued for the next flush (one hop onto the loop per FLUSH_EVERY_S, not per event);
        nothing done when nobody listens."""
        if not self._subs or self.loop is None:
            return
        ev = self._shape(event)
        with self._batch_lock:
            self._batch.append(ev)
            if self._armed:
                return
            self._armed = True
        try:
            self.loop.call_soon_threadsafe(self.loop.call_later, FLUSH_EVERY_S, self._flush)
        except RuntimeError:  # loop closed during shutdown: nothing will read them
            with self._batch_lock:
                self._batch, self._armed = [], False

    def _shape(self, event: dict[str, Any]) -> dict[str, Any]:
        """Content only under log_content, and a request's prompt once (on `queued`), not with every token."""
        ev = event if self.log_content else {k: v for k, v in event.items() if k not in _CONTENT_KEYS}
        user = ev.get("user")
        if isinstance(user, dict) and any(k in user for k in _CONTENT_KEYS):
            ev = dict(ev)
            ev["user"] = {k: v for k, v in user.items() if k not in _CONTENT_KEYS}
            if self.log_content and ev.get("event") == "queued" and "prompt" in user:
                ev["prompt"] = user["prompt"]
        return ev

    def _flush(self) -> None:
        with self._batch_lock:
            batch, self._batch, self._armed = self._batch, [], False
        for sub in self._subs:
            for ev in batch:
                sub.offer(ev, self.on_drop)

    def subscribe(self) -> "_Subscriber":
        sub = _Subscriber()
        self._subs = self._subs + [sub]
        return sub

    def unsubscribe(self, sub: "_Subscriber") -> None:
        self._subs = [s for s in self._subs if s is not sub]

    # ---- pulls ----
    def pulls(self) -> list[dict[str, Any]]:
        """The pulls in progress (their last progress), for a new reader's hello."""
        with self._pull_lock:
            return [dict(p) for p in self._pulls.values()]

    def track_pull(self, name: str, steps: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Pass a pull's progress lines through, publishing `pull` events: start, progress (bytes), done."""
        with self._pull_lock:
            self._pull_ids += 1
            info: dict[str, Any] = {"id": self._pull_ids, "model": name, "status": "starting", "completed": 0,
                                    "total": 0}
            self._pulls[info["id"]] = info
        layers: dict[str, tuple[int, int]] = {}  # digest -> (completed, total): bytes are summed over layers
        sizes: dict[str, int] = getattr(steps, "sizes", {})  # every blob's size, once a manifest is read
        error: str | None = "the client disconnected"
        self._publish_pull("start", info)
        last = time.monotonic()
        try:
            for item in steps:
                with self._pull_lock:
                    info["status"] = str(item.get("status", info["status"]))
                    if item.get("digest") and item.get("total"):
                        layers[item["digest"]] = (int(item.get("completed") or 0), int(item["total"]))
                        info["completed"] = sum(c for c, _ in layers.values())
                    if sizes or layers:  # the whole pull's size once known, so the percentage never steps back
                        info["total"] = sum(sizes.values()) or sum(t for _, t in layers.values())
                if time.monotonic() - last >= PULL_EVERY_S:
                    last = time.monotonic()
                    self._publish_pull("progress", info)
                yield item
            error = None
        except Exception as e:  # noqa: BLE001 - reported, then handed on to the HTTP response
            error = str(e) or type(e).__name__
            raise
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
            with self._pull_lock:
                self._pulls.pop(info["id"], None)
            self._publish_pull("done", {**info, "error": error})

    def _publish_pull(self, event: str, info: dict[str, Any]) -> None:
        with self._pull_lock:
            ev = {"type": "pull", "event": event, "time": time.time(), **info}
        self.publish(ev)


class _Subscriber:
    """One reader's pending events (at most QUEUE_SIZE), taken all at once."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.ready = asyncio.Event()
        self.dropped = 0
        self._reported = 0

    def offer(self, ev: dict[str, Any], on_drop) -> None:
        if len(self.pending) >= QUEUE_SIZE:
            self.dropped += 1
            if on_drop is not None:
                on_drop()
            return
        self.pending.append(ev)
        self.ready.set()

    def take(self) -> list[dict[str, Any]]:
        events, self.pending = self.pending, []
        self.ready.clear()
        return events

    def drop_notice(self) -> dict[str, Any] | None:
        if self.dropped > self._reported:
            n, self._reported = self.dropped - self._reported, self.dropped
            return {"type": "dropped", "time": time.time(), "count": n, "total": self.dropped}
        return None
