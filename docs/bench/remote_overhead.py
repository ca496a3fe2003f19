"""What a remote model's relay costs: the same chats streamed from llama-server directly and through evenflow.

    python docs/bench/remote_overhead.py --requests 30 --tokens 64

llama-server (xllamacpp, a subprocess on loopback) serves a tiny synthetic model, so fast (well under a
millisecond a token) that what evenflow adds per request and per chunk is what the figures show. evenflow runs
as a user starts it (`evenflow serve --no-demo`, default settings) with a remote model pointing at that
llama-server; requests alternate direct / through evenflow, one at a time. Writes remote_overhead.json here.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from perf_suite import serve_daemon  # noqa: E402

_SERVER = r"""
import signal, sys, xllamacpp
sys.path.insert(0, sys.argv[2])
from llama_server import make_params
p = make_params(sys.argv[1], slots=2, ctx_per_slot=1024, port=0, threads=1, n_batch=512, n_ubatch=512)
p.model_alias = {"tiny-remote"}
server = xllamacpp.Server(p)
print("URL", server.listening_address, flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def timed_stream(client: httpx.Client, url: str, body: dict, sse: bool) -> tuple[float, list[float], float]:
    """(TTFT, gaps between text chunks, total) in seconds for one streamed request."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if sse:
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                obj = json.loads(line[5:])
                text = (obj.get("choices") or [{}])[0].get("delta", {}).get("content") if obj.get("choices") else ""
            else:
                if not line:
                    continue
                text = json.loads(line).get("message", {}).get("content")
            if text:
                stamps.append(time.perf_counter())
    total = time.perf_counter() - t0
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], total


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    from evenflow.backends.synthetic import cached_model, make_spec

    gguf = cached_model(make_spec("tiny", architecture="llama", text_only_output=True), ("gguf",), "f32")["gguf"]
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(gguf), str(HERE)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    upstream = next(line.split()[1].rstrip("/") for line in proc.stdout if line.startswith("URL "))
    store = Path(tempfile.mkdtemp(prefix="evenflow-remote-bench-"))
    try:
        with serve_daemon({"OLLAMA_MODELS": str(store)}, "remote_overhead_daemon.log") as url:
            r = httpx.post(url + "/api/create", timeout=60, json={
                "model": "tiny-remote", "from": f"openai+{upstream}/v1/models/tiny-remote", "stream": False})
            r.raise_for_status()
            msgs = [{"role": "user", "content": "tell me a long story"}]
            direct_body = {"model": "tiny-remote", "messages": msgs, "max_tokens": a.tokens, "temperature": 0,
                           "stream": True}
            ours_body = {"model": "tiny-remote", "messages": msgs, "options": {"num_predict": a.tokens,
                                                                              "temperature": 0}}
            runs: dict[str, list[tuple[float, list[float], float]]] = {"direct": [], "evenflow": []}
            # Fresh upstream connections on both sides: evenflow opens one per stream (docs/remote.md).
            with httpx.Client(timeout=60, headers={"Connection": "close"}, trust_env=False) as direct, \
                    httpx.Client(timeout=60, trust_env=False) as ours:
                timed_stream(ours, url + "/api/chat", ours_body, sse=False)  # first use: the health check
                for _ in range(a.requests):
                    runs["direct"].append(timed_stream(direct, upstream + "/v1/chat/completions", direct_body, True))
                    runs["evenflow"].append(timed_stream(ours, url + "/api/chat", ours_body, False))
    finally:
        proc.terminate()
        proc.wait(30)
    rows = {}
    for name, rs in runs.items():
        ttft = [x[0] for x in rs]
        gaps = [g for x in rs for g in x[1]]
        total = [x[2] for x in rs]
        rows[name] = {"ttft_p50_ms": statistics.median(ttft) * 1e3, "ttft_p90_ms": pct(ttft, 0.9) * 1e3,
                      "gap_p50_ms": statistics.median(gaps) * 1e3, "gap_p99_ms": pct(gaps, 0.99) * 1e3,
                      "total_p50_ms": statistics.median(total) * 1e3,
                      "chunks_per_s": sum(len(x[1]) + 1 for x in rs) / sum(total)}
    print(f"{a.requests} chats x {a.tokens} tokens, one at a time; llama-server (xllamacpp) on a tiny synthetic "
          f"model; CPU: {cpu_model()}")
    print(f"{'path':<10} {'TTFT p50':>9} {'TTFT p90':>9} {'gap p50':>8} {'gap p99':>8} {'total p50':>10} {'chunks/s':>9}")
    for name, r in rows.items():
        print(f"{name:<10} {r['ttft_p50_ms']:>7.2f}ms {r['ttft_p90_ms']:>7.2f}ms {r['gap_p50_ms']:>6.3f}ms "
              f"{r['gap_p99_ms']:>6.3f}ms {r['total_p50_ms']:>8.2f}ms {r['chunks_per_s']:>9.0f}")
    d, e = rows["direct"], rows["evenflow"]
    print(f"evenflow adds {e['ttft_p50_ms'] - d['ttft_p50_ms']:.2f} ms to the median TTFT and "
          f"{e['gap_p50_ms'] - d['gap_p50_ms']:.3f} ms to the median gap between chunks")
    out = {"cpu": cpu_model(), "requests": a.requests, "tokens": a.tokens, "upstream": "llama-server (xllamacpp)",
           "model": "synthetic tiny llama (f32)", "load": os.getloadavg(), "results": rows}
    (HERE / "remote_overhead.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
