"""Prefix caching as a desktop user feels it: evenflow vs llama-server, side by side, over HTTP, one run.

    python docs/bench/prefix_cache_bench.py                  # 1.5k- and 8k-token documents (~15 min on 2 cores)
    python docs/bench/prefix_cache_bench.py --docs 1500      # the short document only

For each document length and server, one request at a time over OpenAI /v1/completions (streamed):
  cold       the document + question 1 (nothing cached)
  same doc   the same document + question 2
  next turn  question 1's prompt + its answer + a follow-up (a chat's next turn)
and the TTFT of each. evenflow runs with default settings (backend auto = llama.cpp on a CPU, its default
threads); only the context length is raised so an 8k document fits. llama-server comes from the `xllamacpp`
wheel with `cache_prompt` at its default (on), one slot, the same context and thread count.
The model is the synthetic `bench` preset (Llama, 16x1024, 32k vocab) as Q8_0, its trained context raised to
--ctx. Writes docs/bench/prefix_cache.json and docs/bench/prefix_cache.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from evenflow.backends.synthetic import cached_model, make_spec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llama_server import llama_server  # noqa: E402
from perf_suite import import_model, serve_daemon  # noqa: E402

MODEL = "bench"
WORDS = ("river stone window garden letter market silver morning engine paper orange forest music summer winter "
         "bridge candle island mirror planet shadow thunder valley harbor journey lantern meadow ocean pepper rocket "
         "saddle ticket violet whisper yellow anchor basket circle desert").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def document(rng: random.Random, tokens: int, count) -> str:
    """A document of about `tokens` tokens of this model's tokenizer."""
    text = "Document: " + words(rng, tokens // 4)
    while (n := count(text)) < tokens:
        text += " " + words(rng, max(1, (tokens - n) // 4))
    return text


def complete(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed /v1/completions request on a fresh connection (xllamacpp's server dislikes reused ones)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, out, usage = None, [], {}
    with httpx.Client(trust_env=False, timeout=1800) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices") or []:
                if ch.get("text") and ttft is None:
                    ttft = time.perf_counter() - t0
                out.append(ch.get("text") or "")
            usage = ev.get("usage") or usage
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - t0, "text": "".join(out),
            "prompt_tokens": usage.get("prompt_tokens")}


def scenario(url: str, model: str, doc: str, rng: random.Random) -> dict[str, Any]:
    q1 = "\nQuestion: " + words(rng, 12) + "\nAnswer:"
    q2 = "\nQuestion: " + words(rng, 12) + "\nAnswer:"
    follow = "\nQuestion: " + words(rng, 12) + "\nAnswer:"
    cold = complete(url, model, doc + q1, 16)
    same = complete(url, model, doc + q2, 4)
    turn = complete(url, model, doc + q1 + cold["text"] + follow, 4)
    return {"cold": cold, "same_doc": same, "next_turn": turn}


def cache_metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    out = {}
    for line in text.splitlines():
        for name in ("evenflow_prefix_cache_hit_tokens_total", "evenflow_prefix_cache_query_tokens_total",
                     "evenflow_prefix_cache_hit_rate"):
            if line.startswith(name + "{"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def evenflow_daemon(store: Path, ctx: int):
    """`evenflow serve` with default settings but the store, a free loopback port and the context length."""
    return serve_daemon({"OLLAMA_MODELS": str(store), "OLLAMA_CONTEXT_LENGTH": str(ctx)}, "prefix_cache_daemon.log")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or platform.machine()


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    lines = [f"Model: {m['model']}. CPU: {m['cpu']} ({m['cpus']} cores), {m['threads']} threads each, "
             f"{m['date']}; one run, shared machine (load average {m['load_avg']}), so expect noise.", "",
             "| document | server | cold TTFT | same document, new question | next chat turn | same/cold |",
             "|---|---|---|---|---|---|"]
    for row in res["rows"]:
        c, s, t = (row[k]["ttft_s"] for k in ("cold", "same_doc", "next_turn"))
        lines.append(f"| {row['doc_tokens']} tokens | {row['server']} | {c:.2f} s | **{s:.2f} s** | {t:.2f} s | "
                     f"{s / c:.3f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", default="1500,8000", help="document lengths in tokens")
    ap.add_argument("--ctx", type=int, default=10240, help="context length of both servers (and the model)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server threads (match evenflow's default)")
    ap.add_argument("--servers", default="evenflow,llama-server")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    lengths = [int(x) for x in args.docs.split(",")]
    gguf = Path(cached_model(make_spec("bench", max_position_embeddings=args.ctx), formats=("gguf",),
                             gguf_dtype="q8_0")["gguf"])
    from evenflow.backends.llamacpp.tokenizer import open_vocab

    tok = open_vocab(str(gguf))
    count = lambda s: len(tok.encode(s))  # noqa: E731
    docs = {n: document(random.Random(args.seed + n), n, count) for n in lengths}
    tok.close()
    res: dict[str, Any] = {"meta": {
        "model": f"synthetic bench preset (llama, 16 layers x 1024, 32k vocab, context {args.ctx}), Q8_0 GGUF",
        "cpu": cpu_model(), "cpus": os.cpu_count(), "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_avg": round(os.getloadavg()[0], 1), "protocol": "openai /v1/completions, streamed, one at a time"},
        "rows": []}
    store = Path(tempfile.mkdtemp(prefix="evenflow-prefix-store-"))
    import_model(store, gguf)
    servers = args.servers.split(",")
    for server in servers:
        if server == "evenflow":
            cm, model = evenflow_daemon(store, args.ctx), MODEL
        else:
            cm, model = llama_server(gguf, n_batch=2048, n_ubatch=512, slots=1, ctx_per_slot=args.ctx,
                                     threads=args.threads, verbosity=-1), "bench"
        with cm as url:
            complete(url, model, words(random.Random(0), 16), 4)  # load and warm up on an unrelated prompt
            for n in lengths:
                row = {"server": server, "doc_tokens": n,
                       **scenario(url, model, docs[n], random.Random(args.seed * 7 + n))}
                row["load_avg"] = round(os.getloadavg()[0], 1)  # the machine may be shared: record how busy
                if server == "evenflow":
                    row["metrics"] = cache_metrics(url)
                res["rows"].append(row)
                print(f"{server:13s} {n:6d} tokens: cold {row['cold']['ttft_s']:.2f} s, same document "
                      f"{row['same_doc']['ttft_s']:.2f} s, next turn {row['next_turn']['ttft_s']:.2f} s "
                      f"(prompt tokens {[row[k]['prompt_tokens'] for k in ('cold', 'same_doc', 'next_turn')]})",
                      flush=True)
    md = markdown(res)
    print()
    print(md)
    (HERE / "prefix_cache.json").write_text(json.dumps(res, indent=1) + "\n")
    (HERE / "prefix_cache.md").write_text(md)


if __name__ == "__main__":
    main()
