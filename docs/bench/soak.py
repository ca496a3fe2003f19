"""Soak test: a daemon started with default settings (its synthetic `demo` model), driven over HTTP for a given
time by N looping streams (a share of them disconnecting mid-stream), a long-document client, a client looping on
bad input (a 4 MB prompt, template bombs: loops and widths) and a /api/version prober. Prints a table and writes JSON.

    python docs/bench/soak.py --minutes 10 --streams 4 --out docs/bench/soak.json

RSS is sampled every 5 s. The warm-up runs the same load until every kind of request has been answered twice, and
for at least `--min-warmup` seconds (180);
the leak figure compares the idle RSS after it with the idle RSS at the end, each read after asking glibc to hand
free memory back (malloc_trim), so allocator high-water marks do not count; start -> end and the peak are reported
too. The load also pauses at `--checkpoints` even points (4: the last is the end) for the same idle reading: a leak
grows from one to the next, a working set that is still being reached (first touches of buffers sized at load,
allocator arenas) steps up and then stays. `--tracemalloc` runs the daemon with tracemalloc on and prints the allocation sites that grew between the end
of warm-up and the end (a leak of Python objects shows there; allocator retention does not). `--env MALLOC_ARENA_MAX=2` passes settings to the daemon.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# The daemon, with two bench-only signal hooks: SIGUSR1 dumps a tracemalloc snapshot (when EVENFLOW_SOAK_SNAP names
# a path prefix), SIGUSR2 calls glibc's malloc_trim(0). Neither is part of the product.
DAEMON = """
import ctypes, os, signal, sys, tracemalloc
snaps = os.environ.get("EVENFLOW_SOAK_SNAP")
if snaps:
    tracemalloc.start(1)
    n = [0]
    def snap(*_):
        path = f"{snaps}.{n[0]}"
        tracemalloc.take_snapshot().dump(path + ".tmp")
        os.replace(path + ".tmp", path)
        n[0] += 1
    signal.signal(signal.SIGUSR1, snap)
signal.signal(signal.SIGUSR2, lambda *_: ctypes.CDLL("libc.so.6").malloc_trim(0))
from evenflow.clients.cli import main
main(["serve"])
"""


def signal_and_wait(proc: subprocess.Popen, sig: int, path: Path | None = None, timeout: float = 120) -> None:
    """Send `sig`; wait for `path` to appear (a snapshot) or, without one, for the daemon to have handled it."""
    os.kill(proc.pid, sig)
    deadline = time.monotonic() + timeout
    while path is not None and not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)


def top_growth(before: Path, after: Path, n: int = 12) -> list[dict]:
    import tracemalloc  # noqa: PLC0415

    diff = tracemalloc.Snapshot.load(str(after)).compare_to(tracemalloc.Snapshot.load(str(before)), "lineno")
    return [{"site": str(d.traceback), "size_kb": round(d.size / 1024, 1), "growth_kb": round(d.size_diff / 1024, 1),
             "count_diff": d.count_diff} for d in diff[:n]]


def mappings(pid: int) -> dict[tuple[str, str], int]:
    """Resident kB per mapping of `pid` (/proc/PID/smaps), keyed by (address range, what it maps)."""
    out: dict[tuple[str, str], int] = {}
    key = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            name = head[5] if len(head) > 5 else "[anon]"
            key = ("brk", name) if name == "[heap]" else (head[0], name)  # the brk heap moves its end
        elif key is not None and line.startswith("Rss:"):
            out[key] = out.get(key, 0) + int(head[1])
    return out


def mapping_growth(before: dict[tuple[str, str], int], after: dict[tuple[str, str], int], n: int = 8) -> list[dict]:
    """The mappings whose resident size changed most: the heap ([heap]/anonymous arenas) vs a fixed-size buffer."""
    keys = set(before) | set(after)
    rows = [{"range": k[0], "maps": k[1], "size_mb": round(_span(k[0]) / 2**20, 1),
             "rss_before_mb": round(before.get(k, 0) / 1024, 1), "rss_after_mb": round(after.get(k, 0) / 1024, 1),
             "growth_mb": round((after.get(k, 0) - before.get(k, 0)) / 1024, 1)} for k in keys]
    return sorted(rows, key=lambda r: -abs(r["growth_mb"]))[:n]


def largest_mapping(maps: dict[tuple[str, str], int]) -> float:
    """Resident MB of the widest mapping: on the llama.cpp backend, its compute + KV buffers, sized at load."""
    key = max(maps, key=lambda k: _span(k[0]))
    return round(maps[key] / 1024, 1)


def _span(rng: str) -> int:
    if "-" not in rng:
        return 0
    a, b = rng.split("-")
    return int(b, 16) - int(a, 16)


class RssSampler(threading.Thread):
    """RSS of `pid` every `every` seconds, as (seconds since start, MB)."""

    def __init__(self, pid: int, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.t0 = pid, every, time.monotonic()
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((round(time.monotonic() - self.t0, 1), round(rss_kb(self.pid) / 1024, 1)))
            self.stop.wait(self.every)


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.split()[-1])
    return total


class Soak:
    def __init__(self, url: str, model: str, seconds: float, streams: int, disconnect: float,
                 enough: dict[str, int] | None = None, min_seconds: float = 0, shared: int = 3) -> None:
        self.shared = shared  # shared-prefix chat clients
        self.url, self.model, self.deadline = url, model, time.monotonic() + seconds
        self.enough = enough  # stop early once every count reached these (the warm-up: each kind of request done)
        self.not_before = time.monotonic() + min_seconds  # ... but not before this
        self.streams, self.disconnect = streams, disconnect
        self.lock = threading.Lock()
        self.gaps: list[float] = []  # ms between chunks of the short streams
        self.version_ms: list[float] = []
        self.errors: list[str] = []
        self.counts = {"streams": 0, "disconnected": 0, "documents": 0, "shared_prefix": 0, "bad_400": 0,
                       "bad_413": 0}
        self.statuses: dict[int, int] = {}  # every HTTP status answered, over all clients

    @property
    def end(self) -> float:
        if (self.enough and all(self.counts[k] >= n for k, n in self.enough.items())
                and time.monotonic() >= self.not_before):
            return 0.0
        return self.deadline

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def status(self, code: int) -> None:
        with self.lock:
            self.statuses[code] = self.statuses.get(code, 0) + 1

    def stream_client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=300) as c:
            while time.monotonic() < self.end:
                cut = rng.randint(2, 40) if rng.random() < self.disconnect else None
                body = {"model": self.model, "prompt": f"story {rng.random()}", "options": {"num_predict": 64}}
                try:
                    with c.stream("POST", "/api/generate", json=body) as r:
                        self.status(r.status_code)
                        if r.status_code != 200:
                            self.error(f"stream status {r.status_code}")
                            continue
                        last, n = None, 0
                        for line in r.iter_lines():
                            now = time.perf_counter()
                            obj = json.loads(line)
                            if "error" in obj:
                                self.error(f"stream error line: {obj['error']}")
                                break
                            if last is not None and not obj.get("done"):
                                with self.lock:
                                    self.gaps.append((now - last) * 1e3)
                            last, n = now, n + 1
                            if cut is not None and n >= cut:
                                self.count("disconnected")
                                break  # leaving the block closes the connection mid-stream
                        else:
                            self.count("streams")
                except httpx.HTTPError as e:
                    self.error(f"stream transport: {type(e).__name__}")

    def document_client(self) -> None:
        words = "the quick brown fox jumps over the lazy dog and keeps running through the field ".split()
        with httpx.Client(base_url=self.url, timeout=600) as c:
            while time.monotonic() < self.end:
                doc = " ".join(random.choice(words) for _ in range(1500))
                try:
                    r = c.post("/api/generate", json={"model": self.model, "prompt": doc, "stream": False,
                                                      "options": {"num_predict": 8}})
                except httpx.HTTPError as e:
                    self.error(f"document transport: {type(e).__name__}")
                    continue
                self.status(r.status_code)
                if r.status_code == 200:
                    self.count("documents")
                else:
                    self.error(f"document status {r.status_code}: {r.text[:100]}")

    def bad_client(self) -> None:
        big = {"model": self.model, "prompt": "word " * (4 * 2**20 // 5), "stream": False}
        bombs = [{"model": self.model, "prompt": "x", "stream": False, "template": t} for t in (
            "{{ range 3000 }}{{ range 3000 }}x{{ end }}{{ end }}", '{{ printf "%999999999s" "x" }}',
            '{{ "x"|center(10**9) }}{% if 1 %}{% endif %}', '{{ "%999999999s"|format("x") }}{# jinja #}')]
        huge = b'{"model": "demo", "prompt": "' + b"y" * (40 * 2**20) + b'"}'
        with httpx.Client(base_url=self.url, timeout=300) as c:
            i = 0
            while time.monotonic() < self.end:
                i += 1
                if i % 10 == 0:
                    try:
                        r = c.post("/api/generate", content=huge)
                    except httpx.HTTPError:  # answered 413 before the upload ended: the send may break
                        self.count("bad_413")
                        continue
                    ok = r.status_code == 413
                    key = "bad_413"
                else:
                    try:
                        r = c.post("/api/generate", json=big if i % 2 else bombs[i // 2 % len(bombs)])
                    except httpx.HTTPError as e:
                        self.error(f"bad input transport: {type(e).__name__}")
                        continue
                    ok = r.status_code == 400
                    key = "bad_400"
                self.status(r.status_code)
                if ok:
                    self.count(key)
                else:
                    self.error(f"bad input got {r.status_code}: {r.text[:100]}")

    def shared_prefix_client(self, seed: int) -> None:
        """Chats that share long system prompts (one of three, repeated 1-3 times) with different questions,
        concurrently with each other and with everything else: the traffic of issue 27's prefix-cache failure."""
        rng = random.Random(1000 + seed)
        preambles = [f"You are assistant {k}. " + " ".join(f"Rule {i}: answer in at most {i + k} words about "
                                                           f"topic {i * 7 + k}." for i in range(40)) for k in range(3)]
        with httpx.Client(base_url=self.url, timeout=600) as c:
            while time.monotonic() < self.end:
                system = preambles[rng.randrange(3)] * rng.randint(1, 3)
                body = {"model": self.model, "stream": rng.random() < 0.5,
                        "messages": [{"role": "system", "content": system},
                                     {"role": "user", "content": f"Question {rng.randrange(6)}: what now?"}],
                        "options": {"num_predict": 12, "temperature": 0}}
                try:
                    r = c.post("/api/chat", json=body)
                except httpx.HTTPError as e:
                    self.error(f"shared-prefix transport: {type(e).__name__}")
                    continue
                self.status(r.status_code)
                last = json.loads(r.text.strip().splitlines()[-1]) if r.text.strip() else {}
                if r.status_code == 200 and last.get("done") and "error" not in last:
                    self.count("shared_prefix")
                else:
                    self.error(f"shared-prefix got {r.status_code}: {r.text[-200:]}")

    def version_prober(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as c:
            while time.monotonic() < self.end:
                t0 = time.perf_counter()
                try:
                    r = c.get("/api/version")
                except httpx.HTTPError as e:
                    self.error(f"version transport: {type(e).__name__}")
                    continue
                dt = (time.perf_counter() - t0) * 1e3
                self.status(r.status_code)
                if r.status_code != 200:
                    self.error(f"version status {r.status_code}")
                with self.lock:
                    self.version_ms.append(dt)
                time.sleep(0.05)

    def run(self) -> None:
        threads = [threading.Thread(target=self.stream_client, args=(i,)) for i in range(self.streams)]
        threads += [threading.Thread(target=f) for f in (self.document_client, self.bad_client, self.version_prober)]
        threads += [threading.Thread(target=self.shared_prefix_client, args=(i,)) for i in range(self.shared)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--disconnect", type=float, default=0.25, help="share of streams cut mid-way")
    ap.add_argument("--shared-prefix", type=int, default=3, help="chat clients sharing long system prompts")
    ap.add_argument("--warmup", type=float, default=600,
                    help="at most this many seconds of the same load before RSS is first read (it ends sooner, once "
                         "every kind of request has been answered twice)")
    ap.add_argument("--min-warmup", type=float, default=180,
                    help="the warm-up lasts at least this many seconds: long enough for the working set (KV pages first "
                         "touched as more cells are used, allocator arenas of the worker threads) to be reached")
    ap.add_argument("--checkpoints", type=int, default=4,
                    help="pause the load this many times (evenly; the last at the end) to read the idle trimmed RSS")
    ap.add_argument("--out", default="docs/bench/soak.json")
    ap.add_argument("--tracemalloc", action="store_true", help="diff allocation sites between warm-up and end")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra daemon environment")
    args = ap.parse_args()
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="evenflow-soak-")
    env = {**os.environ, "EVENFLOW_HOST": f"127.0.0.1:{port}", "EVENFLOW_MODELS": str(Path(tmp) / "models"),
           **dict(kv.split("=", 1) for kv in args.env)}
    snap = Path(tmp) / "heap"
    if args.tracemalloc:
        env["EVENFLOW_SOAK_SNAP"] = str(snap)
    proc = subprocess.Popen([sys.executable, "-c", DAEMON], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "daemon.log", "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/api/tags", timeout=5).json().get("models"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the daemon did not start (see " + str(Path(tmp) / "daemon.log") + ")")
            time.sleep(0.2)
        warm = httpx.post(url + "/api/generate", json={"model": "demo", "prompt": "hi", "stream": False,
                                                       "options": {"num_predict": 4}}, timeout=900)
        assert warm.status_code == 200, warm.text
        sampler = RssSampler(proc.pid)
        sampler.start()
        rss_start = rss_kb(proc.pid)
        t_warm = time.monotonic()
        warmup = Soak(url, "demo", args.warmup, args.streams, args.disconnect,  # arenas, caches: not a leak
                      enough={"streams": 2, "documents": 2, "bad_400": 4, "bad_413": 2,
                              "shared_prefix": 2 if args.shared_prefix else 0},
                      min_seconds=args.min_warmup, shared=args.shared_prefix)
        warmup.run()
        warm_s = time.monotonic() - t_warm
        time.sleep(2)
        if args.tracemalloc:
            signal_and_wait(proc, signal.SIGUSR1, Path(f"{snap}.0"))
        signal_and_wait(proc, signal.SIGUSR2)
        rss0 = rss_kb(proc.pid)  # idle, after a trim: what the daemon holds once warm
        maps0 = mappings(proc.pid)
        soak = Soak(url, "demo", 0, args.streams, args.disconnect, shared=args.shared_prefix)
        t0 = time.monotonic()
        checkpoints: list[tuple[float, float]] = []  # (minutes into the run, idle trimmed MB): a leak is a slope
        biggest = [largest_mapping(maps0)]  # the resident MB of the largest mapping (llama.cpp's buffers) at each
        for _ in range(args.checkpoints):
            soak.deadline = time.monotonic() + args.minutes * 60 / args.checkpoints
            soak.run()
            time.sleep(2)  # let the last aborts reach the engine
            rss1 = rss_kb(proc.pid)
            signal_and_wait(proc, signal.SIGUSR2)
            rss_trim = rss_kb(proc.pid)
            checkpoints.append((round((time.monotonic() - t0) / 60, 2), round(rss_trim / 1024, 1)))
            biggest.append(largest_mapping(mappings(proc.pid)))
        elapsed = time.monotonic() - t0
        moved = mapping_growth(maps0, mappings(proc.pid))
        growth = None
        if args.tracemalloc:
            signal_and_wait(proc, signal.SIGUSR1, Path(f"{snap}.1"))
            growth = top_growth(Path(f"{snap}.0"), Path(f"{snap}.1"))
        sampler.stop.set()
        after = {"kv_blocks_used": metric(url, "evenflow_kv_blocks_used"),
                 "running": metric(url, "evenflow_running_sequences"),
                 "queue": metric(url, "evenflow_queue_depth"), "pool_running": None,
                 "prefix_cache_hit_tokens": metric(url, "evenflow_prefix_cache_hit_tokens_total"),
                 "prefix_cache_fallback_tokens": metric(url, "evenflow_prefix_cache_fallback_tokens_total"),
                 "daemon_alive": proc.poll() is None}
        ps = httpx.get(url + "/api/ps", timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(60)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    result = {
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "note": "shared with other engineers' work: noisy"},
        "daemon": "evenflow serve with default settings (backend auto), synthetic demo model, HTTP on loopback",
        "minutes": round(elapsed / 60, 2), "streams": args.streams, "disconnect_share": args.disconnect,
        "counts": soak.counts, "errors": len(soak.errors), "error_samples": soak.errors[:10],
        "statuses": {str(k): soak.statuses.get(k, 0) + warmup.statuses.get(k, 0)
                     for k in sorted(set(soak.statuses) | set(warmup.statuses))},
        "gap_ms": {p: round(pct(soak.gaps, float(p[1:])), 1) for p in ("p50", "p90", "p99")} | {"n": len(soak.gaps)},
        "version_ms": {p: round(pct(soak.version_ms, float(p[1:])), 1) for p in ("p50", "p99")}
                      | {"max": round(max(soak.version_ms or [0]), 1), "n": len(soak.version_ms)},
        "after": {k: v for k, v in after.items() if v is not None}, "models_loaded_after": len(ps.get("models", [])),
        "warmup_s": round(warm_s, 1), "warmup_counts": warmup.counts, "daemon_env": dict(kv.split("=", 1) for kv in args.env),
        "rss_mb": {"start": round(rss_start / 1024, 1), "after_warmup_idle_trimmed": round(rss0 / 1024, 1),
                   "end": round(rss1 / 1024, 1), "end_idle_trimmed": round(rss_trim / 1024, 1),
                   "peak_during_run": max(mb for _, mb in sampler.samples),
                   "growth_pct_start_to_end": round(100 * (rss1 - rss_start) / rss_start, 2),
                   "growth_pct_warmup_to_end": round(100 * (rss_trim - rss0) / rss0, 2),
                   "idle_trimmed_checkpoints": [(0.0, round(rss0 / 1024, 1)), *checkpoints],
                   "largest_mapping_resident_at_checkpoints": biggest,
                   "growth_pct_first_checkpoint_to_end": round(100 * (checkpoints[-1][1] - checkpoints[0][1])
                                                              / checkpoints[0][1], 2)},
        "rss_timeline_mb": sampler.samples,
        "mappings_that_grew": moved,  # idle after warm-up -> idle at the end, both after a trim
    }
    if growth is not None:
        result["tracemalloc_top_growth"] = growth
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"soak: {result['minutes']} min on {cpu} ({os.cpu_count()} cores, shared machine)")
    print(f"{'errors':<28}{result['errors']}")
    st = result["statuses"]
    print(f"{'requests (warm-up + run)':<28}{sum(st.values())}: " + ", ".join(f"{k}: {v}" for k, v in st.items())
          + f"; 5xx: {sum(v for k, v in st.items() if k.startswith('5'))}; daemon alive at the end: "
          f"{after['daemon_alive']}")
    print(f"{'prefix cache hit / fallback':<28}{after['prefix_cache_hit_tokens']:.0f} / "
          f"{after['prefix_cache_fallback_tokens']:.0f} tokens")
    for k, v in soak.counts.items():
        print(f"{k:<28}{v}")
    print(f"{'stream gap ms p50/p90/p99':<28}{result['gap_ms']['p50']} / {result['gap_ms']['p90']} / "
          f"{result['gap_ms']['p99']}  (n={len(soak.gaps)})")
    print(f"{'/api/version ms p50/p99/max':<28}{result['version_ms']['p50']} / {result['version_ms']['p99']} / "
          f"{result['version_ms']['max']}")
    print(f"{'after: kv/running/queue':<28}{after['kv_blocks_used']:.0f} / {after['running']:.0f} / {after['queue']:.0f}")
    r = result["rss_mb"]
    print(f"{'RSS MB start -> end':<28}{r['start']} -> {r['end']} ({r['growth_pct_start_to_end']}%)")
    print(f"{'RSS MB warm -> end (idle)':<28}{r['after_warmup_idle_trimmed']} -> {r['end_idle_trimmed']} "
          f"({r['growth_pct_warmup_to_end']}%; both idle, after malloc_trim; warm-up {result['warmup_s']} s)")
    print(f"{'RSS MB peak during the run':<28}{r['peak_during_run']}")
    print(f"{'idle trimmed RSS MB':<28}" + ", ".join(f"{mb} at {m} min" for m, mb in r["idle_trimmed_checkpoints"])
          + f"  ({r['growth_pct_first_checkpoint_to_end']}% from the first checkpoint to the end)")
    print(f"{'  of which largest mapping':<28}" + ", ".join(f"{mb}" for mb in r["largest_mapping_resident_at_checkpoints"]))
    print("mappings whose resident size moved most (warm -> end, idle, trimmed):")
    for m in moved:
        print(f"  {m['growth_mb']:>+8} MB  {m['rss_before_mb']:>8} -> {m['rss_after_mb']:>8} of {m['size_mb']:>8} MB  "
              f"{m['maps']} {m['range']}")
    for g in growth or []:
        print(f"  {g['growth_kb']:>10} kB {g['count_diff']:>8} objs  {g['site']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
