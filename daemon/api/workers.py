"""The bounded worker pool that runs a request's CPU work (parsing, template rendering, tokenizing) off the event
loop, and abandons it when the client goes away."""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from fastapi import Request

from .errors import APIError

log = logging.getLogger(__name__)
T = TypeVar("T")

WATCH_TASK = "evenflow-prepare-watch"  # the name of the task that watches for a disconnect during prepare
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads it, but logs and metrics say what happened


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

    def _tracked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            self.running += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self.running -= 1

    async def run(self, request: Request | None, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the pool. A client gone while it waits or runs: the work is cancelled if not started,
        its result dropped if it was, and the request ends with 499."""
        fut = asyncio.get_running_loop().run_in_executor(self._ex, self._tracked, fn, *args)
        if request is None:
            return await fut
        gone = asyncio.create_task(_disconnected(request), name=WATCH_TASK)
        try:
            done, _ = await asyncio.wait({fut, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        finally:
            gone.cancel()
        if fut in done:
            return fut.result()
        fut.cancel()  # not started yet: never runs; running: its result is dropped
        fut.add_done_callback(_drop_result)
        raise APIError(CLIENT_GONE, "the client disconnected")

    def shutdown(self) -> None:
        self._ex.shutdown(wait=False, cancel_futures=True)


def _drop_result(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("abandoned work failed: %s", fut.exception())


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (http.disconnect), after the body has been read."""
    while True:
        msg = await request.receive()
        if msg.get("type") == "http.disconnect":
            return
