"""The next question, run after run (issue 38): does its TTFT stay under a second in EVERY run, and when it does not,
what did the daemon say it was waiting for?

    python docs/bench/next_question_runs.py --gguf bench-q8.gguf                     # the issue's scenario, 5 runs
    python docs/bench/next_question_runs.py --gguf bench-q8.gguf --stream-prompt-tokens 500 --doc-tokens 2000 --runs 3

Each run, on a fresh DEFAULT daemon over HTTP (`evenflow serve`, only OLLAMA_CONTEXT_LENGTH=--ctx and a temp store
set; the backend, threads, latency target, slots and KV pool are the daemon's own choices): 4 streams each get a
~`--stream-prompt-tokens` prompt and decode (/v1/completions, streamed); once all four decode, a ~`--doc-tokens`
document is sent (8 tokens out), and `--question-after` seconds later a one-line question (8 tokens out), then
`--questions - 1` more, 1 s apart. Every run uses texts of its own (no prefix cache hit across runs); the runs share
one disk KV cache folder, as a user's runs would. Reported per run: each question's TTFT, the document's TTFT, the
streams' inter-token gap P50/P99 while the document goes in, and from /api/events: the waiting reasons and queue
positions the daemon published for the question and the document, preemptions, parked prefills, the KV layout and
pool, and the slowest steps. Results are appended to docs/bench/next_question_runs.json; a table goes to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
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
from default_stall import import_model  # noqa: E402
from next_question import QUESTION, Request, document, pct  # noqa: E402
from perf_suite import serve_daemon  # noqa: E402


class EventLog:
    """Every /api/events event, stamped with the client's perf_counter on arrival."""

    def __init__(self, url: str) -> None:
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._t.start()

    def _run(self, url: str) -> None:
        try:
            with httpx.stream("GET", url + "/api/events", timeout=None, trust_env=False) as r:
                for line in r.iter_lines():
                    if self._stop.is_set():
                        return
                    if line:
                        ev = json.loads(line)
                        ev["t_client"] = time.perf_counter()
                        self.events.append(ev)
        except httpx.HTTPError:
            pass

    def stop(self) -> list[dict]:
        self._stop.set()
        return self.events


def stream_prompt(run: int, i: int, tokens: int) -> str:
    """A stream's own context: ~`tokens` tokens, distinct per run and stream, then the ask."""
    return document(1000 * run + 10 + i, tokens) + f"\nStream {i}: tell me a long story about the sea."


def request_story(events: list[dict], prompt_tokens: int, after: float, claimed: set[int]) -> dict:
    """What the daemon published about the first request of `prompt_tokens` queued after `after` that no earlier
    story claimed."""
    queued = next((e for e in events if e.get("type") == "request" and e.get("event") == "queued"
                   and e.get("prompt_tokens") == prompt_tokens and e["t_client"] >= after
                   and e["seq_id"] not in claimed), None)
    if queued is None:
        return {}
    sid = queued["seq_id"]
    claimed.add(sid)
    mine = [e for e in events if e.get("type") == "request" and e.get("seq_id") == sid]
    waits = [{"reason": e["reason"], "position": e["position"], "prefilled": e["prefilled"],
              "at_s": round(e["t_client"] - queued["t_client"], 3)} for e in mine if e["event"] == "waiting"]
    sched = next((e for e in mine if e["event"] == "scheduled"), {})
    first = next((e for e in mine if e["event"] == "first_token"), None)
    steps = [e for e in events if e.get("type") == "step" and any(s == sid for s, _ in e.get("prefilled", []))]
    return {"seq_id": sid, "waits": waits, "queue_ms": sched.get("queue_ms"), "prefill_steps": len(steps),
            "prefill_step_ms": [round(e["step_ms"]) for e in steps[:8]],
            "first_token_s": None if first is None else round(first["t_client"] - queued["t_client"], 3)}


def run_once(run: int, a: argparse.Namespace, kv_dir: str) -> dict:
    env = {"OLLAMA_CONTEXT_LENGTH": str(a.ctx), "EVENFLOW_KV_CACHE_DIR": kv_dir,
           **dict(kv.split("=", 1) for kv in a.env)}
    with tempfile.TemporaryDirectory() as store:
        with serve_daemon({**env, "OLLAMA_MODELS": store}, "next_question_runs_daemon.log") as url:
            import_model(url, a.gguf)
            log = EventLog(url)
            warm = Request(url, QUESTION + " (warm-up)", 2)  # loads the model
            warm.run()
            stop = threading.Event()
            streams = [Request(url, stream_prompt(run, i, a.stream_prompt_tokens), a.stream_max_tokens, stop)
                       for i in range(4)]
            for s in streams:
                s.start()
            for s in streams:
                s.first.wait(3600)
            t0 = time.perf_counter()
            doc = Request(url, document(1000 * run, a.doc_tokens), 8)
            doc.start()
            time.sleep(a.question_after)
            questions = []
            for i in range(a.questions):
                questions.append(Request(url, f"{QUESTION} (run {run}, {i})", 8))
                questions[-1].start()
                if i + 1 < a.questions:
                    time.sleep(1)
            for r in [doc, *questions]:
                r.join(3600)
            t_end = doc.t_first or doc.t_done
            stop.set()
            for s in streams:
                s.join(600)
            time.sleep(0.3)
            events = log.stop()
    gaps = [b - x for s in streams for x, b in zip(s.times, s.times[1:]) if t0 <= b <= t_end]
    steps = [e for e in events if e.get("type") == "step" and t0 <= e["t_client"] <= t_end]
    loaded = next((e for e in events if e.get("type") == "model" and e.get("event") == "loaded"), {})
    q_tokens = [q.prompt_tokens for q in questions]
    claimed: set[int] = set()
    return {
        "run": run,
        "questions": [{"ttft_s": q.ttft, "total_s": q.total, "prompt_tokens": q.prompt_tokens,
                       "daemon": request_story(events, q.prompt_tokens, q.t_sent - 1, claimed)
                       if q.prompt_tokens else {}}
                      for q in questions],
        "doc": {"ttft_s": doc.ttft, "prompt_tokens": doc.prompt_tokens,
                "daemon": request_story(events, doc.prompt_tokens, t0 - 1, claimed) if doc.prompt_tokens else {}},
        "stream_gap_ms": {"p50": 1000 * (pct(gaps, .5) or 0), "p99": 1000 * (pct(gaps, .99) or 0),
                          "max": 1000 * max(gaps, default=0), "n": len(gaps)},
        "steps": {"n": len(steps), "preempted": sum(e.get("preempted", 0) for e in steps),
                  "parked": sum(e.get("parked", 0) for e in steps),
                  "step_ms_p50": pct([e["step_ms"] for e in steps], .5),
                  "step_ms_max": max((e["step_ms"] for e in steps), default=None),
                  "kv_used_max": max((e["kv_used"] for e in steps), default=None),
                  "kv_total": loaded.get("kv_tokens")},
        "model": {k: loaded.get(k) for k in ("kv_layout", "kv_tokens", "slots", "context_length", "kv_types")},
        "errors": [r.error for r in [*streams, doc, *questions] if r.error],
        "question_tokens": q_tokens,
        "loadavg_end": os.getloadavg(),
    }


def reasons(story: dict) -> str:
    waits = story.get("waits") or []
    if not waits:
        return "none"
    seen: dict[str, int] = {}
    for w in waits:
        seen[w["reason"]] = seen.get(w["reason"], 0) + 1
    return ", ".join(f"{k}×{v}" for k, v in seen.items())


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f} s"


def table(rows: list[dict]) -> str:
    out = ["| run | question TTFT (first / max) | its prefill steps | question waited for | document TTFT (tokens) | "
           "document waited for | streams' gap P50 / P99 | step P50 | preempted / parked | KV layout, pool |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tt = [q["ttft_s"] for q in r["questions"] if q["ttft_s"] is not None]
        qs = r["questions"][0] if r["questions"] else {"daemon": {}}
        m = r["model"]
        out.append(f"| {r['run']} | {fmt(tt[0] if tt else None)} / {fmt(max(tt, default=None))} | "
                   f"{qs['daemon'].get('prefill_steps', '—')} | {reasons(qs['daemon'])} | {fmt(r['doc']['ttft_s'])} "
                   f"({r['doc']['prompt_tokens']}) | {reasons(r['doc']['daemon'])} | "
                   f"{r['stream_gap_ms']['p50']:.0f} / {r['stream_gap_ms']['p99']:.0f} ms | "
                   f"{r['steps']['step_ms_p50'] or 0:.0f} ms | {r['steps']['preempted']} / {r['steps']['parked']} | "
                   f"{m.get('kv_layout')}, {m.get('kv_tokens')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=8192, help="OLLAMA_CONTEXT_LENGTH")
    ap.add_argument("--stream-prompt-tokens", type=int, default=3000)
    ap.add_argument("--stream-max-tokens", type=int, default=4000)
    ap.add_argument("--doc-tokens", type=int, default=6000)
    ap.add_argument("--question-after", type=float, default=3.0, help="seconds after the document is sent")
    ap.add_argument("--questions", type=int, default=1)
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="a non-default daemon setting (an A/B row; PYTHONPATH=<another checkout> runs other code)")
    ap.add_argument("--out", type=Path, default=HERE / "next_question_runs.json")
    a = ap.parse_args()
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=HERE).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as kv_dir:
        for run in range(1, a.runs + 1):
            print(f"== run {run}", flush=True)
            rows.append(run_once(run, a, kv_dir))
            print(json.dumps(rows[-1]), flush=True)
    entry = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu, "git": git, "loadavg": os.getloadavg(),
             "args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}
    old = json.loads(a.out.read_text()) if a.out.exists() else {"runs": []}
    old["runs"].append(entry)
    a.out.write_text(json.dumps(old, indent=1))
    tt = [q["ttft_s"] for r in rows for q in r["questions"] if q["ttft_s"] is not None]
    lines = [f"{cpu}; git {git}; 4 streams of ~{a.stream_prompt_tokens}-token prompts decoding, a ~{a.doc_tokens}-token "
             f"document, {a.questions} question(s) from {a.question_after:g} s after it; OLLAMA_CONTEXT_LENGTH={a.ctx}"
             f"{'; ' + ' '.join(a.env) if a.env else ''}; load average at the end "
             f"{' '.join(f'{x:.1f}' for x in entry['loadavg'])}", "", table(rows)]
    if tt:
        lines += ["", f"question TTFT over all runs: median {statistics.median(tt):.2f} s, max {max(tt):.2f} s"]
    print("\n" + "\n".join(lines))
    # the latest invocation's table next to its JSON (which keeps every invocation)
    md = a.out.with_suffix(".md")
    md.write_text(f"# next_question_runs.py, {entry['time']}\n\n`python docs/bench/next_question_runs.py "
                  + " ".join(sys.argv[1:]) + "`\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
