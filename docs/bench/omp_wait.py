"""How llama.cpp's step time depends on how its OpenMP threads wait at barriers, on this machine as it is (issue 38).

llama-cpp-python's wheels build ggml with OpenMP: every op of a step ends at a barrier (hundreds per step), where
libgomp spins (300,000 iterations by default) before it sleeps. On a machine with more runnable threads than cores,
a thread spinning at a barrier burns the core its peer needs, and a step can take many times its fair share. Each
configuration runs in its own process (libgomp reads its environment once), the configurations take turns for
`--cycles` cycles, and each process times `--rounds` steps of 4 decodes and of 4 decodes + a 16-token prompt chunk
(4 sequences holding `--own` tokens, a fifth taking the chunk), through evenflow's runner at 2 threads.

    python docs/bench/omp_wait.py --model bench-q8.gguf                      # writes omp_wait.json / .md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# GOMP_SPINCOUNT of the measuring process: how many times a thread polls at a barrier before it sleeps (libgomp's
# default is 300,000 when OMP_WAIT_POLICY is unset; 0 is OMP_WAIT_POLICY=passive)
CONFIGS = {"300000 (libgomp's default)": "300000", "10000": "10000", "1000": "1000", "0 (passive)": "0"}


def measure(model: str, rounds: int, own: int, threads: int) -> dict:
    """In this process: median ms of llama_decode for 4 decodes, and for 4 decodes + a 16-token chunk."""
    sys.path.insert(0, str(HERE))
    from kv_step_cost import BS, Seqs

    from evenflow.backends.base import RunnerSettings
    from evenflow.backends.llamacpp.runner import load

    window = own + 2048
    r = load(model, RunnerSettings(max_num_seqs=8, block_size=BS, context_length=window, num_threads=threads,
                                   max_num_batched_tokens=512, num_kv_blocks=8 * window // BS))
    try:
        s = Seqs(r)
        for slot in range(5):
            s.fill(slot, own)
        dec, mix = [], []
        for _ in range(rounds):
            dec.append(s.step([(slot, 1) for slot in range(4)]) * 1e3)
            mix.append(s.step([(slot, 1) for slot in range(4)] + [(4, 16)]) * 1e3)
    finally:
        r.close()
    return {"decode_ms": statistics.median(dec), "mixed_ms": statistics.median(mix), "decode_max_ms": max(dec),
            "env": {k: os.environ.get(k, "") for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench-q8.gguf")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--own", type=int, default=512, help="tokens each sequence holds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "omp_wait.json"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.model, a.rounds, a.own, a.threads)))
        return
    names = a.configs.split(",")
    samples: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(a.cycles):
        for name in names:
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            env["GOMP_SPINCOUNT"] = CONFIGS[name]
            load0 = os.getloadavg()[0]
            p = subprocess.run([sys.executable, __file__, "--child", "--model", a.model, "--rounds", str(a.rounds),
                                "--own", str(a.own), "--threads", str(a.threads)], env=env, capture_output=True,
                               text=True)
            row = json.loads(p.stdout.strip().splitlines()[-1])
            row["loadavg"] = [load0, os.getloadavg()[0]]
            samples[name].append(row)
            print(name, json.dumps(row), flush=True)
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    meta = {"model": Path(a.model).name, "cpu": cpu, "threads": a.threads, "own": a.own, "rounds": a.rounds,
            "cycles": a.cycles, "date": time.strftime("%Y-%m-%d %H:%M"), "nproc": os.cpu_count()}
    rows = [{"config": n, "decode_ms": statistics.median(x["decode_ms"] for x in v),
             "mixed_ms": statistics.median(x["mixed_ms"] for x in v),
             "loadavg": statistics.median(x["loadavg"][0] for x in v), "samples": v} for n, v in samples.items()]
    old = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {"runs": []}
    old["runs"].append({"meta": meta, "rows": rows})
    Path(a.out).write_text(json.dumps(old, indent=1))
    md = [f"llama_decode wall time by OpenMP wait policy (ms, median over {a.cycles} cycles of the median of "
          f"{a.rounds} steps) — {meta['model']}, {cpu}, {a.threads} threads, {os.cpu_count()} cores, {meta['date']}",
          "", "| GOMP_SPINCOUNT | 4 decodes | 4 decodes + 16-token chunk | load average (1 min) during |",
          "|---|---|---|---|"]
    md += [f"| {r['config']} | {r['decode_ms']:.1f} | {r['mixed_ms']:.1f} | {r['loadavg']:.1f} |" for r in rows]
    Path(a.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
