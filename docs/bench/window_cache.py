"""A sliding-window model's document cache (issue 37), as a user gets it: a DEFAULT daemon over HTTP, side by side
with llama-server's own re-prefill, on real Gemma 3 270M (a 512-token window on 5 of 6 layers) and SmolLM2-135M (no
window: the control).

    python docs/bench/window_cache.py                                  # both models, a 700-token answer (~15 min quiet)
    python docs/bench/window_cache.py --models gemma3 --answer 300     # a quicker look

The weights come from ../shared/tools/real_models.py (cached). Per model and server, one ~1.4k-token document and
one question after another, each streamed on its own connection (/v1/completions, greedy, 8 tokens out; xllamacpp's
server stops when a streamed keep-alive connection is reused):
  cold          the document + question 1 (the model loaded by a short unrelated prompt first)
  next          + question 2, in memory
  after answer  + question 4, after question 3 was answered at length (--answer tokens, ignore_eos): the window
                has moved far past the document
  after unload  evenflow: + question 5 after `{"keep_alive": 0}` unloaded the model (loaded again by a short prompt)
  after restart + question 6 after the server restarted (evenflow: SIGTERM and start, the same store and disk cache;
                llama-server: a new one, which recomputes: its re-prefill), loaded by a short prompt first
  then question 1 again, whose reply must equal the cold one.
evenflow is a daemon with default settings (only OLLAMA_MODELS and EVENFLOW_KV_CACHE_DIR point at temp folders);
llama-server (xllamacpp, in this process) runs the same file with 4 slots of 4096 tokens and the daemon's thread
count, at its defaults otherwise (n_batch 2048, n_ubatch 512, flash attention auto, f16 KV, swa_full off, context
checkpoints on). Tokens served from cache: evenflow's /metrics counters (prefix-cache hit, rewound, restored from
disk), llama-server's `timings.cache_n`. Results: docs/bench/window_cache.json (appended), docs/bench/window_cache.md
(the latest run) and the table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parents[2] / "shared" / "tools"
sys.path.insert(0, str(HERE))
from default_stall import MODEL, import_model  # noqa: E402
from kv_disk import Daemon, cpu_model, unload  # noqa: E402
from llama_server import llama_server  # noqa: E402

COUNTERS = {"hit": "evenflow_prefix_cache_hit_tokens_total", "rewound": "evenflow_prefix_cache_rewind_tokens_total",
            "lost": "evenflow_prefix_cache_fallback_tokens_total", "restored": "evenflow_kv_disk_restored_tokens_total"}
QUESTIONS = ["what does Elm7 trade?", "how many barrels of cider does Elm12 make?",
             "write a long story about the people of Elm3.", "which town makes 60 barrels?",
             "what does Elm40 trade besides wool?", "name three towns that trade salt."]
WARM = "The capital of France is"


def document(paragraphs: int = 55) -> str:
    """~1.4k Gemma tokens (~26 a paragraph), ~1.3k SmolLM2 tokens."""
    return " ".join(f"Paragraph {i}: the river town of Elm{i} trades wool, salt and {i * 3} barrels of cider each "
                    "autumn." for i in range(paragraphs))


def ask(url: str, prompt: str, max_tokens: int = 8) -> dict:
    """One streamed /v1/completions request on a fresh connection: TTFT, reply, llama-server's timings if any."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if max_tokens > 8:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    ttft, text, usage, timings = None, [], {}, {}
    with httpx.Client(timeout=7200, trust_env=False) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            piece = "".join(ch.get("text") or "" for ch in chunk.get("choices", []))
            if piece:
                ttft = ttft or time.perf_counter() - t0
                text.append(piece)
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - t0, "total_s": time.perf_counter() - t0,
            "reply": "".join(text), "prompt_tokens": usage.get("prompt_tokens"),
            "cache_n": timings.get("cache_n"), "prompt_n": timings.get("prompt_n")}


def counters(url: str) -> dict[str, float]:
    lines = httpx.get(url + "/metrics", trust_env=False).text.splitlines()
    return {k: sum(float(x.split()[-1]) for x in lines if x.startswith(name + "{") or x.startswith(name + " "))
            for k, name in COUNTERS.items()}


def ask_counted(url: str, prompt: str, max_tokens: int = 8) -> dict:
    before = counters(url)
    res = ask(url, prompt, max_tokens)
    after = counters(url)
    return {**res, **{k: int(after[k] - before[k]) for k in COUNTERS}}


def run_evenflow(gguf: Path, doc: str, answer: int, work: Path) -> dict:
    env = {"OLLAMA_MODELS": str(work / "models"), "EVENFLOW_KV_CACHE_DIR": str(work / "kv")}
    q = [f"{doc}\nQuestion: {x}\nAnswer:" for x in QUESTIONS]
    log = HERE / "window_cache_daemon.log"
    d = Daemon(env, log)
    res: dict = {"server": "evenflow (defaults)"}
    try:
        import_model(d.url, gguf)
        ask(d.url, WARM, 1)
        res["cold"] = ask_counted(d.url, q[0])
        res["next"] = ask_counted(d.url, q[1])
        res["answer"] = ask_counted(d.url, q[2], answer)
        res["after_answer"] = ask_counted(d.url, q[3])
        res["unload"] = unload(d)
        ask(d.url, WARM, 1)
        res["after_unload"] = ask_counted(d.url, q[4])
        res["shutdown_s"] = d.stop()
        d = Daemon(env, log)
        ask(d.url, WARM, 1)
        res["after_restart"] = ask_counted(d.url, q[5])
        res["cold_again"] = ask_counted(d.url, q[0])
        res["loaded"] = next((m for m in httpx.get(d.url + "/api/ps", trust_env=False).json()["models"]), {})
    finally:
        d.stop()
    return res


def run_llama_server(gguf: Path, doc: str, answer: int, threads: int) -> dict:
    q = [f"{doc}\nQuestion: {x}\nAnswer:" for x in QUESTIONS]
    res: dict = {"server": "llama-server (defaults, 4 slots)"}
    with llama_server(gguf, slots=4, ctx_per_slot=4096, threads=threads) as url:
        ask(url, WARM, 1)
        res["cold"] = ask(url, q[0])
        res["next"] = ask(url, q[1])
        res["answer"] = ask(url, q[2], answer)
        res["after_answer"] = ask(url, q[3])
    with llama_server(gguf, slots=4, ctx_per_slot=4096, threads=threads) as url:  # a restart: nothing kept
        ask(url, WARM, 1)
        res["after_restart"] = ask(url, q[5])
        res["cold_again"] = ask(url, q[0])
    return res


def fmt(r: dict, key: str, cold: float) -> str:
    x = r.get(key)
    if not x:
        return "—"
    cached = x.get("hit") if "hit" in x else x.get("cache_n")
    extra = f", {cached} cached" if cached is not None else ""
    if x.get("rewound"):
        extra += f", {x['rewound']} rewound"
    if x.get("restored"):
        extra += f", {x['restored']} from disk"
    return f"{x['ttft_s']:.2f} s ({x['ttft_s'] / cold:.3f}x{extra})"


def table(rows: list[dict]) -> str:
    out = ["| model | server | cold TTFT (prompt) | next question | after a long answer | after unload | "
           "after restart | cold prefill vs llama-server | reply = cold |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cold = r["cold"]["ttft_s"]
        peer = next((p for p in rows if p["model"] == r["model"] and p is not r), None)
        vs = f"{cold / peer['cold']['ttft_s']:.2f}x" if peer and r["server"].startswith("evenflow") else ""
        out.append(f"| {r['model']} | {r['server']} | {cold:.2f} s ({r['cold']['prompt_tokens']} tok) | "
                   f"{fmt(r, 'next', cold)} | {fmt(r, 'after_answer', cold)} | {fmt(r, 'after_unload', cold)} | "
                   f"{fmt(r, 'after_restart', cold)} | {vs} | {r['cold_again']['reply'] == r['cold']['reply']} |")
    return "\n".join(out)


def real_model(name: str) -> Path:
    out = subprocess.run([sys.executable, str(TOOLS / "real_models.py"), name], capture_output=True, text=True,
                         check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gemma3,smollm2")
    p.add_argument("--servers", default="evenflow,llama-server")
    p.add_argument("--answer", type=int, default=700, help="tokens of the long answer")
    p.add_argument("--paragraphs", type=int, default=55, help="document size (~26 Gemma tokens each)")
    p.add_argument("--out", type=Path, default=HERE / "window_cache.json")
    p.add_argument("--md", type=Path, default=HERE / "window_cache.md")
    p.add_argument("--note", default="", help="a line for the markdown (how busy the machine was, say)")
    a = p.parse_args()
    threads = int(os.environ.get("EVENFLOW_NUM_THREADS", 0)) or len(os.sched_getaffinity(0))
    doc = document(a.paragraphs)
    rows = []
    for model in a.models.split(","):
        gguf = real_model(model)
        for server in a.servers.split(","):
            print(f"== {model} on {server}", flush=True)
            if server == "evenflow":
                with tempfile.TemporaryDirectory(prefix="window-cache-") as work:
                    row = run_evenflow(gguf, doc, a.answer, Path(work))
            else:
                row = run_llama_server(gguf, doc, a.answer, threads)
            rows.append({"model": model, **row})
            print(json.dumps(rows[-1]), flush=True)
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu_model(), "loadavg": os.getloadavg(),
              "args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}
    old = json.loads(a.out.read_text()) if a.out.exists() else []
    a.out.write_text(json.dumps(old + [record], indent=1))
    head = (f"{record['cpu']}, {len(os.sched_getaffinity(0))} cores, load average at the end "
            f"{', '.join(f'{x:.1f}' for x in record['loadavg'])}; a ~1.4k-token document, a {a.answer}-token answer")
    text = table(rows)
    print(f"\n{head}\n\n{text}")
    a.md.write_text(f"# A sliding-window model's document cache (`docs/bench/window_cache.py`)\n\n{head} "
                    f"({record['time']}). {a.note}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
