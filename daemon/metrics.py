"""Prometheus metrics, one CollectorRegistry per app, fed from engine events (engine thread) and HTTP responses."""
from __future__ import annotations

import threading
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """All daemon metrics; `observe_event` is an engine subscriber (cheap, thread-safe)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("evenflow_http_requests", "HTTP responses by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("evenflow_prompt_tokens", "Prompt tokens of finished requests", ["model"], registry=r)
        self.generated_tokens = Counter("evenflow_generated_tokens", "Generated tokens", ["model"], registry=r)
        self.finished = Counter("evenflow_sequences_finished", "Finished sequences by done_reason",
                                ["model", "reason"], registry=r)
        self.ttft = Histogram("evenflow_time_to_first_token_seconds", "Engine arrival to first token", ["model"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("evenflow_queue_wait_seconds", "Engine arrival to a request's first scheduled step "
                                    "(waiting for a slot, KV or the prompt budget)", ["model"],
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("evenflow_inter_token_latency_seconds", "Gap between consecutive generated tokens",
                             ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.step_time = Histogram("evenflow_engine_step_seconds", "Engine step (forward pass + sampling) time",
                                   ["model"], buckets=_STEP_BUCKETS, registry=r)
        self.step_tokens = Counter("evenflow_engine_step_tokens", "Tokens computed by engine steps",
                                   ["model", "kind"], registry=r)
        self.queue_depth = Gauge("evenflow_queue_depth", "Sequences waiting for a slot", ["model"], registry=r)
        self.running = Gauge("evenflow_running_sequences", "Sequences holding a slot", ["model"], registry=r)
        self.kv_used = Gauge("evenflow_kv_blocks_used", "KV blocks in use", ["model"], registry=r)
        self.kv_total = Gauge("evenflow_kv_blocks_total", "KV blocks allocated", ["model"], registry=r)
        self.kv_usage = Gauge("evenflow_kv_usage_ratio", "KV blocks used / total", ["model"], registry=r)
        self.kv_cached = Gauge("evenflow_kv_blocks_cached", "KV blocks holding a reusable prompt prefix", ["model"],
                               registry=r)
        self.cache_hits = Counter("evenflow_prefix_cache_hit_tokens", "Admitted tokens whose KV came from the "
                                  "prefix cache", ["model"], registry=r)
        self.cache_queries = Counter("evenflow_prefix_cache_query_tokens", "Admitted tokens looked up in the prefix "
                                     "cache", ["model"], registry=r)
        self.cache_fallbacks = Counter("evenflow_prefix_cache_fallback_tokens", "Cached prefix tokens the backend "
                                       "could no longer serve, recomputed instead", ["model"], registry=r)
        self.cache_rewinds = Counter("evenflow_prefix_cache_rewind_tokens", "Cached prefix tokens past a recurrent "
                                     "model's last state checkpoint, recomputed instead", ["model"], registry=r)
        self.cache_hit_rate = Gauge("evenflow_prefix_cache_hit_rate", "Prefix cache hit tokens / query tokens "
                                    "since the model loaded", ["model"], registry=r)
        self.draft_tokens = Counter("evenflow_speculative_draft_tokens", "Draft tokens verified (speculative "
                                    "decoding)", ["model"], registry=r)
        self.accepted_tokens = Counter("evenflow_speculative_accepted_tokens", "Draft tokens the model kept",
                                       ["model"], registry=r)
        self.acceptance = Gauge("evenflow_speculative_acceptance_rate", "Draft tokens kept / verified since the "
                                "model loaded", ["model"], registry=r)
        self.tokens_per_forward = Gauge("evenflow_tokens_per_forward", "Tokens generated per decode pass since the "
                                        "model loaded (1 without speculative decoding)", ["model"], registry=r)
        self.disk_restored_tokens = Counter("evenflow_kv_disk_restored_tokens", "Prompt tokens whose KV was read back "
                                            "from the disk KV cache", ["model"], registry=r)
        self.disk_restored_bytes = Counter("evenflow_kv_disk_restored_bytes", "Bytes read back from the disk KV cache",
                                           ["model"], registry=r)
        self.disk_restore_failures = Counter("evenflow_kv_disk_restore_failures", "Saved prefixes read from disk that "
                                             "the backend could not take back (recomputed)", ["model"], registry=r)
        self.disk_saved_bytes = Counter("evenflow_kv_disk_saved_bytes", "Bytes of KV handed to the disk cache when a "
                                        "model unloaded", ["model"], registry=r)
        self.disk_bytes = Gauge("evenflow_kv_disk_bytes", "Size of the disk KV cache", registry=r)
        self.disk_entries = Gauge("evenflow_kv_disk_entries", "Prefixes saved in the disk KV cache", registry=r)
        self.loaded = Gauge("evenflow_models_loaded", "Models loaded", registry=r)
        self.pending = Gauge("evenflow_pending_requests", "Requests waiting for a model to load", registry=r)
        self.loads = Counter("evenflow_model_loads", "Model loads", ["model", "backend"], registry=r)
        self.load_time = Histogram("evenflow_model_load_seconds", "Time to load a model", ["model"],
                                   buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.events_dropped = Counter("evenflow_events_dropped", "Events dropped for slow /api/events readers",
                                      registry=r)
        self._lock = threading.Lock()
        self._arrival: dict[tuple[str, int], float] = {}
        self._last_token: dict[tuple[str, int], float | None] = {}
        self._models_seen: set[str] = set()

    def observe_response(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def observe_event(self, ev: dict[str, Any]) -> None:
        model = str(ev.get("model") or ev.get("user", {}).get("model") or "")
        t = float(ev.get("time", 0.0))
        if ev.get("type") == "step":
            self.step_time.labels(model).observe(float(ev.get("step_ms", 0.0)) / 1e3)
            self.step_tokens.labels(model, "decode").inc(int(ev.get("decodes", 0)))
            self.step_tokens.labels(model, "prefill").inc(int(ev.get("prefill_tokens", 0)))
            self.cache_hits.labels(model).inc(int(ev.get("cached_tokens", 0)))
            self.cache_queries.labels(model).inc(int(ev.get("admitted_tokens", 0)))
            self.cache_fallbacks.labels(model).inc(int(ev.get("prefix_fallback_tokens", 0)))
            if ev.get("draft_tokens"):
                self.draft_tokens.labels(model).inc(int(ev["draft_tokens"]))
                self.accepted_tokens.labels(model).inc(int(ev.get("accepted_tokens", 0)))
            self.cache_rewinds.labels(model).inc(int(ev.get("prefix_rewind_tokens", 0)))
            self.kv_cached.labels(model).set(int(ev.get("kv_cached", 0)))
            self._set_gauges(model, ev.get("running", 0), ev.get("waiting", 0), ev.get("kv_used", 0),
                             ev.get("kv_total", 0))
            return
        if ev.get("type") == "kv_disk":
            kind = ev.get("event")
            if kind == "restored":
                self.disk_restored_tokens.labels(model).inc(int(ev.get("tokens", 0)))
                self.disk_restored_bytes.labels(model).inc(int(ev.get("bytes", 0)))
            elif kind == "restore_failed":
                self.disk_restore_failures.labels(model).inc()
            elif kind == "saving":
                self.disk_saved_bytes.labels(model).inc(int(ev.get("bytes", 0)))
            return
        if ev.get("type") == "model" and ev.get("event") == "loaded":
            self.loads.labels(model, str(ev.get("backend", ""))).inc()
            self.load_time.labels(model).observe(float(ev.get("load_ms", 0.0)) / 1e3)
            return
        if ev.get("type") != "request":
            return
        key = (model, int(ev.get("seq_id", 0)))
        kind = ev.get("event")
        with self._lock:
            if kind == "queued":
                self._arrival[key] = t
            elif kind == "first_token":
                arrived = self._arrival.get(key)
                if arrived is not None:
                    self.ttft.labels(model).observe(max(t - arrived, 0.0))
                self._last_token[key] = None  # the first token's own "token" event is not a gap
            elif kind == "token":
                last = self._last_token.get(key)
                if last is not None and t >= last:
                    self.itl.labels(model).observe(t - last)
                self._last_token[key] = t
            elif kind == "finished":
                self._arrival.pop(key, None)
                self._last_token.pop(key, None)
        if kind == "scheduled" and ev.get("queue_ms") is not None:
            self.queue_wait.labels(model).observe(max(float(ev["queue_ms"]) / 1e3, 0.0))
        if kind == "finished":
            self.prompt_tokens.labels(model).inc(int(ev.get("prompt_tokens", 0)))
            self.generated_tokens.labels(model).inc(int(ev.get("output_tokens", 0)))
            self.finished.labels(model, str(ev.get("done_reason"))).inc()

    def _set_gauges(self, model: str, running: int, waiting: int, used: int, total: int) -> None:
        self.running.labels(model).set(running)
        self.queue_depth.labels(model).set(waiting)
        self.kv_used.labels(model).set(used)
        self.kv_total.labels(model).set(total)
        self.kv_usage.labels(model).set(used / total if total else 0.0)
        self._models_seen.add(model)

    def refresh(self, engines: Iterable[tuple[str, Any]], pending: int, disk: dict[str, Any] | None = None) -> None:
        """Scrape time: gauges from each loaded engine's stats (and the disk KV cache's usage); unloaded models'
        gauges removed."""
        if disk is not None:
            self.disk_bytes.set(disk["size"])
            self.disk_entries.set(disk["entries"])
        live = set()
        for name, engine in engines:
            s = engine.stats()
            self._set_gauges(name, s.running, s.waiting, s.kv_blocks_used, s.kv_blocks_total)
            self.kv_cached.labels(name).set(s.kv_blocks_cached)
            self.cache_hit_rate.labels(name).set(s.cache_hit_rate)
            self.acceptance.labels(name).set(s.acceptance_rate)
            self.tokens_per_forward.labels(name).set(s.tokens_per_forward)
            live.add(name)
        for gone in self._models_seen - live:
            for g in (self.running, self.queue_depth, self.kv_used, self.kv_total, self.kv_usage, self.kv_cached,
                      self.cache_hit_rate, self.acceptance, self.tokens_per_forward):
                try:
                    g.remove(gone)
                except KeyError:
                    pass
        self._models_seen = live
        self.loaded.set(len(live))
        self.pending.set(pending)

    def render(self) -> bytes:
        return generate_latest(self.registry)
