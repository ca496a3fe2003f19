"""`evenflow bench`: a load generator for any Ollama- or OpenAI-compatible server (stall, poisson, sweep).

Library use (the CLI is `bench_cli.py`; tables, JSON and PNG are in `bench_report.py`):

    res = await run_stall("http://127.0.0.1:8080", "openai-completions", None, n_streams=4, prompt_len=2048)
    res.windows["during_ms"]["max"], res.long.ttft, res.summary["itl_ms"]["p99"], res.to_dict()
"""
from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx

from ..link.connect import auth_headers
from .bench_http import (ProgressFn, check_target, detect_model, make_prompt, normalize_protocol, stream_request,
                         wants_ignore_eos)
from .bench_metrics import RequestRecord, stall_windows, summarize

log = logging.getLogger(__name__)

# Hard caps: whatever the caller asks, one run sends at most this many requests and stops after this long.
MAX_REQUESTS_CAP = 10_000
MAX_DURATION_CAP_S = 3600.0
DEFAULT_DURATION_S = 300.0
DEFAULT_MAX_REQUESTS = 1000


@dataclass
class Calibration:
    """Prompt tokens ≈ overhead + tokens_per_word × words, fitted from probe requests on the real server."""

    overhead: float
    tokens_per_word: float
    probes: list[tuple[int, int]] = field(default_factory=list)  # (words, measured prompt tokens)
    target_tokens: int | None = None
    target_seed: int | None = None
    target_words: int | None = None  # words that give target_tokens with target_seed's word sequence

    def words_for(self, tokens: int, seed: int | None = None) -> int:
        """Words for `tokens`; exact-as-measured for the calibrated target (same seed), the linear fit otherwise."""
        if seed is not None and seed == self.target_seed and tokens == self.target_tokens and self.target_words:
            return self.target_words
        return max(1, round((tokens - self.overhead) / self.tokens_per_word))

    def to_dict(self) -> dict[str, Any]:
        return {"overhead": self.overhead, "tokens_per_word": self.tokens_per_word, "probes": self.probes,
                "target_tokens": self.target_tokens, "target_words": self.target_words}


@dataclass
class BenchResult:
    """Records plus the vLLM summary; `to_dict()` is the JSON written by --json."""

    scenario: str
    config: dict[str, Any]
    records: list[RequestRecord]
    summary: dict[str, Any]
    calibration: Calibration | None = None
    truncated: bool = False  # the duration cap ended the run early
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "config": self.config, "summary": self.summary,
                "calibration": self.calibration.to_dict() if self.calibration else None,
                "truncated": self.truncated, "warnings": self.warnings,
                "requests": [r.to_dict() for r in self.records]}


@dataclass
class StallResult(BenchResult):
    """The stall scenario: the windows before/during/after the long prompt's prefill, and its TTFT."""

    windows: dict[str, Any] | None = None
    long_send: float | None = None
    long_first_token: float | None = None

    @property
    def long(self) -> RequestRecord:
        return next(r for r in self.records if r.kind == "long")

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        long = self.long
        d["stall"] = {"windows": self.windows, "long_send_s": self.long_send,
                      "long_first_token_s": self.long_first_token,
                      "long_ttft_ms": long.ttft * 1000.0 if long.ttft is not None else None,
                      "long_prompt_tokens": long.prompt_tokens, "long_prompt_target": long.prompt_len_target}
        return d


@dataclass
class SweepResult:
    """One run per value of one client-side parameter."""

    scenario: str
    param: str
    values: list[Any]
    runs: list[BenchResult]

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": "sweep", "sweep": {"scenario": self.scenario, "param": self.param,
                                               "values": self.values},
                "runs": [r.to_dict() for r in self.runs]}


def _check_bounds(n_requests: int, max_requests: int, duration: float) -> None:
    if not 1 <= max_requests <= MAX_REQUESTS_CAP:
        raise ValueError(f"max_requests must be in [1, {MAX_REQUESTS_CAP}], got {max_requests}")
    if not 0 < duration <= MAX_DURATION_CAP_S:
        raise ValueError(f"duration must be in (0, {MAX_DURATION_CAP_S:g}] seconds, got {duration}")
    if n_requests > max_requests:
        raise ValueError(f"this run needs {n_requests} requests but max_requests is {max_requests}")


def _client(base: str, request_timeout: float, n_conn: int) -> httpx.AsyncClient:
    # trust_env=False: a proxy from the environment must never see loopback benchmark traffic.
    # The daemon's API key (EVENFLOW_API_KEY or the key file) goes along: a server without auth ignores it.
    return httpx.AsyncClient(base_url=base, trust_env=False, headers=auth_headers(),
                             timeout=httpx.Timeout(request_timeout, connect=10.0),
                             limits=httpx.Limits(max_connections=n_conn + 4, max_keepalive_connections=n_conn + 4))


async def calibrate(client: httpx.AsyncClient, protocol: str, model: str, target_tokens: int,
                    target_seed: int, seed: int = 0) -> Calibration:
    """Two probes (1 output token each) over the target's own word sequence, then a local linear correction.

    The server's tokenizer is unknown, so we read its prompt count back. A probe differs from the real prompt only
    in its leading nonce, so it measures the very words the real prompt will carry, and the nonce keeps the
    real prompt from hitting the prefix cache (servers match prefixes from the first token).
    """
    t0 = time.perf_counter()
    probes: list[tuple[int, int]] = []

    async def probe(words: int) -> int:
        rec = RequestRecord(rid=-1 - len(probes), kind="probe", prompt_len_target=0, output_len=1)
        await stream_request(client, protocol, model, make_prompt(words, target_seed), rec, t0, seed=seed)
        if rec.error or rec.prompt_tokens is None:
            raise RuntimeError(f"calibration probe failed ({words} words): "
                               f"{rec.error or 'the server reported no prompt token count'}")
        probes.append((words, rec.prompt_tokens))
        return rec.prompt_tokens

    w1 = 32
    p1 = await probe(w1)
    w2 = max(w1 * 2, round(target_tokens * (w1 + 1) / max(p1, 1)))  # first guess: overhead folded into the rate
    p2 = await probe(w2)
    rate = (p2 - p1) / (w2 - w1)
    if rate <= 0:
        raise RuntimeError(f"calibration makes no sense: {w1} words -> {p1} tokens, {w2} words -> {p2} tokens")
    target_words = max(1, round(w2 + (target_tokens - p2) / rate))
    return Calibration(overhead=p1 - rate * w1, tokens_per_word=rate, probes=probes, target_tokens=target_tokens,
                       target_seed=target_seed, target_words=target_words)


async def warm_up(client: httpx.AsyncClient, protocol: str, model: str, n: int, seed: int = 0) -> None:
    """n concurrent tiny requests so every connection, slot and kernel shape is warm before t0."""
    t0 = time.perf_counter()
    recs = [RequestRecord(rid=-100 - i, kind="warmup", prompt_len_target=0, output_len=4) for i in range(n)]
    await asyncio.gather(*(stream_request(client, protocol, model, make_prompt(8, seed + 31 * i), r, t0, seed)
                           for i, r in enumerate(recs)))
    failed = [r.error for r in recs if r.error]
    if failed:
        raise RuntimeError(f"warm-up request failed: {failed[0]}")


async def _setup_within(coro: Awaitable[Any], deadline: float) -> Any:
    """Model detection, calibration and warm-up also count against the duration cap."""
    try:
        return await asyncio.wait_for(coro, timeout=max(0.001, deadline - time.perf_counter()))
    except asyncio.TimeoutError:
        raise RuntimeError("the duration cap was reached during setup (model detection, calibration, warm-up): "
                           "raise --duration or check that the server answers") from None


async def _with_deadline(body: Callable[[], Awaitable[None]], tasks: list[asyncio.Task], duration: float) -> bool:
    """Run body under the duration cap; on expiry cancel every task still running. True when it expired."""
    try:
        await asyncio.wait_for(body(), timeout=duration)
        return False
    except asyncio.TimeoutError:
        log.warning("duration cap of %.1f s reached: stopping all requests", duration)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return True


async def run_stall(url: str, protocol: str = "ollama-generate", model: str | None = None, n_streams: int = 4,
                    prompt_len: int = 2048, output_len: int = 1024, long_output_len: int = 8,
                    stream_prompt_len: int = 64, warmup_s: float = 2.0, tail_s: float = 1.0, seed: int = 0,
                    ignore_eos: bool | None = None, allow_remote: bool = False, duration: float = DEFAULT_DURATION_S,
                    max_requests: int = DEFAULT_MAX_REQUESTS, request_timeout: float = 600.0,
                    slo: dict[str, float] | None = None, progress: ProgressFn | None = None,
                    label: dict[str, str] | None = None, calibration: Calibration | None = None) -> StallResult:
    """N streams decode; after warmup_s a prompt_len-token prompt arrives; streams stop tail_s after its 1st token.
    `calibration` from an earlier run on a server with the same tokenizer skips the probes."""
    if n_streams < 1 or prompt_len < 1 or output_len < 2 or long_output_len < 1:
        raise ValueError(f"need n_streams>=1, prompt_len>=1, output_len>=2, long_output_len>=1; got {n_streams}, "
                         f"{prompt_len}, {output_len}, {long_output_len}")
    # 2 calibration probes + n+1 warm-up requests + n streams + the long prompt.
    _check_bounds(2 * n_streams + 4, max_requests, duration)
    protocol = normalize_protocol(protocol)
    base = check_target(url, allow_remote)
    config = {"url": base, "protocol": protocol, "n_streams": n_streams, "prompt_len": prompt_len,
              "output_len": output_len, "long_output_len": long_output_len, "stream_prompt_len": stream_prompt_len,
              "warmup_s": warmup_s, "tail_s": tail_s, "seed": seed,
              "ignore_eos": wants_ignore_eos(protocol, ignore_eos),
              "duration": duration, "slo": slo or {}, "label": label or {}}
    deadline = time.perf_counter() + duration
    async with _client(base, request_timeout, n_streams + 1) as client:
        long_seed = seed + 104729

        async def setup() -> tuple[str, Calibration]:
            m = model or await detect_model(client, protocol)
            c = calibration if calibration is not None and calibration.target_tokens == prompt_len \
                else await calibrate(client, protocol, m, prompt_len, long_seed, seed)
            await warm_up(client, protocol, m, n_streams + 1, seed)
            return m, c

        model, cal = await _setup_within(setup(), deadline)
        config["model"] = model
        t0 = time.perf_counter()
        streams = [RequestRecord(rid=i, kind="stream", prompt_len_target=stream_prompt_len, output_len=output_len)
                   for i in range(n_streams)]
        long = RequestRecord(rid=n_streams, kind="long", prompt_len_target=prompt_len, output_len=long_output_len)
        firsts = [asyncio.Event() for _ in streams]
        long_first = asyncio.Event()
        tasks: list[asyncio.Task] = []
        marks: dict[str, float] = {}

        async def body() -> None:
            for rec, ev in zip(streams, firsts):
                prompt = make_prompt(cal.words_for(stream_prompt_len), seed + rec.rid)
                tasks.append(asyncio.create_task(stream_request(
                    client, protocol, model, prompt, rec, t0, seed, ignore_eos, progress, ev)))
            await asyncio.gather(*(ev.wait() for ev in firsts))
            marks["before_start"] = time.perf_counter() - t0
            await asyncio.sleep(warmup_s)
            prompt = make_prompt(cal.words_for(prompt_len, long_seed), long_seed)
            long_task = asyncio.create_task(stream_request(
                client, protocol, model, prompt, long, t0, seed, ignore_eos, progress, long_first))
            tasks.append(long_task)
            await long_first.wait()
            await asyncio.sleep(tail_s)
            for t in tasks[:-1]:
                t.cancel()  # the streams: the measurement is over
            await asyncio.gather(*tasks, return_exceptions=True)

        truncated = await _with_deadline(body, tasks, max(0.001, deadline - time.perf_counter()))
        end = time.perf_counter() - t0
    if truncated and long.stopped and long.error is None:
        long.error = "stopped by the duration cap"
    result = StallResult(scenario="stall", config=config, records=streams + [long], calibration=cal,
                         summary=summarize(streams + [long], end, slo), truncated=truncated)
    if long.prompt_tokens is not None and abs(long.prompt_tokens - prompt_len) > 0.05 * prompt_len:
        result.warnings.append(f"long prompt has {long.prompt_tokens} tokens, {prompt_len} requested (>5% off)")
    if truncated:
        result.warnings.append(f"the duration cap ({duration:g} s) ended the run early")
    if long.cached_tokens and long.cached_tokens > 0.1 * (long.prompt_tokens or prompt_len):
        result.warnings.append(f"the server took {long.cached_tokens} of the long prompt's tokens from its cache: "
                               f"the prefill measured is shorter than requested")
    failed = [r for r in result.records if r.error]
    for r in failed:
        result.warnings.append(f"{r.kind} request {r.rid} failed: {r.error}")
    if long.ttft is not None and "before_start" in marks:
        result.long_send, result.long_first_token = long.start, long.token_times[0]
        result.windows = stall_windows(streams, marks["before_start"], long.start, long.token_times[0], end)
        short = result.windows["streams_through_window"]
        if short < n_streams:
            result.warnings.append(f"only {short}/{n_streams} streams were still decoding when the long prompt's "
                                   f"first token came: raise output_len (and use ignore_eos where supported)")
    else:
        result.warnings.append("the long prompt produced no token: no stall windows")
    return result


def parse_lengths(spec: str | int) -> tuple[int, int]:
    """'256' -> (256, 256); '128:512' -> uniform integers in [128, 512]."""
    text = str(spec)
    lo_s, _, hi_s = text.partition(":")
    try:
        lo, hi = int(lo_s), int(hi_s or lo_s)
    except ValueError:
        raise ValueError(f"bad length {text!r}: expected N or MIN:MAX") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"bad length {text!r}: need 1 <= MIN <= MAX")
    return lo, hi


async def run_poisson(url: str, protocol: str = "ollama-generate", model: str | None = None, rate: float = 1.0,
                      num_requests: int = 32, prompt_len: str | int = "256", output_len: str | int = "128",
                      max_concurrency: int | None = None, seed: int = 0, ignore_eos: bool | None = None,
                      allow_remote: bool = False, duration: float = DEFAULT_DURATION_S,
                      max_requests: int = DEFAULT_MAX_REQUESTS, request_timeout: float = 600.0,
                      slo: dict[str, float] | None = None, progress: ProgressFn | None = None,
                      label: dict[str, str] | None = None) -> BenchResult:
    """num_requests arrivals at `rate` req/s (exponential gaps, seeded; rate=inf sends all at once)."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (inf for all at once), got {rate}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    n_warm = min(max_concurrency or num_requests, num_requests, 8)
    _check_bounds(2 + n_warm + num_requests, max_requests, duration)
    protocol = normalize_protocol(protocol)
    base = check_target(url, allow_remote)
    p_lo, p_hi = parse_lengths(prompt_len)
    o_lo, o_hi = parse_lengths(output_len)
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(num_requests):
        arrivals.append(t)
        t += 0.0 if math.isinf(rate) else rng.expovariate(rate)
    records = [RequestRecord(rid=i, kind="request", prompt_len_target=rng.randint(p_lo, p_hi),
                             output_len=rng.randint(o_lo, o_hi)) for i in range(num_requests)]
    config = {"url": base, "protocol": protocol, "rate": rate, "num_requests": num_requests,
              "prompt_len": str(prompt_len), "output_len": str(output_len), "max_concurrency": max_concurrency,
              "seed": seed, "ignore_eos": wants_ignore_eos(protocol, ignore_eos), "duration": duration,
              "slo": slo or {}, "label": label or {}}
    conc = max_concurrency or num_requests
    deadline = time.perf_counter() + duration
    async with _client(base, request_timeout, min(conc, num_requests)) as client:
        async def setup() -> tuple[str, Calibration]:
            m = model or await detect_model(client, protocol)
            c = await calibrate(client, protocol, m, (p_lo + p_hi) // 2, seed - 1, seed)
            await warm_up(client, protocol, m, n_warm, seed)
            return m, c

        model, cal = await _setup_within(setup(), deadline)
        config["model"] = model
        sem = asyncio.Semaphore(conc)
        t0 = time.perf_counter()
        tasks: list[asyncio.Task] = []

        async def one(rec: RequestRecord, at: float) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            async with sem:
                prompt = make_prompt(cal.words_for(rec.prompt_len_target), seed + rec.rid)
                await stream_request(client, protocol, model, prompt, rec, t0, seed, ignore_eos, progress)

        async def body() -> None:
            tasks.extend(asyncio.create_task(one(r, a)) for r, a in zip(records, arrivals))
            await asyncio.gather(*tasks, return_exceptions=True)

        truncated = await _with_deadline(body, tasks, max(0.001, deadline - time.perf_counter()))
        end = time.perf_counter() - t0
    sent = [r for r in records if not math.isnan(r.start)]
    for r in sent:
        if r.stopped and r.error is None:
            r.error = "stopped by the duration cap"
    result = BenchResult(scenario="poisson", config=config, records=sent, calibration=cal,
                         summary=summarize(sent, end, slo), truncated=truncated)
    result.warnings += [f"request {r.rid} failed: {r.error}" for r in sent if r.error][:20]
    if truncated:
        result.warnings.append(f"duration cap hit: {len(sent)}/{num_requests} requests were sent")
    short = [r for r in sent if r.ok and r.output_tokens < r.output_len]
    if short:
        result.warnings.append(f"{len(short)} requests stopped before their output length (EOS; the server may not "
                               f"support ignore_eos)")
    return result


SWEEPABLE = {"stall": {"n_streams": int, "prompt_len": int, "output_len": int, "long_output_len": int,
                       "stream_prompt_len": int, "warmup_s": float},
             "poisson": {"rate": float, "num_requests": int, "prompt_len": str, "output_len": str,
                         "max_concurrency": int}}
MAX_SWEEP_VALUES = 32


async def run_sweep(scenario: str, param: str, values: list[Any], **kwargs: Any) -> SweepResult:
    """Re-run `scenario` once per value of one client-side parameter (server knobs: re-run the server instead)."""
    if scenario not in SWEEPABLE:
        raise ValueError(f"unknown scenario {scenario!r}: choose one of {', '.join(SWEEPABLE)}")
    if param not in SWEEPABLE[scenario]:
        raise ValueError(f"cannot sweep {param!r} for {scenario}: choose one of {', '.join(SWEEPABLE[scenario])}")
    if not 1 <= len(values) <= MAX_SWEEP_VALUES:
        raise ValueError(f"a sweep takes 1..{MAX_SWEEP_VALUES} values, got {len(values)}")
    cast = SWEEPABLE[scenario][param]
    typed = [cast(v) for v in values]
    runner = run_stall if scenario == "stall" else run_poisson
    runs = []
    for v in typed:
        log.info("sweep %s: %s=%s", scenario, param, v)
        runs.append(await runner(**{**kwargs, param: v}))
    return SweepResult(scenario=scenario, param=param, values=typed, runs=runs)
