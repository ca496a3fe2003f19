"""Replay a recorded daemon run's steps through the adaptive budget, offline: what did the fit believe? (issue 11)

`default_stall.py` keeps every `/api/events` step of an evenflow row. This feeds them, in order, to a fresh
`AdaptiveBudget` (the daemon's defaults on a CPU: 150 ms, floor 4, tile 1), asks it for each mixed step's chunk before
showing it the step's cost, and prints, every --every steps, the chunk the daemon took, the chunk the replay picks
(they agree when the replay is faithful) and the fitted coefficients:
t ~ a + b*decodes + e*[chunk] + c*chunk_tokens + d*attention_work, and the residual noise.

    python docs/bench/budget_replay.py --L 2048 --git 87b7743 [--every 25] [--row -1]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from evenflow.daemon.engine.budget import AdaptiveBudget, StepCost

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=HERE / "default_stall.json")
    ap.add_argument("--L", type=int, default=2048)
    ap.add_argument("--git", default="", help="the row's commit (default: any)")
    ap.add_argument("--row", type=int, default=-1, help="which of the matching evenflow rows")
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--target-ms", type=float, default=150.0)
    ap.add_argument("--floor", type=int, default=4)
    a = ap.parse_args()
    rows = [r for r in json.loads(a.json.read_text())["rows"] if r.get("server") == "evenflow" and r.get("L") == a.L
            and r.get("steps") and (not a.git or r.get("git") == a.git) and r.get("label") == "defaults"]
    if not rows:
        raise SystemExit("no such evenflow row with step events")
    row = rows[a.row]
    steps = row["steps"]
    t0 = steps[0]["time"]
    budget = AdaptiveBudget(a.target_ms, 512, tile=1, floor=a.floor)
    print(f"{row['label']} @ {row.get('git')}, L={a.L}, finished {row.get('finished')}")
    print("| t (s) | decodes | chunk start | chunk taken | replay | step ms | a | b | e | c (ms/token) "
          "| d (µs/pair) | noise ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    agree = mixed = 0
    for i, e in enumerate(steps):
        p, dec = e["prefill_tokens"], e["decodes"]
        if dec and e["prefill_seqs"] == 1 and e.get("prefilled"):
            start = e["prefilled"][0][1] - p
            decode_work = e["attention_work"] - (p * start + p * (p + 1) // 2)
            got = budget.prefill_budget(dec, decode_work, start)
            mixed += 1
            agree += got == p
            if i % a.every == 0 and budget.coef is not None:
                ca, cb, ce, cc, cd = budget.coef
                print(f"| {e['time'] - t0:.1f} | {dec} | {start} | {p} | {got} | {e['step_ms']:.1f} | {ca * 1e3:.1f} | "
                      f"{cb * 1e3:.1f} | {ce * 1e3:.1f} | {cc * 1e3:.2f} | {cd * 1e6:.3f} | {budget.noise * 1e3:.1f} |")
        budget.observe(StepCost(dec, p, e["attention_work"], e["step_ms"] / 1e3))
    print(f"\nthe replay took the daemon's chunk on {agree} of {mixed} mixed steps")


if __name__ == "__main__":
    main()
