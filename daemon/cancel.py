"""A request's cancellation flag, seen by the CPU work run for it in a worker thread (template rendering,
tokenizing), so that work for a client that has gone stops at its next checkpoint instead of running on."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class Cancelled(Exception):
    """The request this work was for has gone (its client disconnected)."""


def current() -> threading.Event | None:
    """The flag of the request this thread is working for, None outside one."""
    return getattr(_local, "flag", None)


@contextmanager
def scope(flag: threading.Event) -> Iterator[None]:
    """Run the block as work for the request whose flag this is."""
    previous = current()
    _local.flag = flag
    try:
        yield
    finally:
        _local.flag = previous


def checkpoint() -> None:
    """Raise Cancelled when the current request's flag is set."""
    flag = current()
    if flag is not None and flag.is_set():
        raise Cancelled("the client disconnected")
