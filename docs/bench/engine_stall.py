"""Engine-level stall benchmark: N streams decoding while a long prompt arrives, per scheduling policy.

Runs the engine directly (no HTTP) on one backend and prints, per policy: P50/P99/max inter-token gap
of the short streams before and during the long prompt's ingestion, the long prompt's TTFT, and
decode tokens/s. Writes the table and JSON next to this file.

    python docs/bench/engine_stall.py --backend torch --preset bench
    python docs/bench/engine_stall.py --backend llamacpp --preset bench --gguf-dtype q8_0 --threads 2
"""
from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from pathlib import Path

import numpy as np

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.backends.synthetic import cached_model, make_spec
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams

HERE = Path(__file__).resolve().parent


def percentiles(gaps_s: list[float]) -> dict[str, float]:
    if not gaps_s:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    g = np.array(gaps_s) * 1e3
    return {"n": len(g), "p50_ms": float(np.percentile(g, 50)), "p99_ms": float(np.percentile(g, 99)),
            "max_ms": float(g.max())}


def consume(stream, times: list[float], counts: list[int]) -> None:
    for d in stream:
        if d.token_ids:
            times.append(time.perf_counter())
            counts.append(len(d.token_ids))


def run_policy(runner, cfg: EngineConfig, n_streams: int, prompt_len: int, warm_tokens: int,
               before_tokens: int, after_tokens: int, vocab: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    engine = Engine(runner, cfg, name="bench")
    engine.start()
    try:
        greedy = SamplingParams(temperature=0, num_predict=100_000, repeat_penalty=1.0)
        streams, times = [], []
        for i in range(n_streams):
            prompt = rng.integers(10, vocab - 10, size=32).tolist()
            s = engine.submit(prompt, greedy, loop=None)
            t: list[float] = []
            th = threading.Thread(target=consume, args=(s, t, []), daemon=True)
            th.start()
            streams.append((s, th))
            times.append(t)
        # warm up, then measure a window with only decodes running
        while min(len(t) for t in times) < warm_tokens:
            time.sleep(0.005)
        t_before = time.perf_counter()
        while min(len(t) for t in times) < warm_tokens + before_tokens:
            time.sleep(0.005)
        long_prompt = rng.integers(10, vocab - 10, size=prompt_len).tolist()
        t_arrive = time.perf_counter()
        ls = engine.submit(long_prompt, SamplingParams(temperature=0, num_predict=after_tokens), loop=None)
        long_times: list[float] = []
        lt = threading.Thread(target=consume, args=(ls, long_times, []), daemon=True)
        lt.start()
        while not long_times:
            time.sleep(0.002)
        t_first = long_times[0]
        mark = [len(t) for t in times]
        while min(len(t) - m for t, m in zip(times, mark)) < after_tokens:
            time.sleep(0.005)
        for s, _ in streams:
            engine.abort(s.seq_id)
        for _, th in streams:
            th.join(10)
        lt.join(60)
        before, during = [], []
        decoded_before = 0
        for t in times:
            for a, b in zip(t, t[1:]):
                if t_before <= a and b <= t_arrive:
                    before.append(b - a)
                elif b > t_arrive and a < t_first:
                    during.append(b - a)
            decoded_before += sum(1 for x in t if t_before <= x <= t_arrive)
        return {
            "before": percentiles(before), "during": percentiles(during),
            "ttft_s": t_first - t_arrive,
            "decode_tok_s": decoded_before / max(t_arrive - t_before, 1e-9),
            "steps": engine.steps,
        }
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="torch", choices=["torch", "llamacpp", "mlx"])
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--format", default=None, choices=["hf", "gguf"], help="default: hf for torch/mlx, gguf for llamacpp")
    ap.add_argument("--gguf-dtype", default="q8_0")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--before-tokens", type=int, default=12)
    ap.add_argument("--after-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--budgets", default="16,64,256", help="fixed token budgets (chunked)")
    ap.add_argument("--targets", default="150", help="adaptive ITL targets in ms")
    ap.add_argument("--no-monolithic", action="store_true")
    ap.add_argument("--ab-cost-model", action="store_true",
                    help="also run each adaptive target with the per-sequence attention model on a shared-KV runner")
    ap.add_argument("--out", default=None, help="JSON path (default docs/bench/engine_stall_<backend>.json)")
    args = ap.parse_args()

    fmt = args.format or ("gguf" if args.backend == "llamacpp" else "hf")
    spec = make_spec(args.preset)
    paths = cached_model(spec, formats=(fmt,), gguf_dtype=args.gguf_dtype)
    max_tokens = max(args.prompt_len, 2048) + 64
    settings = RunnerSettings(max_num_seqs=args.streams + 1, context_length=args.prompt_len + 256,
                              max_num_batched_tokens=max_tokens, num_threads=args.threads, dtype="float32")
    runner = load_runner(args.backend, str(paths[fmt]), settings)
    policies: list[tuple[str, EngineConfig]] = []
    for t in [float(x) for x in args.targets.split(",") if x]:
        policies.append((f"adaptive {t:g} ms", EngineConfig(max_num_batched_tokens=max_tokens, target_itl_ms=t)))
    for b in [int(x) for x in args.budgets.split(",") if x]:
        policies.append((f"chunked budget {b}", EngineConfig(max_num_batched_tokens=b)))
    if not args.no_monolithic:
        policies.append(("monolithic", EngineConfig(prefill_mode="monolithic", max_num_batched_tokens=max_tokens)))
    if args.ab_cost_model and getattr(runner, "shared_kv", False):
        policies += [(f"{n} (per-sequence cost model)", c) for n, c in policies if n.startswith("adaptive")]
    rows = []
    for name, cfg in policies:
        runner.shared_kv = not name.endswith("(per-sequence cost model)") and type(runner).__dict__.get("shared_kv", False)
        r = run_policy(runner, cfg, args.streams, args.prompt_len, warm_tokens=4, before_tokens=args.before_tokens,
                       after_tokens=args.after_tokens, vocab=runner.info.vocab_size)
        r["policy"] = name
        rows.append(r)
        print(f"{name:22s} before p50/p99/max {r['before']['p50_ms']:7.1f} {r['before']['p99_ms']:7.1f} "
              f"{r['before']['max_ms']:7.1f} ms | during p50/p99/max {r['during']['p50_ms']:7.1f} "
              f"{r['during']['p99_ms']:7.1f} {r['during']['max_ms']:7.1f} ms | TTFT {r['ttft_s']:6.2f} s | "
              f"decode {r['decode_tok_s']:6.1f} tok/s", flush=True)
    runner.close()
    meta = {"backend": args.backend, "preset": args.preset, "format": fmt,
            "gguf_dtype": args.gguf_dtype if fmt == "gguf" else None, "streams": args.streams,
            "prompt_len": args.prompt_len, "threads": args.threads, "machine": platform.processor() or platform.machine(),
            "cpus": __import__("os").cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M")}
    out = Path(args.out) if args.out else HERE / f"engine_stall_{args.backend}.json"
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    md = [f"Engine stall benchmark — {args.backend}, preset {args.preset} ({fmt}), {args.streams} streams + "
          f"{args.prompt_len}-token prompt, {meta['cpus']} CPUs, {meta['date']}", "",
          "| policy | P50 / P99 / max gap before (ms) | P50 / P99 / max gap during (ms) | long-prompt TTFT (s) | decode tok/s |",
          "|---|---|---|---|---|"]
    for r in rows:
        b, d = r["before"], r["during"]
        md.append(f"| {r['policy']} | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} / {b['max_ms']:.1f} | "
                  f"{d['p50_ms']:.1f} / {d['p99_ms']:.1f} / {d['max_ms']:.1f} | {r['ttft_s']:.2f} | {r['decode_tok_s']:.1f} |")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
