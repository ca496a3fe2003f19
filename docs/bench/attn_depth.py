"""What one prompt chunk costs deep into its own sequence, straight through llama.cpp (issue 11's remaining miss).

One sequence holds D tokens; a chunk of n more is decoded (logits for its last token, as in chunked prefill) and
removed again, so every measurement sits at the same depth. Median wall time of `llama_decode` over --reps, on
--threads threads. The cost at depth 0 is the weight pass; what a chunk adds at depth D over depth 0 is attention
over the D cells it holds. Each KV configuration is its own context on the same model, measured in turn, quantity
by quantity, so they compare within one run:

    f16     f16 K and V, flash attention off (Ollama's default; evenflow's on a CPU until stop 24)
    f16-fa  f16 K and V, flash attention on
    q8k     K as q8_0, V f16, flash attention off (llama.cpp needs flash attention for a quantized V); the
            default on a CPU since stop 24 (OLLAMA_KV_CACHE_TYPE=auto)
    f32     f32 K and V (twice the bytes: slower here)
    bf16    bf16 K and V (as dear as f16 on an AVX2 CPU)

    python docs/bench/attn_depth.py --model bench-q8.gguf [--depths 0,4096,8192] [--chunks 1,4,16]
        # ~6 min on 2 cores; writes attn_depth.json/.md
    python docs/bench/attn_depth.py --model bench-q8.gguf --depths 0,8192,16384 --chunks 1,2,4 --configs f16,q8k \
        --reps 7 --out docs/bench/attn_depth_kv    # the q8_0-K table of docs/performance.md

For where the time goes, profile a running measurement: `perf record -g -p PID -- sleep 8; perf report`.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import llama_cpp.llama_cpp as L

from evenflow.backends.llamacpp.native import ensure_backend

HERE = Path(__file__).resolve().parent
F32, F16, Q8_0, BF16 = 0, 1, 8, 30  # ggml_type
CONFIGS = {"f16": (F16, F16, 0), "f32": (F32, F32, 0), "bf16": (BF16, BF16, 0), "f16-fa": (F16, F16, 1), "q8k": (Q8_0, F16, 0)}  # type_k, type_v, flash_attn_type


def cpu_model() -> str:
    return next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                platform.processor())


class Seq:
    """One llama.cpp context holding one sequence of synthetic tokens."""

    def __init__(self, model, n_ctx: int, config: str, threads: int, batch) -> None:
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 512, 512, 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        cp.type_k, cp.type_v, cp.flash_attn_type = CONFIGS[config]
        self.ctx = L.llama_init_from_model(model, cp)
        if not self.ctx:
            raise SystemExit(f"llama.cpp refused the {config} context")
        self.batch, self.held = batch, 0

    def decode(self, n: int) -> float:
        b = self.batch
        b.n_tokens = n
        for i in range(n):
            p = self.held + i
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = 300 + p % 20000, p, 1, int(i == n - 1)
            b.seq_id[i][0] = 0
        t = time.perf_counter()
        if L.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")
        return time.perf_counter() - t

    def fill(self, depth: int) -> None:
        while self.held < depth:
            n = min(512, depth - self.held)
            self.decode(n)
            self.held += n

    def chunk_ms(self, n: int) -> float:
        """Decode n tokens at the held depth and take them out again."""
        ms = self.decode(n) * 1000
        L.llama_memory_seq_rm(L.llama_get_memory(self.ctx), 0, self.held, -1)
        return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the bench-shaped Q8_0 GGUF")
    ap.add_argument("--depths", default="0,4096,8192")
    ap.add_argument("--chunks", default="1,4,16")
    ap.add_argument("--configs", default="f16,f16-fa,q8k")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "attn_depth")
    a = ap.parse_args()
    depths, chunks = [int(x) for x in a.depths.split(",")], [int(x) for x in a.chunks.split(",")]
    configs = a.configs.split(",")
    ensure_backend()
    model = L.llama_model_load_from_file(str(a.model).encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"cannot load {a.model}")
    batch = L.llama_batch_init(512, 0, 1)
    seqs = {c: Seq(model, max(depths) + 1024, c, a.threads, batch) for c in configs}
    rows = []
    for depth in depths:
        for s in seqs.values():
            s.fill(depth)
        for n in chunks:
            ms = {c: [] for c in configs}
            for _ in range(a.reps):  # configurations in turn, repetition by repetition
                for c, s in seqs.items():
                    ms[c].append(s.chunk_ms(n))
            for c in configs:
                rows.append({"config": c, "depth": depth, "chunk": n, "ms": statistics.median(ms[c])})
            print(f"depth {depth:6d}  chunk {n:3d}  " + "  ".join(f"{c} {statistics.median(ms[c]):8.1f} ms"
                                                              for c in configs), flush=True)
    meta = {"model": a.model.name, "cpu": cpu_model(), "threads": a.threads, "reps": a.reps,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    a.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    base = {(r["config"], r["chunk"]): r["ms"] for r in rows if r["depth"] == depths[0]}
    lines = [f"One prompt chunk at depth D through llama.cpp (median ms of `llama_decode`, {a.threads} threads, "
             f"{a.reps} reps) — {a.model.name}, {meta['cpu']}, {meta['when']}", "",
             "| D (tokens held) | chunk | " + " | ".join(configs) + f" | added over D={depths[0]}, per chunk token ("
             + ", ".join(configs) + ") |",
             "|---|---|" + "---|" * len(configs) + "---|"]
    for depth in depths:
        for n in chunks:
            got = {r["config"]: r["ms"] for r in rows if r["depth"] == depth and r["chunk"] == n}
            added = " / ".join(f"{(got[c] - base[c, n]) / n:.1f}" for c in configs)
            lines.append(f"| {depth} | {n} | " + " | ".join(f"{got[c]:.1f}" for c in configs) + f" | {added} |")
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
