"""n > 1 and logprobs as a user gets them: a default `evenflow serve`, driven over HTTP, one run.

    python docs/bench/n_choices.py                # ~1k-token prompt, n=4, 16 tokens each (a few minutes on 2 cores)

1. One /v1/completions request with n=4 vs the same four choices as four concurrent n=1 requests (seeds
   s..s+3): wall time and the prompt tokens the engine computed (from /api/events
   step events). Each scenario gets its own document, so neither reuses the other's cache.
2. Decode speed of one greedy stream with logprobs off, on (top 0) and on with top_logprobs=20, alternated over
   rounds (median eval tokens/s from /api/generate's eval_count / eval_duration), and the engine's logprob work
   per sampled row in thread CPU time (which, unlike wall time, other jobs on the machine do not inflate).
   `--parts logprobs` reruns only this part and keeps the n part's last results; `--parts cpu` measures only the
   engine's logprob work (no daemon).
Model: the synthetic `bench` preset (Llama, 16x1024, 32k vocab) as Q8_0; the backend is the default (llama.cpp on a
CPU). Writes docs/bench/n_choices.json and docs/bench/n_choices.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from evenflow.backends.synthetic import cached_model, make_spec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from perf_suite import MODEL, StepRecorder, import_model, serve_daemon  # noqa: E402
from prefix_cache_bench import cpu_model, document  # noqa: E402


def completions(url: str, prompt: str, n: int, seed: int, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "n": n, "seed": seed, "max_tokens": max_tokens, "temperature": 1.0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=1200, trust_env=False)
    r.raise_for_status()
    return r.json()


def prefilled(steps: list[dict]) -> int:
    return sum(s["prefill_tokens"] for s in steps)


def scenario_n(url: str, prompt: str, n: int, seed: int, max_tokens: int) -> dict[str, Any]:
    rec = StepRecorder(url)
    time.sleep(0.5)  # let the event stream connect before the request starts
    t0 = time.perf_counter()
    out = completions(url, prompt, n, seed, max_tokens)
    wall = time.perf_counter() - t0
    time.sleep(0.5)
    steps = rec.stop()
    return {"wall_s": round(wall, 2), "prompt_tokens": out["usage"]["prompt_tokens"],
            "computed_prompt_tokens": prefilled(steps), "texts": [c["text"] for c in out["choices"]]}


def scenario_separate(url: str, prompt: str, n: int, seed: int, max_tokens: int) -> dict[str, Any]:
    rec = StepRecorder(url)
    time.sleep(0.5)
    outs: list[Any] = [None] * n

    def one(i: int) -> None:
        outs[i] = completions(url, prompt, 1, seed + i, max_tokens)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    time.sleep(0.5)
    steps = rec.stop()
    return {"wall_s": round(wall, 2), "prompt_tokens": outs[0]["usage"]["prompt_tokens"],
            "computed_prompt_tokens": prefilled(steps), "texts": [o["choices"][0]["text"] for o in outs]}


def decode_speed(url: str, prompt: str, tokens: int, logprobs: int | None) -> float:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "raw": True, "stream": False,
                            "options": {"temperature": 0, "num_predict": tokens}}
    if logprobs is not None:
        body.update(logprobs=True, top_logprobs=logprobs)
    r = httpx.post(url + "/api/generate", json=body, timeout=1200, trust_env=False).json()
    return r["eval_count"] / r["eval_duration"] * 1e9


def logprob_cpu_us(vocab: int, k: int, rounds: int = 200) -> float:
    """Engine-side work of logprobs for one sampled row (log-softmax + top k), thread CPU time (median, us):
    unlike wall time it does not change with what else the machine runs."""
    import numpy as np  # noqa: PLC0415

    from evenflow.daemon.engine.logprobs import log_softmax, token_logprob  # noqa: PLC0415

    row = np.random.default_rng(0).standard_normal((1, vocab)).astype(np.float32) * 4
    times = []
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        token_logprob(log_softmax(row)[0], 7, k)
        times.append(time.thread_time_ns() - t0)
    return sorted(times)[rounds // 2] / 1e3


def render(res: dict[str, Any]) -> str:
    m = res["meta"]
    lines = [f"# n > 1 and logprobs ({m['cpu']}, {m['cpus']} CPUs)", "",
             f"{m['model']}; {m['backend']}; each part is one run, on a machine shared with other jobs "
             f"(load average recorded).", ""]
    if "n" in res:
        r = res["n"]
        one, sep = r["n_request"], r["separate_requests"]
        lines += [f"## n = {r['n']} ({r['date']}, load {r['load_avg']} -> {r['load_avg_end']})", "",
                  f"| {r['n']} choices of {r['max_tokens']} tokens | prompt tokens | prompt tokens computed | wall s |",
                  "|---|---|---|---|",
                  f"| one request, n={r['n']} | {one['prompt_tokens']} | {one['computed_prompt_tokens']} | "
                  f"{one['wall_s']} |",
                  f"| {r['n']} concurrent n=1 requests | {sep['prompt_tokens']} | {sep['computed_prompt_tokens']} | "
                  f"{sep['wall_s']} |", ""]
    if "logprobs" in res:
        r = res["logprobs"]
        lines += [f"## logprobs ({r['date']}, load {r['load_avg']} -> {r['load_avg_end']})", "",
                  f"One greedy stream of {r['tokens']} tokens per request, settings alternated for {r['rounds']} "
                  f"rounds; median decode tokens/s (eval_count / eval_duration), and the engine's logprob work "
                  f"per sampled row (thread CPU time, median of 200, vocab {r['vocab']}).", "",
                  "| logprobs | decode tokens/s (median) | all rounds | logprob work per row, us |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['median']} | {v['all']} | {v['cpu_us']} |" for k, v in r["settings"].items()]
    if "logprobs_cpu" in res:
        r = res["logprobs_cpu"]
        lines += [f"## logprobs: the engine's work per sampled row ({r['date']})", "",
                  f"log-softmax over a {r['vocab']}-token row + the top k, thread CPU time (median of 200; other jobs "
                  "on the machine do not inflate it). Rows that did not ask for logprobs do none of this.", "",
                  "| top_logprobs | us per row |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in r["us_per_row"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="n,logprobs", help="which parts to run (the others keep their last results)")
    ap.add_argument("--prompt", type=int, default=1000, help="prompt length in tokens")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    parts = args.parts.split(",")
    gguf = Path(cached_model(make_spec("bench"), formats=("gguf",), gguf_dtype="q8_0")["gguf"])
    from evenflow.backends.llamacpp.tokenizer import open_vocab

    tok = open_vocab(str(gguf))
    count = lambda s: len(tok.encode(s))  # noqa: E731
    vocab = tok.vocab_size
    doc_a, doc_b = (document(random.Random(args.seed + k), args.prompt, count) for k in (1, 2))
    tok.close()
    store = Path(tempfile.mkdtemp(prefix="evenflow-n-store-"))
    import_model(store, gguf)
    out = HERE / "n_choices.json"
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    res["meta"] = {"model": "synthetic bench preset (llama, 16 layers x 1024, 32k vocab), Q8_0 GGUF",
                   "backend": "default `evenflow serve` (auto: llama.cpp on a CPU)", "cpu": cpu_model(),
                   "cpus": os.cpu_count()}
    if "cpu" in parts:  # no daemon: the engine's logprob work alone
        res["logprobs_cpu"] = {"vocab": vocab, "date": time.strftime("%Y-%m-%d %H:%M"),
                               "us_per_row": {f"top {k}": round(logprob_cpu_us(vocab, k), 1) for k in (0, 5, 20)}}
    if not {"n", "logprobs"} & set(parts):
        parts = []
    with (serve_daemon({"OLLAMA_MODELS": str(store)}, "n_choices_daemon.log") if parts else contextlib.nullcontext()) as url:
        if parts:
            completions(url, "warm up", 1, 0, 2)
        if "n" in parts:
            r: dict[str, Any] = {"n": args.n, "max_tokens": args.max_tokens, "date": time.strftime("%Y-%m-%d %H:%M"),
                                 "load_avg": round(os.getloadavg()[0], 1)}
            r["n_request"] = scenario_n(url, doc_a + " Question: go on.", args.n, args.seed, args.max_tokens)
            r["separate_requests"] = scenario_separate(url, doc_b + " Question: go on.", args.n, args.seed,
                                                       args.max_tokens)
            r["load_avg_end"] = round(os.getloadavg()[0], 1)
            res["n"] = r
        if "logprobs" in parts:
            r = {"tokens": args.decode_tokens, "rounds": args.rounds, "vocab": vocab,
                 "date": time.strftime("%Y-%m-%d %H:%M"), "load_avg": round(os.getloadavg()[0], 1)}
            settings = {"off": None, "top 0": 0, "top 20": 20}
            speeds: dict[str, list[float]] = {k: [] for k in settings}
            for _ in range(args.rounds):
                for name, lp in settings.items():
                    speeds[name].append(round(decode_speed(url, doc_a[:400], args.decode_tokens, lp), 2))
            r["settings"] = {k: {"median": sorted(v)[len(v) // 2], "all": v,
                                 "cpu_us": 0 if settings[k] is None else round(logprob_cpu_us(vocab, settings[k]), 1)}
                             for k, v in speeds.items()}
            r["load_avg_end"] = round(os.getloadavg()[0], 1)
            res["logprobs"] = r
    out.write_text(json.dumps(res, indent=2) + "\n")
    (HERE / "n_choices.md").write_text(render(res))
    print(render(res))


if __name__ == "__main__":
    main()
