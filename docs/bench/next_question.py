"""The user's next question during a document's ingestion (issue 26), as a user gets it: a DEFAULT daemon over HTTP,
side by side with llama-server.

    python docs/bench/next_question.py --gguf bench-q8.gguf                      # one ~6k-token document
    python docs/bench/next_question.py --gguf bench-q8.gguf --docs 2 --doc-tokens 8000 --ctx 10240
    python docs/bench/next_question.py --gguf bench-q8.gguf --doc-tokens 16000 --ctx 20480 --servers evenflow

Per server, fresh each time: a one-line question alone (TTFT, best of 2); then 4 streams decoding
(/v1/completions, streamed); once each has a token, `--docs` documents are sent 1 s apart (8 tokens out each), and
3 s after the first one `--chats` one-line questions, 1 s apart ("Quick question: what is 2+2?", 8 tokens). Reported:
each question's TTFT and total time, each document's TTFT, and the decoding streams' inter-token gaps while the
documents go in. Every request is its own connection (xllamacpp's server stops when a streamed keep-alive
connection is reused).

evenflow runs with EVENFLOW_BACKEND=llamacpp, EVENFLOW_NUM_THREADS=2 and OLLAMA_CONTEXT_LENGTH=--ctx only (the model
imported with /api/blobs + /api/create into a temp store). llama-server (xllamacpp, in this process) runs the same
GGUF, 5 slots of --ctx tokens, 2 threads, at its defaults (n_batch 2048, n_ubatch 512) and with n_batch 64.
Results: docs/bench/next_question.json (appended) and a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from default_stall import MODEL, import_model  # noqa: E402
from llama_server import llama_server  # noqa: E402
from perf_suite import serve_daemon  # noqa: E402

QUESTION = "Quick question: what is 2+2?"


def document(i: int, tokens: int) -> str:
    """~`tokens` tokens (about 20 per sentence with the Llama SentencePiece vocab) that share no prefix across i."""
    n = max(1, tokens // 20)
    return f"Document {i}.\n" + " ".join(f"Item {k} of report {i}: revenue rose {k % 97} percent in region {k % 13}."
                                          for k in range(n))


class Request(threading.Thread):
    """One streamed /v1/completions request on its own connection; token arrival times kept."""

    def __init__(self, url: str, prompt: str, max_tokens: int, stop: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.prompt, self.max_tokens, self.stop = url, prompt, max_tokens, stop
        self.t_sent = self.t_first = self.t_done = None
        self.times: list[float] = []
        self.prompt_tokens: int | None = None
        self.error: str | None = None
        self.first = threading.Event()

    def run(self) -> None:
        body = {"model": MODEL, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        try:
            with httpx.Client(timeout=3600, trust_env=False) as c:
                self.t_sent = time.perf_counter()
                with c.stream("POST", self.url + "/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        self.error = f"{r.status_code} {r.read()[:300]!r}"
                        return
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            self.prompt_tokens = chunk["usage"].get("prompt_tokens")
                        if any(ch.get("text") for ch in chunk.get("choices", [])):
                            now = time.perf_counter()
                            self.times.append(now)
                            if self.t_first is None:
                                self.t_first = now
                                self.first.set()
                        if self.stop is not None and self.stop.is_set():
                            break
        except httpx.HTTPError as e:
            self.error = repr(e)
        finally:
            self.t_done = time.perf_counter()
            self.first.set()

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_sent

    @property
    def total(self) -> float:
        return self.t_done - self.t_sent


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def scenario(url: str, a: argparse.Namespace, chats_n: int | None = None, doc_base: int = 0) -> dict:
    alone = []
    for _ in range(2):
        r = Request(url, QUESTION, 8)
        r.run()
        alone.append(r.ttft)
    stop = threading.Event()
    streams = [Request(url, f"Stream {i}: tell me a long story about the sea.", 20000, stop) for i in range(4)]
    for s in streams:
        s.start()
    for s in streams:
        s.first.wait(600)
    docs, chats = [], []
    t0 = time.perf_counter()
    for i in range(a.docs):
        docs.append(Request(url, document(doc_base + i, a.doc_tokens), 8))
        docs[-1].start()
        if i + 1 < a.docs:
            time.sleep(1)
    time.sleep(max(0.0, t0 + 3 - time.perf_counter()))
    for i in range(a.chats if chats_n is None else chats_n):
        chats.append(Request(url, QUESTION if i == 0 else f"{QUESTION} ({i})", 8))
        chats[-1].start()
        time.sleep(1)
    for r in docs + chats:
        r.join(3600)
    t_end = max(d.t_first or d.t_done for d in docs)
    stop.set()
    for s in streams:
        s.join(600)
    gaps = [b - a_ for s in streams for a_, b in zip(s.times, s.times[1:]) if t0 <= b <= t_end]
    errors = [r.error for r in streams + docs + chats if r.error]
    return {"chat_alone_s": min(x for x in alone if x is not None),
            "chats": [{"ttft_s": c.ttft, "total_s": c.total, "sent_s": c.t_sent - t0} for c in chats],
            "docs": [{"ttft_s": d.ttft, "prompt_tokens": d.prompt_tokens, "sent_s": d.t_sent - t0} for d in docs],
            "stream_gap_ms": {"p50": 1000 * (pct(gaps, .5) or 0), "p99": 1000 * (pct(gaps, .99) or 0),
                              "max": 1000 * max(gaps, default=0), "n": len(gaps)},
            "errors": errors}


def run_server(name: str, a: argparse.Namespace) -> dict:
    if name == "evenflow":
        env = {"EVENFLOW_BACKEND": "llamacpp", "EVENFLOW_NUM_THREADS": "2", "OLLAMA_CONTEXT_LENGTH": str(a.ctx)}
        with tempfile.TemporaryDirectory() as store:
            with serve_daemon({**env, "OLLAMA_MODELS": store}, "next_question_daemon.log") as url:
                import_model(url, a.gguf)
                row = {"server": "evenflow (defaults)", "env": env, **scenario(url, a)}
                if a.baseline:  # the same documents' TTFT with no questions, on the same daemon (other texts)
                    row["baseline_docs"] = scenario(url, a, chats_n=0, doc_base=100)["docs"]
                return row
    nb, nub = (2048, 512) if name == "llama-server" else (64, 64)
    with llama_server(a.gguf, n_batch=nb, n_ubatch=nub, slots=5, ctx_per_slot=a.ctx, threads=2) as url:
        label = "llama-server, defaults (n_batch 2048)" if nb == 2048 else "llama-server, n_batch 64"
        row = {"server": label, **scenario(url, a)}
        if a.baseline:
            row["baseline_docs"] = scenario(url, a, chats_n=0, doc_base=100)["docs"]
        return row


def fmt(x: float | None, unit: str = "s") -> str:
    return "—" if x is None else (f"{x:.2f} s" if unit == "s" else f"{x:.0f} ms")


def table(rows: list[dict]) -> str:
    out = ["| server | question alone (TTFT) | first question during ingestion: TTFT / total | all questions: "
           "median / max TTFT | documents' TTFT | streams' gap P50 / P99 during ingestion |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        c = r["chats"] or [{"ttft_s": None, "total_s": None}]
        tt = [x["ttft_s"] for x in c if x["ttft_s"] is not None]
        base = r.get("baseline_docs")
        docs = ", ".join(f"{fmt(d['ttft_s'])} ({d['prompt_tokens'] or '?'} tok)" for d in r["docs"])
        if base:
            docs += " [without questions: " + ", ".join(fmt(d["ttft_s"]) for d in base) + "]"
        out.append(f"| {r['server']} | {fmt(r['chat_alone_s'])} | {fmt(c[0]['ttft_s'])} / {fmt(c[0]['total_s'])} | "
                   f"{fmt(statistics.median(tt) if tt else None)} / {fmt(max(tt, default=None))} | {docs}"
                   + f" | {fmt(r['stream_gap_ms']['p50'], 'ms')} / {fmt(r['stream_gap_ms']['p99'], 'ms')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--doc-tokens", type=int, default=6000)
    ap.add_argument("--docs", type=int, default=1)
    ap.add_argument("--chats", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=8192, help="evenflow's OLLAMA_CONTEXT_LENGTH, llama-server's per slot")
    ap.add_argument("--baseline", action="store_true",
                    help="then the same scenario without questions on the same server: the documents' TTFT alone")
    ap.add_argument("--servers", default="evenflow,llama-server,llama-server-b64")
    ap.add_argument("--out", type=Path, default=HERE / "next_question.json")
    a = ap.parse_args()
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    rows = []
    for name in a.servers.split(","):
        print(f"== {name}", flush=True)
        rows.append(run_server(name, a))
        print(json.dumps(rows[-1]), flush=True)
    run = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu, "loadavg": __import__("os").getloadavg(),
           "args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}
    old = json.loads(a.out.read_text()) if a.out.exists() else {"runs": []}
    old["runs"].append(run)
    a.out.write_text(json.dumps(old, indent=1))
    print(f"\n{cpu}; {a.docs} document(s) of ~{a.doc_tokens} tokens, 4 streams decoding, {a.chats} questions 1 s "
          f"apart from 3 s after the first document\n")
    print(table(rows))


if __name__ == "__main__":
    main()
