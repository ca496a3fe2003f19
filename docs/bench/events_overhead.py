"""What watching costs: single-stream decode tok/s of a DEFAULT `evenflow serve`, with and without one /api/events
subscriber reading the feed the way the monitor does (issue 40).

    python docs/bench/events_overhead.py [--gguf PATH] [--rounds 8] [--tokens 256]

The daemon runs at its defaults (a store in a temp directory, a free loopback port); the GGUF (SmolLM2-135M
Instruct Q4_1 by default, from ~/.cache/evenflow-real-models) is imported with /api/blobs + /api/create. Each
round runs one greedy `/api/generate` (stream: false, ignore_eos, `--tokens` tokens) alone and one with a
subscriber, in alternating order; decode tok/s is the daemon's own eval_count / eval_duration. The subscriber is
a separate process (as the monitor is) that parses every line and applies it to the monitor's state
(tui/state.MonitorState), without drawing. Writes events_overhead.json and .md next to this script.
"""
from __future__ import annotations

import argparse
import hashlib
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

MODEL = "bench/smollm2"
DEFAULT_GGUF = Path.home() / ".cache" / "evenflow-real-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "Write a long story about a lighthouse keeper who finds a map in a bottle."


def subscribe(url: str) -> None:
    """The subscriber process: read /api/events into the monitor's state until killed; say "ready" at hello."""
    from evenflow.tui.state import MonitorState

    state = MonitorState()
    with httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=None), trust_env=False) as c:
        with c.stream("GET", "/api/events") as r:
            for line in r.iter_lines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                state.apply(ev)
                if ev.get("type") == "hello":
                    print("ready", flush=True)


def import_model(url: str, gguf: Path) -> None:
    data = gguf.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
        c.post(f"/api/blobs/{digest}", content=data).raise_for_status()
        c.post("/api/create", json={"model": MODEL, "files": {gguf.name: digest}, "stream": False}).raise_for_status()


def decode_tps(c: httpx.Client, tokens: int) -> float:
    r = c.post("/api/generate", json={"model": MODEL, "prompt": PROMPT, "stream": False, "keep_alive": -1,
                                      "options": {"temperature": 0, "num_predict": tokens, "ignore_eos": True}})
    r.raise_for_status()
    body = r.json()
    assert body["eval_count"] == tokens, body
    return body["eval_count"] / (body["eval_duration"] / 1e9)


def watched_tps(url: str, c: httpx.Client, tokens: int) -> tuple[float, int]:
    """Decode tok/s while a subscriber process reads the feed; (tok/s, the subscriber's exit code)."""
    sub = subprocess.Popen([sys.executable, __file__, "--subscribe", url], stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout is not None and sub.stdout.readline().strip() == "ready", "the subscriber did not start"
        tps = decode_tps(c, tokens)
        time.sleep(0.2)  # the subscriber takes the last batch
    finally:
        sub.terminate()
        code = sub.wait(30)
    return tps, code


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="a daemon setting off its default (e.g. EVENFLOW_NUM_THREADS=1 on an oversubscribed machine)")
    ap.add_argument("--subscribe", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.subscribe:
        subscribe(args.subscribe)
        return 0
    if not args.gguf.is_file():
        print(f"no GGUF at {args.gguf} (python ../shared/tools/real_models.py smollm2 fetches it)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as store:
        env = dict(kv.split("=", 1) for kv in args.env)
        with serve_daemon({"OLLAMA_MODELS": store, **env}, "events_overhead_daemon.log") as url:
            import_model(url, args.gguf)
            with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
                decode_tps(c, 32)  # load and warm up
                for i in range(args.rounds):
                    load = os.getloadavg()[0]
                    if i % 2 == 0:
                        alone = decode_tps(c, args.tokens)
                        watched, _ = watched_tps(url, c, args.tokens)
                    else:
                        watched, _ = watched_tps(url, c, args.tokens)
                        alone = decode_tps(c, args.tokens)
                    rows.append({"round": i, "alone_tps": alone, "watched_tps": watched, "ratio": watched / alone,
                                 "loadavg_1m": load})
                    print(f"round {i}: alone {alone:7.1f} tok/s  watched {watched:7.1f} tok/s  "
                          f"ratio {watched / alone:.3f}  (load {load:.1f})", flush=True)
    alone_med = statistics.median(r["alone_tps"] for r in rows)
    watched_med = statistics.median(r["watched_tps"] for r in rows)
    ratio_med = statistics.median(r["ratio"] for r in rows)
    out = {"model": args.gguf.name, "backend": "llamacpp (auto)", "daemon_env": env, "cpu": cpu_model(),
           "cores": os.cpu_count(), "tokens": args.tokens, "rounds": rows, "alone_median_tps": alone_med,
           "watched_median_tps": watched_med, "ratio_of_medians": watched_med / alone_med,
           "median_of_ratios": ratio_med, "note": "machine shared with other work unless stated otherwise"}
    (HERE / "events_overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    md = ["| round | alone tok/s | watched tok/s | ratio | load (1 min) |", "|---|---|---|---|---|"]
    md += [f"| {r['round']} | {r['alone_tps']:.1f} | {r['watched_tps']:.1f} | {r['ratio']:.3f} | "
           f"{r['loadavg_1m']:.1f} |" for r in rows]
    md += ["", f"{args.gguf.name}, llama.cpp, daemon settings {env or 'default'}, {out['cpu']}, {out['cores']} cores, "
           f"{args.tokens} tokens per run: "
           f"median alone {alone_med:.1f} tok/s, watched {watched_med:.1f} tok/s, ratio of medians "
           f"**{watched_med / alone_med:.3f}**, median of per-round ratios {ratio_med:.3f}."]
    (HERE / "events_overhead.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
