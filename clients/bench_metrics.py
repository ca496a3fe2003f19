"""Serving metrics as vLLM's benchmark defines them (TTFT, TPOT, ITL, E2EL, goodput) plus stall windows."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestRecord:
    """One request's timeline; every time is seconds since the benchmark's t0 (perf_counter based)."""

    rid: int
    kind: str  # "stream" / "long" in the stall scenario, "request" in poisson
    prompt_len_target: int
    output_len: int
    start: float = math.nan
    token_times: list[float] = field(default_factory=list)  # arrival of every chunk with non-empty text
    end: float | None = None  # last byte of a stream that finished normally
    prompt_tokens: int | None = None  # as reported by the server
    server_output_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache (OpenAI usage)
    ok: bool = False  # the server ended the stream itself
    stopped: bool = False  # the bench closed it on purpose (stall streams after the window) or at the deadline
    error: str | None = None
    done_reason: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def itls(self) -> list[float]:
        """Every gap between consecutive streamed chunks (vLLM: per chunk, not per token)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def output_tokens(self) -> int:
        """The server's count when it sent one, else the number of chunks with text."""
        if self.server_output_tokens is not None:
            return self.server_output_tokens
        return len(self.token_times)

    @property
    def e2el(self) -> float | None:
        return self.end - self.start if self.ok and self.end is not None else None

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1); a stopped stream's latency ends at its last chunk."""
        n, ttft = self.output_tokens, self.ttft
        if n < 2 or ttft is None:
            return None
        last = self.end if self.ok and self.end is not None else self.token_times[-1]
        return (last - self.start - ttft) / (n - 1)

    @property
    def max_itl(self) -> float | None:
        gaps = self.itls
        return max(gaps) if gaps else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ttft=self.ttft, tpot=self.tpot, e2el=self.e2el, output_tokens=self.output_tokens)
        return d


def percentile(values: Iterable[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats_ms(values_s: Iterable[float]) -> dict[str, float | int | None]:
    """count, mean, p50, p90, p99, max of seconds, reported in milliseconds (None when empty)."""
    ms = [v * 1000.0 for v in values_s]
    out: dict[str, float | int | None] = {"count": len(ms)}
    if not ms:
        out.update({"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None})
        return out
    out["mean"] = sum(ms) / len(ms)
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(ms, p)
    out["max"] = max(ms)
    return out


def parse_slo(spec: str | None) -> dict[str, float]:
    """'ttft=500,itl=150' (milliseconds) -> {'ttft': 500.0, 'itl': 150.0}."""
    if not spec:
        return {}
    slo: dict[str, float] = {}
    for part in spec.split(","):
        key, sep, val = part.strip().partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"bad SLO item {part!r}: expected KEY=MS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            ms = float(val)
        except ValueError:
            raise ValueError(f"bad SLO value {val!r} for {key}: expected milliseconds") from None
        if ms <= 0:
            raise ValueError(f"SLO {key} must be > 0 ms, got {ms}")
        slo[key] = ms
    return slo


def meets_slo(rec: RequestRecord, slo: dict[str, float]) -> bool:
    """DistServe/vLLM goodput test; `itl` is checked on the request's WORST gap, so one stall fails it."""
    if rec.error is not None or not (rec.ok or rec.stopped):
        return False
    values = {"ttft": rec.ttft, "tpot": rec.tpot, "itl": rec.max_itl, "e2el": rec.e2el}
    for key, limit_ms in slo.items():
        v = values[key]
        if key in ("tpot", "itl") and v is None and rec.ttft is not None:
            continue  # a single-token answer has no gaps to violate
        if v is None or v * 1000.0 > limit_ms:
            return False
    return True


def summarize(records: list[RequestRecord], duration_s: float, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """The vLLM benchmark set over `records` served in `duration_s` seconds."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    completed = [r for r in records if r.ok]
    served = [r for r in records if r.ok or (r.stopped and r.error is None)]
    out_tokens = sum(r.output_tokens for r in served)
    in_tokens = sum(r.prompt_tokens or 0 for r in served)
    summary: dict[str, Any] = {
        "requests": len(records),
        "completed": len(completed),
        "stopped": sum(1 for r in records if r.stopped and r.error is None),
        "failed": sum(1 for r in records if r.error is not None),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(completed) / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "ttft_ms": stats_ms(r.ttft for r in served if r.ttft is not None),
        "tpot_ms": stats_ms(r.tpot for r in served if r.tpot is not None),
        "itl_ms": stats_ms(g for r in served for g in r.itls),
        "e2el_ms": stats_ms(r.e2el for r in completed if r.e2el is not None),
    }
    if slo:
        good = sum(1 for r in served if meets_slo(r, slo))
        summary["slo_ms"] = dict(slo)
        summary["good_requests"] = good
        summary["goodput"] = good / duration_s
        summary["good_fraction"] = good / len(records) if records else 0.0
    return summary


def window_gaps(records: Iterable[RequestRecord], t0: float, t1: float, overlap: bool) -> list[float]:
    """Gaps inside [t0, t1]; with overlap=True every gap that overlaps the open window (t0, t1) counts."""
    gaps: list[float] = []
    for r in records:
        t = r.token_times
        for a, b in zip(t, t[1:]):
            inside = (b > t0 and a < t1) if overlap else (a >= t0 and b <= t1)
            if inside:
                gaps.append(b - a)
    return gaps


def stall_windows(streams: list[RequestRecord], before_start: float, long_send: float,
                  long_first_token: float, after_end: float) -> dict[str, Any]:
    """Stream gaps BEFORE the long prompt arrives vs WHILE it is prefilled (send -> its first token) vs after.

    A gap belongs to `during` when it overlaps the ingestion window at all: the stall gap that starts just before
    the long prompt is sent and ends after its prefill is exactly the one to catch. `before` and `after` take only
    gaps fully inside their window.
    """
    if not before_start <= long_send <= long_first_token <= after_end:
        raise ValueError(f"windows out of order: before_start={before_start} long_send={long_send} "
                         f"long_first_token={long_first_token} after_end={after_end}")
    before = window_gaps(streams, before_start, long_send, overlap=False)
    during = window_gaps(streams, long_send, long_first_token, overlap=True)
    after = window_gaps(streams, long_first_token, after_end, overlap=False)
    out: dict[str, Any] = {
        "before_s": [before_start, long_send],
        "during_s": [long_send, long_first_token],
        "after_s": [long_first_token, after_end],
        "before_ms": stats_ms(before),
        "during_ms": stats_ms(during),
        "after_ms": stats_ms(after),
        "ingest_ms": (long_first_token - long_send) * 1000.0,
    }
    b50, dmax = out["before_ms"]["p50"], out["during_ms"]["max"]
    # How much worse the worst gap during ingestion is than a typical gap before it: ~1 means no stall.
    out["stall_ratio"] = dmax / b50 if b50 and dmax is not None else None
    out["streams_through_window"] = sum(
        1 for r in streams if r.token_times and r.token_times[-1] >= long_first_token)
    return out
