"""Stall benchmark, MLX vs torch on the same synthetic weights: 4 streams decode, then a long prompt arrives.

For each backend and each prefill setting (chunked at a few budgets, monolithic) it reports the 4 streams'
inter-token gaps before vs during the long prompt's ingestion (P50/P99/max), the long prompt's TTFT and the
decode tokens/s, prints a table and writes JSON next to this script.

    python docs/bench/mlx_vs_torch_stall.py                       # demo preset, 1024-token prompt
    python docs/bench/mlx_vs_torch_stall.py --preset bench --prompt-len 2048 --budgets 128 512
    python docs/bench/mlx_vs_torch_stall.py --backends mlx        # e.g. on a Mac without torch
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from evenflow.backends.base import Runner, RunnerSettings, load_runner
from evenflow.backends.synthetic import cached_model, make_spec
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams

log = logging.getLogger("mlx_vs_torch_stall")
N_STREAMS = 4


def percentiles(gaps_ms: list[float]) -> dict[str, float]:
    if not gaps_ms:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    a = np.asarray(gaps_ms)
    return {"n": len(a), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def run_scenario(runner: Runner, mode: str, budget: int, prompt_len: int, warm_steps: int, vocab: int,
                 seed: int = 0) -> dict[str, Any]:
    """Drive one engine in this thread: decodes alone for `warm_steps`, then the long prompt until its first token."""
    engine = Engine(runner, EngineConfig(prefill_mode=mode, max_num_batched_tokens=budget, max_num_seqs=8,
                                         target_itl_ms=0))
    rng = random.Random(seed)
    token_times: dict[int, list[float]] = {}
    first_token: dict[int, float] = {}

    def on_event(ev: dict) -> None:  # runs on this thread (run_once), right after the step commits
        if ev.get("type") == "request" and ev.get("event") in ("first_token", "token"):
            now = time.perf_counter()
            token_times.setdefault(ev["seq_id"], []).append(now)
            first_token.setdefault(ev["seq_id"], now)

    engine.subscribe(on_event)
    greedy = SamplingParams(temperature=0, num_predict=100_000)
    streams = [engine.submit([rng.randrange(5, vocab - 64) for _ in range(32)], greedy, loop=None)
               for _ in range(N_STREAMS)]
    ids = [s.seq_id for s in streams]
    while min(len(token_times.get(i, [])) for i in ids) < warm_steps:
        engine.run_once()
    t_arrive = time.perf_counter()
    long_prompt = [rng.randrange(5, vocab - 64) for _ in range(prompt_len)]
    big = engine.submit(long_prompt, SamplingParams(temperature=0, num_predict=4), loop=None)
    while big.seq_id not in first_token:
        engine.run_once()
    t_first = first_token[big.seq_id]
    for _ in range(3):  # a few steps after, so the last in-window gap is closed
        engine.run_once()
    before, during, n_before, n_during = [], [], 0, 0
    warm_start = None
    for i in ids:
        ts = token_times[i]
        for a, b in zip(ts, ts[1:]):
            if b <= t_arrive and a >= ts[2]:  # skip the first gaps (admission of the 4 prompts)
                before.append((b - a) * 1e3)
                n_before += 1
                warm_start = a if warm_start is None else min(warm_start, a)
            elif t_arrive < b <= t_first:
                during.append((b - a) * 1e3)
                n_during += 1
    for s in streams + [big]:
        engine.abort(s.seq_id)
    while engine.run_once():
        pass
    assert engine.stats().kv_blocks_used == 0, "KV leaked"
    return {
        "mode": mode, "budget": budget if mode == "chunked" else None,
        "itl_before_ms": percentiles(before), "itl_during_ms": percentiles(during),
        "ttft_ms": (t_first - t_arrive) * 1e3,
        "decode_tok_s_before": n_before / (t_arrive - warm_start) if warm_start else float("nan"),
        "decode_tok_s_during": n_during / (t_first - t_arrive),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="demo", choices=["tiny", "demo", "bench"])
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--budgets", type=int, nargs="+", default=[64, 256], help="chunked token budgets per step")
    ap.add_argument("--backends", nargs="+", default=["mlx", "torch"])
    ap.add_argument("--warm-steps", type=int, default=20, help="decode steps measured before the prompt arrives")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spec = make_spec(args.preset, text_only_output=True)  # greedy never picks EOS: streams run until aborted
    path = str(cached_model(spec, formats=("hf",))["hf"])
    results: list[dict[str, Any]] = []
    settings = RunnerSettings(max_num_seqs=8, context_length=args.prompt_len + 512, dtype=args.dtype,
                              max_num_batched_tokens=max(args.prompt_len + N_STREAMS, *args.budgets))
    for backend in args.backends:
        runner = load_runner(backend, path, settings)
        run_scenario(runner, "monolithic", args.prompt_len, args.prompt_len, 3, spec.vocab_size, seed=99)  # warm-up
        for mode, budget in [("chunked", b) for b in args.budgets] + [("monolithic", args.prompt_len + N_STREAMS)]:
            r = run_scenario(runner, mode, budget, args.prompt_len, args.warm_steps, spec.vocab_size)
            r["backend"] = backend
            results.append(r)
        runner.close()
    hdr = (f"{'backend':7} {'prefill':15} | {'ITL before p50/p99/max ms':>26} | {'ITL during p50/p99/max ms':>26} | "
           f"{'TTFT ms':>8} | {'tok/s before':>12} {'during':>7}")
    print(f"\n{args.preset} preset ({spec.parameter_count() / 1e6:.1f}M params, {args.dtype}), "
          f"{N_STREAMS} decoding streams, {args.prompt_len}-token prompt arrives; {platform.machine()} CPU\n")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        b, d = r["itl_before_ms"], r["itl_during_ms"]
        name = f"chunked/{r['budget']}" if r["mode"] == "chunked" else "monolithic"
        print(f"{r['backend']:7} {name:15} | {b['p50']:8.1f} {b['p99']:8.1f} {b['max']:8.1f} | "
              f"{d['p50']:8.1f} {d['p99']:8.1f} {d['max']:8.1f} | {r['ttft_ms']:8.0f} | "
              f"{r['decode_tok_s_before']:12.1f} {r['decode_tok_s_during']:7.1f}")
    Path(args.out).write_text(json.dumps({
        "preset": args.preset, "prompt_len": args.prompt_len, "streams": N_STREAMS, "dtype": args.dtype,
        "machine": platform.platform(), "results": results}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
