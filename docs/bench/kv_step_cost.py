"""Step cost vs the tokens held, through evenflow's llama.cpp runner: what does a decode pay for? (issue 11)

Four sequences holding `--own` tokens each decode while a fifth holds X tokens (a long prompt being ingested).
For each KV layout (and weight repacking on/off) the runner times, at every X: the 4 decodes alone, the 4 decodes
plus a 1-, 4- and 16-token chunk of the long sequence (the steps chunked prefill is made of), and a 512-token
prompt step alone. Wall time of `llama_decode` on the daemon's threads, median of 5; the configurations are
loaded together and measured in turn, step by step, so that they compare within one run.

    python docs/bench/kv_step_cost.py --model bench-q8.gguf [--held 0,2048,8192,16384] [--configs streams,unified]
        # ~20 min on 2 cores; writes kv_step_cost.json/.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from evenflow.backends.base import Batch, RunnerSettings
from evenflow.backends.llamacpp.runner import load

HERE = Path(__file__).resolve().parent
BS = 16
CHUNKS = (1, 4, 16)


def cpu_model() -> str:
    return next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                platform.processor())


class Seqs:
    """Sequences of synthetic tokens on one runner; each step's spans are built from their next positions."""

    def __init__(self, runner) -> None:
        self.r, self.pos = runner, {}

    def step(self, spans: list[tuple[int, int]]) -> float:
        b = []
        for slot, n in spans:
            p0 = self.pos.get(slot, 0)
            b.append((slot, [300 + (p0 + j) % 20000 for j in range(n)], p0, [], True))
            self.pos[slot] = p0 + n
        self.r.step(Batch.from_spans(b, BS))
        return self.r.last_decode_s

    def fill(self, slot: int, n: int) -> None:
        while n > 0:
            self.step([(slot, min(n, 512))])
            n -= min(n, 512)


def measure_all(model: Path, configs: list[tuple[str, str]], held: list[int], own: int, threads: int,
                prefill: bool) -> list[dict]:
    """Every configuration loaded at once and measured in turn, quantity by quantity: this machine's speed drifts
    by tens of percent from one minute to the next, so only measurements taken side by side compare."""
    window = max(held) + 2048
    runs = []
    try:
        for layout, repack in configs:
            os.environ["EVENFLOW_LLAMACPP_KV"] = layout
            os.environ["EVENFLOW_LLAMACPP_EXTRA_BUFTS"] = repack
            r = load(str(model), RunnerSettings(max_num_seqs=5, block_size=BS, context_length=window,
                                                num_threads=threads, max_num_batched_tokens=512,
                                                num_kv_blocks=5 * window // BS))
            runs.append(Seqs(r))
            for slot in range(4):
                runs[-1].fill(slot, own)
        rows = []
        long_slot, dec = 4, [(slot, 1) for slot in range(4)]
        for x in held:
            for s in runs:
                s.fill(long_slot, x - s.pos.get(long_slot, 0))
            got = [{"layout": s.r.kv_layout, "repack": s.r.extra_bufts, "own": own, "long_holds": x,
                    "tokens_held": 4 * own + x} for s in runs]
            what = [("decodes_4_ms", dec, 5)]
            if x:
                what += [(f"plus_{c}_ms", dec + [(long_slot, c)], 5) for c in CHUNKS]
                if prefill:  # a prompt with nobody else running: the TTFT-alone step
                    what.append(("prefill_512_ms", [(long_slot, 512)], 1))
            for key, spans, reps in what:
                times: list[list[float]] = [[] for _ in runs]
                for rep in range(reps + 1):  # the first round warms each shape up
                    for k, s in enumerate(runs):
                        t = s.step(spans)
                        if rep:
                            times[k].append(t)
                for k in range(len(runs)):
                    got[k][key] = statistics.median(times[k]) * 1e3
            for g in got:
                print(g, flush=True)
            rows += got
        return rows
    finally:
        for s in runs:
            s.r.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench-q8.gguf", help="the bench-shaped Q8_0 GGUF (../shared/tools/make_gguf.py)")
    ap.add_argument("--held", default="0,2048,8192,16384", help="tokens the long sequence holds, in order")
    ap.add_argument("--own", type=int, default=512, help="tokens each decoding sequence holds")
    ap.add_argument("--configs", default="streams:off,unified:off,streams:on",
                    help="layout:repacking pairs (on: repacking where the CPU takes it; each holds 5 windows of KV)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-prefill", action="store_true", help="skip the 512-token prompt step at each X")
    ap.add_argument("--out", default=str(HERE / "kv_step_cost.json"))
    args = ap.parse_args()
    held = [int(x) for x in args.held.split(",")]
    configs = [tuple(c.split(":")) for c in args.configs.split(",")]
    rows = measure_all(Path(args.model), configs, held, args.own, args.threads, not args.no_prefill)
    meta = {"model": Path(args.model).name, "cpu": cpu_model(), "threads": args.threads,
            "timing": "wall time of llama_decode, median of 5 (512-token prompt: of 1), configurations in turn",
          "date": time.strftime("%Y-%m-%d %H:%M"),
            "loadavg_end": os.getloadavg()}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = [f"llama.cpp step cost through the runner (ms, {args.threads} threads, wall, configurations measured in "
          f"turn) — {meta['model']}, "
          f"{meta['cpu']}, {meta['date']}", "",
          f"Four sequences hold {args.own} tokens each and decode; a fifth (the long prompt) holds X tokens.", "",
          "| layout | repacking | X (long sequence holds) | 4 decodes | + 1 prompt token | + 4 | + 16 | 512 prompt tokens "
          "alone |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{r[k]:.1f}" if k in r else "–" for k in [f"plus_{c}_ms" for c in CHUNKS] + ["prefill_512_ms"])
        md.append(f"| {r['layout']} | {'on' if r['repack'] else 'off'} | {r['long_holds']} | {r['decodes_4_ms']:.1f} | "
                  f"{cells} |")
    Path(args.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
