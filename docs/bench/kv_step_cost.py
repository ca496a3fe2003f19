"""Step cost vs the tokens cached, straight over llama.cpp (no engine): what does a decode pay for?

Four short sequences (64 tokens each) decode while a fifth holds X tokens. For each KV layout we time
three steps: the 4 decodes alone, 4 decodes + 1 decode of the long sequence, 4 decodes + an 8-token
chunk of it. Timing is the process's CPU time of `llama_decode` on ONE thread (median of 5), so the
table compares work, not how busy a shared machine was; wall time on 2 threads is roughly half.

    python docs/bench/kv_step_cost.py [--model bench-q8.gguf]   # ~10 min on 2 cores; writes kv_step_cost.json/.md
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import llama_cpp.llama_cpp as L

HERE = Path(__file__).resolve().parent
SHORT = 64  # tokens each decoding sequence holds


class Ctx:
    """One llama.cpp context with its own batch; tracks each sequence's next position."""

    def __init__(self, model, n_ctx: int, seqs: int, unified: bool, flash: bool) -> None:
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.n_outputs_max = n_ctx, 512, 512, seqs, seqs
        cp.kv_unified, cp.no_perf, cp.flash_attn_type = unified, True, 1 if flash else 0
        cp.n_threads = cp.n_threads_batch = 1
        self.ctx = L.llama_init_from_model(model, cp)
        if not self.ctx:
            raise RuntimeError(f"could not create a context (n_ctx={n_ctx}, unified={unified})")
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(512, 0, 1)
        self.pos: dict[int, int] = {}

    def step(self, spans: list[tuple[int, int]]) -> float:
        """One llama_decode over (seq, tokens) spans; CPU seconds."""
        b, n = self.batch, 0
        for seq, k in spans:
            p0 = self.pos.get(seq, 0)
            for j in range(k):
                b.token[n], b.pos[n], b.n_seq_id[n] = 300 + (p0 + j) % 20000, p0 + j, 1
                b.seq_id[n][0], b.logits[n] = seq, int(j == k - 1)
                n += 1
            self.pos[seq] = p0 + k
        b.n_tokens = n
        t = time.process_time()
        if L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        return time.process_time() - t

    def fill(self, seq: int, k: int) -> None:
        while k > 0:
            self.step([(seq, min(k, 512))])
            k -= min(k, 512)

    def drop(self, seq: int) -> None:
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        self.pos.pop(seq, None)

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)


def median_ms(f, reps: int = 5) -> float:
    f()  # the first step after a fill pays for graph changes
    return statistics.median(f() for _ in range(reps)) * 1e3


def measure(c: Ctx, row: dict) -> dict:
    dec = [(s, 1) for s in range(4)]
    row["decodes_4_ms"] = median_ms(lambda: c.step(dec))
    if c.pos.get(4):
        row["decodes_5_ms"] = median_ms(lambda: c.step(dec + [(4, 1)]))
        row["decodes_4_chunk_8_ms"] = median_ms(lambda: c.step(dec + [(4, 8)]))
    return row


def run(model, n_ctx: int, unified: bool, flash: bool, held: list[int], drift: int = 0) -> list[dict]:
    """Rows for one layout; `drift` > 0 puts the long sequence's cells above a freed block of that size."""
    c = Ctx(model, n_ctx if unified else 5 * 8192, 8 if unified else 5, unified, flash)
    rows = []
    try:
        for s in range(4):
            c.fill(s, SHORT)
        if drift:
            c.fill(5, drift)
        for x in held:
            c.fill(4, x - c.pos.get(4, 0))
            if drift:
                c.drop(5)
            label = ("unified" if unified else "per-sequence streams") + (", flash attn" if flash else "")
            rows.append(measure(c, {"layout": label, "n_ctx": n_ctx if unified else 5 * 8192, "long_holds": x,
                                    "freed_below": drift, "tokens_held": 4 * SHORT + x}))
            print(rows[-1], flush=True)
    finally:
        c.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench-q8.gguf", help="the bench-shaped Q8_0 GGUF (../shared/tools/make_gguf.py)")
    ap.add_argument("--out", default=str(HERE / "kv_step_cost.json"))
    args = ap.parse_args()
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers, mp.use_extra_bufts = 0, False  # repacking: see docs/performance.md (it faults on this VM)
    model = L.llama_model_load_from_file(args.model.encode(), mp)
    if not model:
        raise SystemExit(f"could not load {args.model}")
    rows = run(model, 65536, True, False, [0, 2048, 6144])  # the default: one cache of 8 windows of 8192
    rows += run(model, 8192, True, False, [2048])  # same tokens, a cache 8x smaller
    rows += run(model, 65536, True, False, [2048], drift=6144)  # same tokens, placed high in the cache
    rows += run(model, 65536, False, False, [2048])
    rows += run(model, 65536, True, True, [2048])
    L.llama_model_free(model)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    meta = {"model": Path(args.model).name, "cpu": cpu, "threads": 1, "timing": "process CPU time, median of 5",
            "date": time.strftime("%Y-%m-%d %H:%M")}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = [f"llama.cpp step cost (CPU ms, 1 thread) — {meta['model']}, {cpu}, {meta['date']}", "",
          "| layout | n_ctx | long sequence holds | freed block below it | 4 decodes | + its decode | + its 8-token chunk |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['layout']} | {r['n_ctx']} | {r['long_holds']} | {r['freed_below']} | {r['decodes_4_ms']:.1f} | "
                  f"{r.get('decodes_5_ms', float('nan')):.1f} | {r.get('decodes_4_chunk_8_ms', float('nan')):.1f} |")
    Path(args.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
