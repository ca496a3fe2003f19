"""How fast prompt lookup could make extraction at best, on this machine and model: an analysis, not a user's figure
(docs/bench/speculative.py is that). Three parts, in-process on the llama.cpp runner (2 threads):

1. the cost curve: a decode span of 1 + k tokens with every row's logits (a verified draft) against a 1-token
   decode, at the end of a 1.5k-token document (median of --reps);
2. the answers: each extraction prompt of speculative.py answered greedily, speculation off (128 tokens);
3. replay: every draft prompt lookup (ngram.lookup) would propose along those answers, and how many of its tokens
   the answer kept; then tokens per unit of time for a fixed k, and for the best k per match length (an oracle that
   knows the acceptance of each match length in advance), with the measured costs.

    python docs/bench/speculative_ceiling.py [--reps 9]

Writes speculative_ceiling.json and .md next to this file.
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

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from speculative import EXTRACT, THREADS, TOOLS, document  # noqa: E402

from evenflow.backends.base import Batch, RunnerSettings, load_runner  # noqa: E402
from evenflow.daemon.engine.engine import Engine, EngineConfig  # noqa: E402
from evenflow.daemon.engine.ngram import MAX_MATCH, lookup  # noqa: E402
from evenflow.daemon.engine.params import SamplingParams  # noqa: E402

KS = list(range(9))


def cost_curve(runner, ids: list[int], reps: int) -> tuple[list[float], list[float]]:
    """Seconds of a 1 + k token span with every row's logits, and with the last row's only, relative to a 1-token
    decode, for k in KS."""
    bs, n = runner.block_size, len(ids)
    table = list(range(n // bs + 4))
    for pos in range(0, n, 512):
        chunk = ids[pos:pos + 512]
        runner.step(Batch.from_spans([(0, chunk, pos, table, pos + len(chunk) == n)], bs))
    times: dict[tuple[int, bool], list[float]] = {(k, every): [] for k in KS for every in (True, False)}
    for rep in range(reps + 2):
        for k, every in times:
            batch = Batch.from_spans([(0, ids[100:101 + k], n, table, True, every)], bs)
            t = time.perf_counter()
            runner.step(batch)
            if rep >= 2:  # two warm-up rounds
                times[(k, every)].append(time.perf_counter() - t)
            runner.rollback(0, n)
    runner.free(0)
    base = statistics.median(times[(0, True)])
    return ([statistics.median(times[(k, True)]) / base for k in KS],
            [statistics.median(times[(k, False)]) / base for k in KS])


def answers(runner, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    engine = Engine(runner, EngineConfig(speculative="off", target_itl_ms=None, max_num_batched_tokens=2048))
    engine.start()
    try:
        outs = []
        for ids in prompts:
            toks: list[int] = []
            for d in engine.submit(ids, SamplingParams(temperature=0, num_predict=max_tokens), loop=None):
                toks += d.token_ids
            outs.append(toks)
        return outs
    finally:
        engine.shutdown(10)


def replay(prompts: list[list[int]], outs: list[list[int]]) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(answer, tokens of it known) -> (match length, draft tokens kept, draft length) of a k=8 lookup."""
    seen = {}
    for a, (p, out) in enumerate(zip(prompts, outs)):
        toks = p + out
        for i in range(1, len(out)):
            draft, m = lookup(np.array(toks[:len(p) + i], dtype=np.int64), max(KS))
            kept = next((j for j, t in enumerate(draft) if len(p) + i + j >= len(toks) or t != toks[len(p) + i + j]),
                        len(draft))
            seen[(a, i)] = (m, kept, len(draft))
    return seen


def speed(seen, outs: list[list[int]], cost: list[float], policy: dict[int, int]) -> float:
    """Tokens per unit of time (a 1-token decode = 1) drafting policy[match length] tokens."""
    tokens = t = 0.0
    for a, out in enumerate(outs):
        i = 1
        while i < len(out):
            m, kept, n = seen[(a, i)]
            k = min(policy.get(m, 0), n, len(out) - i - 1)
            got = min(kept, k)
            t += cost[k]
            tokens += got + 1
            i += got + 1
    return tokens / t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3", choices=["gemma3", "smollm2"])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=str(HERE / "speculative_ceiling"))
    a = ap.parse_args()
    gguf = subprocess.run([sys.executable, str(TOOLS / "real_models.py"), a.model], check=True, capture_output=True,
                          text=True).stdout.strip()
    runner = load_runner("llamacpp", gguf, RunnerSettings(max_num_seqs=2, context_length=4096,
                                                          max_num_batched_tokens=2048, num_threads=THREADS))
    doc = document(10000)
    prompts = [runner.tokenizer.encode(doc + q) for _, q in EXTRACT]
    load0 = os.getloadavg()
    cost, last_only = cost_curve(runner, prompts[0][:1500], a.reps)
    outs = answers(runner, prompts, a.max_tokens)
    runner.close()
    seen = replay(prompts, outs)
    fixed = {k: speed(seen, outs, cost, {m: k for m in range(1, MAX_MATCH + 1)}) for k in KS}
    best = {m: 3 for m in range(1, MAX_MATCH + 1)}
    for _ in range(3):  # coordinate ascent over the k of each match length
        for m in best:
            best[m] = max(KS, key=lambda k: speed(seen, outs, cost, {**best, m: k}))
    by_match = {}
    for m, kept, _ in seen.values():
        s = by_match.setdefault(m, [0, 0])
        s[0] += 1
        s[1] += kept
    res = {"model": Path(gguf).name, "threads": THREADS, "loadavg": [load0, os.getloadavg()], "cost": cost, "cost_last_row_only": last_only,
           "fixed_k": fixed, "best_policy": best, "best": speed(seen, outs, cost, best),
           "kept_by_match": {m: s[1] / s[0] for m, s in sorted(by_match.items())},
           "lookups_by_match": {m: s[0] for m, s in sorted(by_match.items())}}
    Path(a.out + ".json").write_text(json.dumps(res, indent=1))
    lines = [f"# Prompt lookup's ceiling: {res['model']}, {THREADS} threads (llama.cpp runner in-process)", "",
             f"Load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (a shared machine: "
             "the cost ratios are medians of interleaved runs, still noisy).", "",
             "| k draft tokens | " + " | ".join(map(str, KS)) + " |", "|---" * (len(KS) + 1) + "|",
             "| step cost (1-token decode = 1) | " + " | ".join(f"{c:.2f}" for c in cost) + " |",
             "| the same, last row's logits only | " + " | ".join(f"{c:.2f}" for c in last_only) + " |",
             "| extraction speed, k fixed (spec off = 1) | " + " | ".join(f"{fixed[k]:.2f}x" for k in KS) + " |", "",
             f"Best k per match length (an oracle): {best} -> {res['best']:.2f}x.", "",
             "Mean draft tokens kept of an 8-token lookup, by match length (lookups): " +
             ", ".join(f"{m}: {v:.1f} ({res['lookups_by_match'][m]})" for m, v in
                       res["kept_by_match"].items()) + "."]
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
