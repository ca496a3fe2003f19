"""What a gap between decoding streams costs (llama.cpp's per-sequence KV streams, through evenflow's runner).

llama.cpp puts only consecutive stream ids into one micro-batch, so four decodes in streams 0, 2, 4, 6 run as four
passes over the weights where 0, 1, 2, 3 run as one. Eight sequences hold `--own` tokens each; the runner times
4 decodes over different sets of streams, the sets taking turns round by round (median of `--rounds`).

    python docs/bench/stream_gaps.py --model bench-q8.gguf      # ~2 min on 2 cores; writes stream_gaps.json/.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from evenflow.backends.base import RunnerSettings
from evenflow.backends.llamacpp.runner import load
from kv_step_cost import BS, Seqs, cpu_model

HERE = Path(__file__).resolve().parent
SETS = {"0,1,2,3 (one run)": [0, 1, 2, 3], "0,1,2,4 (two runs)": [0, 1, 2, 4], "0,2,4,6 (four runs)": [0, 2, 4, 6],
        "0..7 (eight decodes, one run)": list(range(8))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench-q8.gguf")
    ap.add_argument("--own", type=int, default=512, help="tokens each sequence holds")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "stream_gaps.json"))
    a = ap.parse_args()
    os.environ["EVENFLOW_LLAMACPP_KV"] = "streams"
    window = a.own + 1024
    r = load(a.model, RunnerSettings(max_num_seqs=8, block_size=BS, context_length=window, num_threads=a.threads,
                                     max_num_batched_tokens=512, num_kv_blocks=8 * window // BS))
    try:
        s = Seqs(r)
        for slot in range(8):  # fresh slots take the lowest empty streams: slot i runs in stream i
            s.fill(slot, a.own)
        assert [r._cells.stream_of(i) for i in range(8)] == list(range(8))
        times: dict[str, list[float]] = {k: [] for k in SETS}
        for rnd in range(a.rounds + 1):  # round 0 warms each shape up
            for k, slots in SETS.items():
                t = s.step([(slot, 1) for slot in slots])
                if rnd:
                    times[k].append(t * 1e3)
    finally:
        r.close()
    rows = [{"streams": k, "median_ms": statistics.median(v), "samples_ms": v} for k, v in times.items()]
    meta = {"model": Path(a.model).name, "cpu": cpu_model(), "threads": a.threads, "own": a.own,
            "date": time.strftime("%Y-%m-%d %H:%M"), "loadavg_end": os.getloadavg()}
    Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = [f"Decodes over gapped llama.cpp streams (ms, wall time of llama_decode, median of {a.rounds}, sets in turn) — "
          f"{meta['model']}, {meta['cpu']}, {a.threads} threads, each sequence holds {a.own} tokens, {meta['date']}", "",
          "| decoding streams | median ms |", "|---|---|"] + [f"| {x['streams']} | {x['median_ms']:.1f} |" for x in rows]
    Path(a.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
