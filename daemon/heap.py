"""Handing freed heap memory back to the system. glibc keeps what a burst of large requests freed (a 4 MB prompt's
text and ids, a 32 MB body) in its per-thread arenas, so RSS climbs in steps and stays up although nothing is
leaked (a soak's tracemalloc diff shows no growth); malloc_trim(0) returns those pages. No-op off glibc."""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from typing import Callable

log = logging.getLogger(__name__)

TRIM_EVERY_S = 30.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to call
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim() -> bool:
    """Return free heap pages to the system now; True if glibc released any."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False


async def trim_periodically(every: float = TRIM_EVERY_S) -> None:
    """Trim every `every` seconds, off the event loop (a trim walks every arena: milliseconds on a large heap)."""
    if _malloc_trim() is None:
        return
    while True:
        await asyncio.sleep(every)
        try:
            await asyncio.to_thread(trim)
        except Exception:  # noqa: BLE001 - trimming is an optimisation; the daemon serves without it
            log.debug("malloc_trim failed", exc_info=True)
