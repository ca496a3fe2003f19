"""The bounded worker pool that runs a request's CPU work (parsing, template rendering, tokenizing) off the event
loop, and stops it when the client goes away (the work checks the request's cancellation flag at its steps)."""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from fastapi import Request

from .. import cancel
from .errors import CLIENT_GONE, APIError

log = logging.getLogger(__name__)
T = TypeVar("T")

WATCH_TASK = "evenflow-prepare-watch"  # the name of the task that watches for a disconnect during prepare


def pool_size(cpus: int | None = None) -> int:
    """Half the machine's cores, 2 to 8: enough that one slow request does not queue the others, few enough that
    the engine thread keeps its cores."""
    return max(2, min(8, (cpus or os.cpu_count() or 2) // 2))


class WorkerPool:
    """A fixed-size thread pool; `run` awaits a function in it, or gives up when the client disconnects."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size or pool_size()
        self._ex = ThreadPoolExecutor(self.size, thread_name_prefix="evenflow-prepare")
        self._lock = threading.Lock()
        self.running = 0  # functions executing in the pool right now (abandoned ones included until they end)
        self.cancelled = 0  # functions that stopped at a checkpoint because their client had gone

    def _tracked(self, flag: threading.Event, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            self.running += 1
        try:
            with cancel.scope(flag):
                return fn(*args)
        except cancel.Cancelled:
            with self._lock:
                self.cancelled += 1
            raise
        finally:
            with self._lock:
                self.running -= 1

    async def run(self, request: Request | None, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the pool. A client gone while it waits or runs: the work is cancelled if not started,
        stopped at its next checkpoint if it was, and the request ends with 499."""
        flag = threading.Event()
        fut = asyncio.get_running_loop().run_in_executor(self._ex, self._tracked, flag, fn, *args)
        if request is None:
            return await fut
        gone = asyncio.create_task(_disconnected(request), name=WATCH_TASK)
        try:
            done, _ = await asyncio.wait({fut, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            flag.set()
            fut.cancel()
            raise
        finally:
            gone.cancel()
        if fut in done:
            return fut.result()
        flag.set()  # running: it stops at its next checkpoint (a template step, before tokenizing)
        fut.cancel()  # not started yet: never runs
        raise APIError(CLIENT_GONE, "the client disconnected")

    def shutdown(self) -> None:
        self._ex.shutdown(wait=False, cancel_futures=True)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (http.disconnect), after the body has been read."""
    while True:
        msg = await request.receive()
        if msg.get("type") == "http.disconnect":
            return
