"""How much work one template render may do: steps, output characters, and the size of any one value it builds.
A request may carry its own template (`/api/generate`'s `template`), so a loop of loops, or one call that would
build a gigabyte (`printf "%999999999s"`, `"x"|center(10**9)`), must end in a clear error, not hold a worker."""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ... import cancel
from .template_error import TemplateError

MAX_STEPS = 500_000  # real chat templates take well under 1,000 per message
MAX_OUTPUT = 64 * 2**20  # characters: a prompt this long is far past any context window anyway
MAX_ITEMS = 1_000_000  # items in one list or map a template builds (a chat has far fewer messages)
# Templates are cached by their text; real ones are under 20 KB. A request's own template can be megabytes, and
# 64 cached 1 MB templates held ~3 GB (their text and parsed nodes) for the daemon's life: those are not cached.
MAX_CACHED_CHARS = 64 * 1024

T = TypeVar("T")


def cache_small(maxsize: int) -> Callable[[Callable[[str], T]], Callable[[str], T]]:
    """`functools.lru_cache(maxsize)` for a function of one template text, skipped for texts over
    MAX_CACHED_CHARS (those are worked out again on each use)."""
    def wrap(fn: Callable[[str], T]) -> Callable[[str], T]:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(text: str) -> T:
            return cached(text) if len(text) <= MAX_CACHED_CHARS else fn(text)

        call.cache_clear, call.cache_info = cached.cache_clear, cached.cache_info  # type: ignore[attr-defined]
        return call
    return wrap


class TemplateBudgetExceeded(TemplateError):
    """The render took more steps or wrote more text than its budget allows (HTTP 400 upstream)."""


class TemplateCancelled(TemplateError, cancel.Cancelled):
    """The request this render was for has gone; the render stopped at a step."""


@dataclass
class Budget:
    """Counters for one render (every execution of a multi-turn chat shares one), and the flag of the request it
    runs for (set when its client disconnects: the next step stops the render)."""

    max_steps: int = MAX_STEPS
    max_output: int = MAX_OUTPUT
    steps: int = 0
    output: int = 0
    cancel: threading.Event | None = field(default_factory=cancel.current)

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise TemplateBudgetExceeded(f"template execution exceeded its budget of {self.max_steps} steps "
                                         f"(a loop too large?)")
        if self.cancel is not None and self.cancel.is_set():
            raise TemplateCancelled("the client disconnected")

    def emit(self, n: int) -> None:
        self.output += n
        if self.output > self.max_output:
            raise TemplateBudgetExceeded(f"template output exceeded its budget of {self.max_output} characters")


def size_of(v: Any, limit: int = MAX_OUTPUT, unpack: Callable[[Any], Any] | None = None) -> int:
    """At least the characters `v` takes printed (a string's length, a list's items and separators, ...), counted
    without printing it and only until past `limit`. `unpack(x)` gives what other objects print (None: a name)."""
    total, stack = 0, [v]
    while stack and total <= limit:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x)
        elif isinstance(x, bool) or x is None:
            total += 5
        elif isinstance(x, int):
            total += x.bit_length() // 3 + 2
        elif isinstance(x, float):
            total += 24
        elif isinstance(x, (bytes, bytearray)):
            total += 4 * len(x) + 3
        elif isinstance(x, dict):
            total += 2 + 4 * len(x)
            if total <= limit:
                stack.extend(x.keys())
                stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(x)
            if total <= limit:
                stack.extend(x)
        else:
            inner = unpack(x) if unpack is not None else None
            total += 16
            if inner is not None:
                stack.append(inner)
    return total


def check_size(n: int, what: str, limit: int = MAX_OUTPUT) -> None:
    """TemplateBudgetExceeded naming `what` when it would build `n` > `limit` characters (or items)."""
    if n > limit:
        raise TemplateBudgetExceeded(f"{what} would build a value of over {limit} characters or items")
