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


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time of a process (or of one of its threads) so far (Linux /proc)."""
    path = f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat"
    f = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def daemon_pid(url: str) -> int:
    """The pid of the process listening on the URL's port (the daemon, not a wrapper)."""
    port = int(url.rsplit(":", 1)[1])
    inodes = {f[9] for f in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
              if int(f[1].split(":")[1], 16) == port and f[3] == "0A"}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(os.readlink(fd).removeprefix("socket:[").rstrip("]") in inodes
                       for fd in (proc / "fd").iterdir()):
                    return int(proc.name)
            except OSError:
                continue
    raise RuntimeError("cannot find the daemon's process")


def decode_tps(c: httpx.Client, tokens: int) -> float:
    r = c.post("/api/generate", json={"model": MODEL, "prompt": PROMPT, "stream": False, "keep_alive": -1,
                                      "options": {"temperature": 0, "num_predict": tokens, "ignore_eos": True}})
    r.raise_for_status()
    body = r.json()
    assert body["eval_count"] == tokens, body
    return body["eval_count"] / (body["eval_duration"] / 1e9)


def alone(c: httpx.Client, pid: int, tokens: int) -> dict[str, float]:
    cpu, loop = cpu_seconds(pid), cpu_seconds(pid, pid)  # uvicorn's event loop runs on the main thread
    tps = decode_tps(c, tokens)
    return {"tps": tps, "daemon_cpu_ms_per_token": (cpu_seconds(pid) - cpu) * 1e3 / tokens,
            "loop_cpu_ms_per_token": (cpu_seconds(pid, pid) - loop) * 1e3 / tokens}


def watched(url: str, c: httpx.Client, pid: int, tokens: int) -> dict[str, float]:
    """Decode tok/s while a subscriber process reads the feed, and the CPU both used per token."""
    sub = subprocess.Popen([sys.executable, __file__, "--subscribe", url], stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout is not None and sub.stdout.readline().strip() == "ready", "the subscriber did not start"
        cpu, loop, sub_cpu = cpu_seconds(pid), cpu_seconds(pid, pid), cpu_seconds(sub.pid)
        tps = decode_tps(c, tokens)
        time.sleep(0.2)  # the subscriber takes the last batch
        out = {"tps": tps, "daemon_cpu_ms_per_token": (cpu_seconds(pid) - cpu) * 1e3 / tokens,
               "loop_cpu_ms_per_token": (cpu_seconds(pid, pid) - loop) * 1e3 / tokens,
               "subscriber_cpu_ms_per_token": (cpu_seconds(sub.pid) - sub_cpu) * 1e3 / tokens}
    finally:
        sub.terminate()
        sub.wait(30)
    return out


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
    ap.add_argument("--out", default="events_overhead", help="name of the .json and .md written here")
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
            pid = daemon_pid(url)
            with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
                decode_tps(c, 32)  # load and warm up
                for i in range(args.rounds):
                    load = os.getloadavg()[0]
                    if i % 2 == 0:
                        a = alone(c, pid, args.tokens)
                        w = watched(url, c, pid, args.tokens)
                    else:
                        w = watched(url, c, pid, args.tokens)
                        a = alone(c, pid, args.tokens)
                    rows.append({"round": i, "alone": a, "watched": w, "ratio": w["tps"] / a["tps"], "loadavg_1m": load})
                    print(f"round {i}: alone {a['tps']:7.1f} tok/s  watched {w['tps']:7.1f} tok/s  "
                          f"ratio {w['tps'] / a['tps']:.3f}  daemon CPU ms/token {a['daemon_cpu_ms_per_token']:.2f} -> "
                          f"{w['daemon_cpu_ms_per_token']:.2f}, loop thread {a['loop_cpu_ms_per_token']:.3f} -> "
                          f"{w['loop_cpu_ms_per_token']:.3f}, subscriber {w['subscriber_cpu_ms_per_token']:.2f}  "
                          f"(load {load:.1f})", flush=True)

    def med(side: str, key: str) -> float:
        return statistics.median(r[side][key] for r in rows)

    a_tps, w_tps, ratio_med = med("alone", "tps"), med("watched", "tps"), statistics.median(r["ratio"] for r in rows)
    a_cpu, w_cpu = med("alone", "daemon_cpu_ms_per_token"), med("watched", "daemon_cpu_ms_per_token")
    s_cpu = med("watched", "subscriber_cpu_ms_per_token")
    a_loop, w_loop = med("alone", "loop_cpu_ms_per_token"), med("watched", "loop_cpu_ms_per_token")
    out = {"model": args.gguf.name, "backend": "llamacpp (auto)", "daemon_env": env, "cpu": cpu_model(),
           "cores": os.cpu_count(), "tokens": args.tokens, "rounds": rows, "alone_median_tps": a_tps,
           "watched_median_tps": w_tps, "ratio_of_medians": w_tps / a_tps, "median_of_ratios": ratio_med,
           "daemon_cpu_ms_per_token": {"alone": a_cpu, "watched": w_cpu},
           "loop_thread_cpu_ms_per_token": {"alone": a_loop, "watched": w_loop},
           "subscriber_cpu_ms_per_token": s_cpu, "note": "machine shared with other work unless stated otherwise"}
    (HERE / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    md = ["| round | tok/s alone | watched | ratio | daemon CPU ms/token alone | watched | loop thread CPU "
          "ms/token alone | watched | subscriber CPU ms/token | load (1 min) |", "|---|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['round']} | {r['alone']['tps']:.1f} | {r['watched']['tps']:.1f} | {r['ratio']:.3f} | "
           f"{r['alone']['daemon_cpu_ms_per_token']:.2f} | {r['watched']['daemon_cpu_ms_per_token']:.2f} | "
           f"{r['alone']['loop_cpu_ms_per_token']:.3f} | {r['watched']['loop_cpu_ms_per_token']:.3f} | "
           f"{r['watched']['subscriber_cpu_ms_per_token']:.2f} | {r['loadavg_1m']:.1f} |" for r in rows]
    md += ["", f"{args.gguf.name}, llama.cpp, daemon settings {env or 'default'}, {out['cpu']}, {out['cores']} cores, "
           f"{args.tokens} tokens per run: median alone {a_tps:.1f} tok/s, watched {w_tps:.1f} tok/s, ratio of "
           f"medians **{w_tps / a_tps:.3f}**, median of per-round ratios {ratio_med:.3f}; daemon CPU per token "
           f"{a_cpu:.2f} ms alone, {w_cpu:.2f} ms watched (x{w_cpu / a_cpu:.3f}), of which the event loop's "
           f"{a_loop:.3f} and {w_loop:.3f} ms; the subscriber {s_cpu:.2f} ms."]
    (HERE / f"{args.out}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
