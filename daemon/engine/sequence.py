"""A request inside the engine: its tokens, progress, KV blocks, timings, and the deltas it streams out."""
from __future__ import annotations

import asyncio
import enum
import itertools
import queue
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator

from .params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds a slot and KV blocks; prefilling or decoding
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Ollama's per-request figures (nanoseconds) plus what a latency benchmark needs."""

    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0  # first scheduled prompt step start -> first token
    eval_count: int = 0
    eval_duration: int = 0  # first token -> last token
    load_duration: int = 0  # filled in by the model manager
    total_duration: int = 0  # arrival -> finish
    ttft_ns: int = 0  # arrival -> first token
    itl_ns: list[int] = field(default_factory=list)  # every gap between consecutive generated tokens
    queue_ns: int = 0  # arrival -> first scheduled
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache at (first) admission
    shifts: int = 0  # context shifts: the window filled during generation and its middle was dropped
    shifted_tokens: int = 0  # tokens those shifts dropped

    def as_ollama(self) -> dict[str, int]:
        return {
            "total_duration": self.total_duration,
            "load_duration": self.load_duration,
            "prompt_eval_count": self.prompt_eval_count,
            "prompt_eval_duration": self.prompt_eval_duration,
            "eval_count": self.eval_count,
            "eval_duration": self.eval_duration,
        }


@dataclass
class Delta:
    """One streamed piece of a request's output. `metrics` and `done_reason` come only with done=True."""

    text: str
    token_ids: list[int]
    done: bool = False
    done_reason: str | None = None  # "stop" (EOS/EOG or a stop string) | "length" | "abort" | "error"
    error: str | None = None
    metrics: RequestMetrics | None = None
    logprobs: list[Any] | None = None  # logprobs.TokenLogprob per token_ids entry, when the request asked
    progress: dict[str, Any] | None = None  # a prompt progress report (no text), for requests that asked for them


_ids = itertools.count(1)


class RequestStream:
    """Thread-safe delta channel: the engine thread pushes, the caller iterates (async or sync)."""

    def __init__(self, seq_id: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self.seq_id = seq_id
        self._loop = loop
        self._aq: asyncio.Queue[Delta] | None = asyncio.Queue() if loop is not None else None
        self._q: queue.SimpleQueue[Delta] = queue.SimpleQueue()

    def push(self, delta: Delta) -> None:
        if self._loop is not None and self._aq is not None:
            try:
                self._loop.call_soon_threadsafe(self._aq.put_nowait, delta)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                pass
        else:
            self._q.put(delta)

    async def __aiter__(self) -> AsyncIterator[Delta]:
        if self._aq is None:
            raise RuntimeError("this stream was submitted without an event loop; iterate it synchronously")
        while True:
            d = await self._aq.get()
            yield d
            if d.done:
                return

    def __iter__(self) -> Iterator[Delta]:
        if self._aq is not None:
            raise RuntimeError("this stream belongs to an event loop; iterate it with `async for`")
        while True:
            d = self._q.get()
            yield d
            if d.done:
                return


class Sequence:
    """Tokens known vs tokens computed (vLLM's invariant): prefill, chunking and recompute are one mechanism."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                 stream: RequestStream | None = None, seq_id: int | None = None,
                 user: dict[str, Any] | None = None, priority: int = 0, embeds: list[Any] | None = None) -> None:
        self.seq_id = seq_id if seq_id is not None else next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.embeds = list(embeds or [])  # backends.base.EmbedSpan: prompt spans given as embeddings (images)
        self.output_ids: list[int] = []
        self.generated_before = 0  # output tokens generated before the last context shift (now in prompt_ids)
        self.params = params
        self.max_tokens = max_tokens  # context window: prompt + output may not exceed it
        self.stream = stream
        self.user = user or {}  # opaque data of the caller (model name, endpoint) for events
        self.status = Status.WAITING
        self.num_computed = 0  # tokens whose KV exists in the backend
        self.slot: int | None = None
        self.block_table: list[int] = []
        self.block_keys: list[bytes] = []  # prefix-cache keys of its full blocks (kv.BlockManager memo)
        self.num_registered = 0  # leading blocks of block_table already in the prefix cache
        self.finish_reason: str | None = None
        self.priority = priority  # lower runs sooner (vLLM's convention); 0 = normal
        self.report_progress = False  # push prompt progress reports into `stream` (engine/progress.py)
        # prefill order (scheduler.py): the uncached prompt as estimated when it was queued, how many steps in a
        # row it has been passed over, and why it waits now ((position, reason) or None while it runs)
        self.uncached_estimate = len(self.prompt_ids)
        self.skipped = 0
        self.wait: tuple[int, str] | None = None
        self.metrics = RequestMetrics(prompt_eval_count=len(self.prompt_ids))
        self.t_arrival = time.perf_counter_ns()
        self.t_first_scheduled: int | None = None
        self.t_last_token: int | None = None
        self.t_first_token: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_generated(self) -> int:
        """Output tokens generated so far, across context shifts."""
        return self.generated_before + len(self.output_ids)

    def shift(self, keep: int) -> int:
        """Ollama's context shift: of the known tokens after the first `keep`, drop half the window's worth; what is
        left becomes the prompt to recompute (the caller frees the KV). Returns the tokens dropped."""
        keep = max(0, min(keep, self.max_tokens - 1))
        discard = max((self.max_tokens - keep) // 2, 1)
        kept = self.tokens(0, keep) + self.tokens(keep + discard, self.num_tokens)
        self.generated_before += len(self.output_ids)
        self.prompt_ids, self.output_ids = kept, []
        return discard

    def tokens(self, start: int, end: int) -> list[int]:
        """Known tokens [start, end) without concatenating the whole history (this runs every step)."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n:end - n]
        return self.prompt_ids[start:] + self.output_ids[:end - n]

    def fit_chunk(self, n: int) -> int:
        """A chunk of `n` tokens from num_computed, cut so that it never splits a non-causal embedding span
        (an image whose rows attend each other both ways runs whole): before the span, or the whole span."""
        start = self.num_computed
        for e in self.embeds:
            if not e.causal and e.start < start + n < e.end:
                return e.start - start if e.start > start else e.end - start
        return n

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Exactly one token left to compute and the prompt is done: this step samples a new token."""
        return self.num_uncomputed == 1 and self.num_computed >= len(self.prompt_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, prompt={len(self.prompt_ids)}, "
                f"out={len(self.output_ids)}, computed={self.num_computed}, slot={self.slot})")
