"""The scheduler's decisions for a stall scenario in virtual time, to compare versions decision by decision (issue 38).

4 streams decode while one long prompt goes in; each step's time comes from a fixed cost model (the bench GGUF's
order on 2 CPU cores) times seeded jitter, and feeds the adaptive budget at the daemon's CPU defaults (150 ms, floor
4, tile 1). It prints, per jitter level, a digest of the long prompt's chunk sequence, its TTFT and the step-time
percentiles in virtual time. Two versions that print the same digests make the same decisions. To run another commit:

    mkdir -p /tmp/old/evenflow && git archive <commit> | tar -x -C /tmp/old/evenflow
    PYTHONPATH=/tmp/old python docs/bench/stall_replay.py
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random

from evenflow.daemon.engine.budget import AdaptiveBudget, StepCost
from evenflow.daemon.engine.blocks import BlockManager
from evenflow.daemon.engine.params import SamplingParams
from evenflow.daemon.engine.scheduler import Scheduler, SchedulerConfig
from evenflow.daemon.engine.sequence import Sequence


def step_seconds(plan, rng: random.Random, jitter: float) -> float:
    """30 ms + 9 ms a decode + 12 ms for carrying a chunk + 4.5 ms a prompt token + 20 ns a (query, key) pair, times
    1 + jitter * |N(0, 1)| (contention only ever adds time)."""
    chunks = len(plan.spans) - plan.num_decodes
    t = 0.030 + 0.009 * plan.num_decodes + 0.012 * (chunks > 0) + 0.0045 * plan.prefill_tokens \
        + 2.0e-8 * plan.attention_work
    return t * (1 + jitter * abs(rng.gauss(0, 1)))


def replay(prompt_len: int, jitter: float, seed: int, tail: float | None = None) -> dict:
    rng = random.Random(seed)
    blocks = BlockManager(4096, 16)
    sched = Scheduler(SchedulerConfig("chunked", 8, None, 512, False), blocks,
                      AdaptiveBudget(150, max_tokens=512, tile=1, floor=4,
                                     **({} if tail is None else {"tail": tail})))
    ids = iter(range(100, 10**7))
    for _ in range(4):
        sched.add(Sequence([next(ids) for _ in range(20)], SamplingParams(temperature=0), 1 << 20))
    long, chunks, times = None, [], []
    for step in range(100_000):
        if step == 200:  # the streams have decoded a while
            long = Sequence([next(ids) for _ in range(prompt_len)], SamplingParams(temperature=0), 1 << 20)
            sched.add(long)
        plan = sched.schedule()
        for span in plan.spans:
            if span.seq.t_first_scheduled is None:
                span.seq.t_first_scheduled = step
            span.seq.num_computed += span.num_tokens
            blocks.commit(span.seq)
            if span.need_logits:
                span.seq.output_ids.append(7)
        dt = step_seconds(plan, rng, jitter)
        sched.policy.observe(StepCost(plan.num_decodes, plan.prefill_tokens, plan.attention_work, dt))
        if long is not None:
            chunks.append(sum(s.num_tokens for s in plan.spans if s.seq is long))
            times.append(dt * 1e3)
            if long.output_ids:
                break
    ms = sorted(times)
    digest = hashlib.sha1(json.dumps(chunks).encode()).hexdigest()[:12]
    return {"jitter": jitter, "steps": len(chunks), "chunks_digest": digest,
            "ttft_s": round(sum(times) / 1e3, 2), "p50_ms": round(ms[len(ms) // 2], 1),
            "p99_ms": round(ms[int(0.99 * len(ms))], 1), "max_ms": round(ms[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--jitter", default="0,0.05,0.15,0.3")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tails", help="compare these aims (residual deviations under the target), e.g. 1,2.33: a "
                                    "table of TTFT and step-time P99 per jitter, means over --seeds runs")
    ap.add_argument("--seeds", type=int, default=20)
    a = ap.parse_args()
    if a.tails:
        print("| tail | jitter | TTFT s | P99 ms | max ms | runs with P99 > 150 ms |\n|---|---|---|---|---|---|")
        for t in a.tails.split(","):
            for j in a.jitter.split(","):
                rs = [replay(a.prompt_len, float(j), a.seed + i, float(t)) for i in range(a.seeds)]
                mean = lambda k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
                over = sum(r["p99_ms"] > 150 for r in rs)
                print(f"| {t} | {j} | {mean('ttft_s'):.2f} | {mean('p99_ms'):.1f} | {mean('max_ms'):.1f} | "
                      f"{over} of {len(rs)} |", flush=True)
        return
    for j in a.jitter.split(","):
        print(json.dumps(replay(a.prompt_len, float(j), a.seed)))


if __name__ == "__main__":
    main()
