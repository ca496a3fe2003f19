"""What the monitor knows, built from `/api/events` lines (and `/api/ps`, `/metrics` polls); no Textual here."""
from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass, field
from typing import Any

FADE_S = 8.0  # a finished stream stays on screen (dimmed) this long
WINDOW_S = 60.0  # latency percentiles cover the last minute
TEXT_TAIL = 400  # characters of each stream's text kept for display
MAX_STEPS = 1000
_MARKUP = re.compile(r"<\|[^|<>]{1,40}\|>|</?s>|\[/?INST\]")


# the scheduler's reasons for a prompt to wait (daemon/engine/scheduler.py WAIT_*)
WAIT_REASONS = {"slot": "no slot", "kv": "no KV", "prefill": "behind a prefill"}


@dataclass
class Stream:
    model: str
    seq_id: int
    endpoint: str = ""
    prompt_tokens: int = 0
    computed: int = 0  # prompt tokens whose KV exists (from the step events' `prefilled`)
    output_tokens: int = 0
    state: str = "queued"  # queued / ingesting / decoding / done / lost
    done_reason: str | None = None
    t_queued: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    t_done: float | None = None
    text: str = ""
    prompt: str = ""  # the rendered prompt's tail, sent once on `queued` under --log-content
    wait: str = ""  # why a queued or ingesting request got nothing lately: "#2 no slot" (its `waiting` event)

    @property
    def key(self) -> str:
        return f"{self.model}#{self.seq_id}"

    @property
    def progress(self) -> float:
        if self.state in ("decoding", "done") and self.t_first is not None:
            return 1.0
        return min(self.computed / self.prompt_tokens, 1.0) if self.prompt_tokens else 0.0

    @property
    def ttft(self) -> float | None:
        return self.t_first - self.t_queued if self.t_first is not None and self.t_queued else None

    @property
    def tok_per_s(self) -> float | None:
        if self.t_first is None or self.t_last is None or self.output_tokens < 2 or self.t_last <= self.t_first:
            return None
        return (self.output_tokens - 1) / (self.t_last - self.t_first)


@dataclass
class Step:
    time: float
    model: str
    decodes: int
    prefill_tokens: int
    step_ms: float
    target_ms: float | None
    draft_tokens: int = 0  # speculative decoding: draft tokens verified in the step
    accepted_tokens: int = 0  # ... and kept


@dataclass
class Pull:
    """A pull in progress (`pull` events): bytes summed over the layers the daemon has started so far."""

    id: int
    model: str
    status: str = ""
    completed: int = 0
    total: int = 0
    error: str | None = None
    t_done: float | None = None

    @property
    def fraction(self) -> float:
        return min(self.completed / self.total, 1.0) if self.total else 0.0


@dataclass
class ModelInfo:
    name: str
    backend: str = ""
    context_length: int = 0
    kv_total: int = 0
    kv_used: int = 0
    running: int = 0
    waiting: int = 0
    slots: int | None = None
    size: int | None = None
    expires_at: str | None = None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no data."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


@dataclass
class MonitorState:
    streams: dict[str, Stream] = field(default_factory=dict)
    steps: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_STEPS))
    models: dict[str, ModelInfo] = field(default_factory=dict)
    itl: collections.deque = field(default_factory=collections.deque)  # (time, seconds)
    ttfts: collections.deque = field(default_factory=collections.deque)  # (time, seconds)
    log_content: bool | None = None
    dropped_total: int = 0
    events: int = 0
    version: int = 0  # bumped on every change; widgets re-render only when it moved
    metrics: dict[str, float] = field(default_factory=dict)
    have_ps: bool = False
    pulls: dict[int, Pull] = field(default_factory=dict)
    steps_seen: int = 0  # step events applied (the timeline redraws only when it moved)

    # ---- feed ----
    def apply(self, ev: dict[str, Any]) -> None:
        self.events += 1
        self.version += 1
        kind = ev.get("type")
        if kind == "request":
            self._request(ev)
        elif kind == "step":
            self._step(ev)
        elif kind == "pull":
            self._pull(ev)
        elif kind == "hello":
            self.log_content = bool(ev.get("log_content"))
            self.pulls = {}  # a (re)connection: the daemon lists what is still pulling
            for p in ev.get("pulls") or []:
                self._pull(p)
            for m in ev.get("models", []):
                info = self._model(m["model"])
                info.backend, info.context_length = m.get("backend", ""), m.get("context_length", 0)
                info.kv_total, info.slots = m.get("kv_total", 0), m.get("slots")
        elif kind == "model":
            if ev.get("event") == "loaded":
                info = self._model(ev["model"])
                info.backend, info.context_length = ev.get("backend", ""), ev.get("context_length", 0)
                info.slots, info.size = ev.get("slots"), ev.get("size")
            elif ev.get("event") == "draft_loaded":  # a request's draft model, loaded beside it: ps's size grew
                self._model(ev["model"]).size = ev.get("size")
            elif ev.get("event") == "unloaded":
                self.models.pop(ev.get("model", ""), None)
        elif kind == "dropped":
            self.dropped_total = int(ev.get("total", self.dropped_total + ev.get("count", 0)))

    def _model(self, name: str) -> ModelInfo:
        if name not in self.models:
            self.models[name] = ModelInfo(name)
        return self.models[name]

    def _request(self, ev: dict[str, Any]) -> None:
        model, seq_id, t = ev.get("model", "?"), int(ev.get("seq_id", -1)), float(ev.get("time", 0.0))
        key = f"{model}#{seq_id}"
        s = self.streams.get(key)
        if s is None:
            user = ev.get("user") or {}
            s = self.streams[key] = Stream(model, seq_id, endpoint=str(user.get("endpoint", "")), t_queued=t)
        s.prompt_tokens = int(ev.get("prompt_tokens", s.prompt_tokens))
        s.output_tokens = int(ev.get("output_tokens", s.output_tokens))
        if ev.get("text"):
            s.text = (s.text + ev["text"])[-TEXT_TAIL:]
        if ev.get("prompt"):  # template markup (`<|im_start|>`...) says nothing about the request: dropped
            s.prompt = " ".join(_MARKUP.sub(" ", str(ev["prompt"])[-4 * TEXT_TAIL:]).split())[-TEXT_TAIL:]
        what = ev.get("event")
        if what == "queued":
            s.state, s.t_queued = "queued", t
        elif what == "scheduled":
            s.state, s.wait = "ingesting", ""
        elif what == "waiting":
            why = WAIT_REASONS.get(str(ev.get("reason")), str(ev.get("reason")))
            s.wait = f"#{ev.get('position', '?')} {why}"
        elif what == "first_token":
            s.state, s.t_first, s.t_last, s.wait = "decoding", t, None, ""  # its `token` event follows: no gap yet
            s.computed = s.prompt_tokens
            if s.ttft is not None:
                self.ttfts.append((t, s.ttft))
        elif what == "token":
            s.state = "decoding"
            if s.t_last is not None and t >= s.t_last:
                self.itl.append((t, t - s.t_last))
            s.t_last = t
            s.output_tokens = max(s.output_tokens, 1)
        elif what == "finished":
            s.state, s.done_reason, s.t_done = "done", ev.get("done_reason"), t

    def _pull(self, ev: dict[str, Any]) -> None:
        pid = int(ev.get("id", -1))
        p = self.pulls.get(pid)
        if p is None:
            p = self.pulls[pid] = Pull(pid, str(ev.get("model", "?")))
        p.status = str(ev.get("status", p.status))
        p.completed, p.total = int(ev.get("completed") or 0), int(ev.get("total") or 0)
        if ev.get("event") == "done":
            p.error, p.t_done = ev.get("error"), float(ev.get("time", 0.0))

    def _step(self, ev: dict[str, Any]) -> None:
        model = ev.get("model", "?")
        self.steps_seen += 1
        self.steps.append(Step(float(ev.get("time", 0.0)), model, int(ev.get("decodes", 0)),
                               int(ev.get("prefill_tokens", 0)), float(ev.get("step_ms", 0.0)), ev.get("target_ms"),
                               int(ev.get("draft_tokens") or 0), int(ev.get("accepted_tokens") or 0)))
        info = self._model(model)
        info.kv_used, info.kv_total = int(ev.get("kv_used", 0)), int(ev.get("kv_total", info.kv_total))
        info.running, info.waiting = int(ev.get("running", 0)), int(ev.get("waiting", 0))
        for seq_id, computed in ev.get("prefilled") or []:
            s = self.streams.get(f"{model}#{seq_id}")
            if s is None:  # queued before we connected: its prompt length comes with its next request event
                s = self.streams[f"{model}#{seq_id}"] = Stream(model, int(seq_id), t_queued=0.0)
            if s.state in ("queued", "ingesting", "lost"):
                s.state, s.computed, s.wait = "ingesting", int(computed), ""

    # ---- polls ----
    def apply_ps(self, models: list[dict[str, Any]]) -> None:
        self.have_ps = True
        self.version += 1
        seen = set()
        for m in models:
            name = m.get("name") or m.get("model", "?")
            seen.add(name)
            info = self._model(name)
            info.size = m.get("size", info.size)
            info.expires_at = m.get("expires_at")
            info.context_length = m.get("context_length", info.context_length) or info.context_length
        for name in [n for n in self.models if n not in seen]:
            del self.models[name]  # unloaded while we were not watching (or we missed the event)

    def apply_metrics(self, metrics: dict[str, float]) -> None:
        self.metrics = metrics
        self.version += 1

    def disconnected(self, now: float) -> None:
        """The feed broke: what was running can no longer be followed (a later event for it revives it)."""
        for s in self.streams.values():
            if s.state != "done":
                s.state, s.t_done = "lost", now
        for p in self.pulls.values():
            if p.t_done is None:
                p.error, p.t_done = "lost the daemon", now
        self.version += 1

    # ---- views ----
    def prune(self, now: float) -> None:
        """Drop faded streams and samples older than the window."""
        gone = [k for k, s in self.streams.items() if s.t_done is not None and now - s.t_done > FADE_S]
        for k in gone:
            del self.streams[k]
        ended = [k for k, p in self.pulls.items() if p.t_done is not None and now - p.t_done > FADE_S]
        for k in ended:
            del self.pulls[k]
        for dq in (self.itl, self.ttfts):
            while dq and now - dq[0][0] > WINDOW_S:
                dq.popleft()
        if gone or ended:
            self.version += 1

    def latency(self) -> dict[str, float | None]:
        """P50/P99 inter-token gap and TTFT (seconds) over the last minute."""
        itl, ttft = [v for _, v in self.itl], [v for _, v in self.ttfts]
        return {"itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99),
                "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99)}

    def speculation(self, now: float) -> dict[str, float] | None:
        """Over the last minute's steps: draft tokens kept / verified, and tokens per decode pass (None: no drafts)."""
        recent = [s for s in self.steps if now - s.time <= WINDOW_S]
        drafted = sum(s.draft_tokens for s in recent)
        if not drafted:
            return None
        accepted, decodes = sum(s.accepted_tokens for s in recent), sum(s.decodes for s in recent)
        return {"acceptance": accepted / drafted, "tokens_per_forward": (decodes + accepted) / max(decodes, 1)}

    def totals(self) -> dict[str, int]:
        """KV blocks, queue and running summed over loaded models (from the steps; /metrics when idle)."""
        ms = self.models.values()
        kv_used = sum(m.kv_used for m in ms)
        kv_total = sum(m.kv_total for m in ms) or int(self.metrics.get("evenflow_kv_blocks_total", 0))
        return {"kv_used": kv_used, "kv_total": kv_total, "running": sum(m.running for m in ms),
                "waiting": sum(m.waiting for m in ms)}
