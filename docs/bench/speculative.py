"""Speculative decoding as a user gets it (issue 39): a DEFAULT evenflow daemon beside the same daemon with
speculation off, llama-server without speculation and llama-server with its n-gram speculation, in one run.

    python docs/bench/speculative.py                      # Gemma 3 270M (copies verbatim), ~20-40 min on 2 cores
    python docs/bench/speculative.py --model smollm2 --reps 2

Every server runs the same GGUF on 2 threads and stays up for the whole run; the requests go round the servers
(one at a time, each server idle while another runs), so a change in the machine's load hits all of them alike and
the ratios compare like with like. Scenarios, all over the OpenAI /v1/completions API, streamed, raw prompts (the
models are base models: no chat template):
- extraction: a 1-2k-token real document (the Apache License 2.0 text of the Debian `common-licenses`, cut at a
  section boundary) and a request to quote a definition, list the headings, copy a sentence; greedy, and the
  document prefix is cached on every server after the warm-up, so the figure is decode speed;
- free generation: a story opening, greedy and sampled (temperature 0.8, seed fixed);
- stall: 4 streams decode while the document goes in (`../shared/tools/stream_bench.py`, the independent client):
  the streams' P99 gap, evenflow with and without speculation.
Decode tokens/s = (completion tokens - 1) / (last chunk - first chunk), completion tokens from the stream's usage.
evenflow's own counters (/metrics) give the acceptance rate and tokens per forward of each scenario.
Writes speculative.json and speculative.md next to this file.

On a machine shared with other work, run it as `GOMP_SPINCOUNT=0 python docs/bench/speculative.py`: llama.cpp's
OpenMP threads spin at every barrier before they sleep, and with more runnable threads than cores a spinning thread
takes the core its peer needs (a Gemma decode took 737 ms instead of 167 here). The variable reaches every server
(the daemons inherit it, the in-process llama-servers' libgomp reads it at import) and is recorded in the JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from default_stall import import_model, MODEL  # noqa: E402
from llama_server import llama_server  # noqa: E402
from perf_suite import serve_daemon  # noqa: E402

TOOLS = Path(os.environ.get("EVENFLOW_SHARED_TOOLS", HERE.parents[2] / "shared" / "tools"))
DOC_PATH = Path("/usr/share/common-licenses/Apache-2.0")
THREADS = 2
EXTRACT = [  # (name, question appended to the document); the answer starts where the prompt ends
    ("quote a definition", '\n\nQuestion: How does the License define "Legal Entity"? Quote the definition exactly.'
                           '\nAnswer: "Legal Entity" shall mean'),
    ("list the headings", "\n\nThe numbered sections of the License above, with their titles:\n1."),
    ("copy a clause", "\n\nCopy section 2 (Grant of Copyright License) word for word:\n2. Grant of Copyright License."),
    ("copy a definition", '\n\nCopy the definition of "Derivative Works" exactly as written:'
                          '\n"Derivative Works" shall'),
]
STORY = "Once upon a time, in a small village by the sea, there lived a lighthouse keeper named"


def document(max_chars: int) -> str:
    """The Apache License 2.0 text cut at the last section boundary before `max_chars`."""
    text = DOC_PATH.read_text()
    body = text[text.index("TERMS AND CONDITIONS"):]
    cut = max(m.start() for m in re.finditer(r"\n\s+\d+\. [A-Z]", body[:max_chars]))
    return body[:cut].rstrip() + "\n"


def llama_server_ngram(gguf: str, slots: int) -> Any:
    """llama-server with its n-gram speculation (`--spec-type ngram-simple`, its default sizes)."""
    import xllamacpp

    return llama_server(gguf, slots=slots, ctx_per_slot=4096, threads=THREADS,
                        speculative=[xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE])


def complete(url: str, prompt: str, max_tokens: int, temperature: float, seed: int) -> dict[str, Any]:
    """One streamed /v1/completions request on a fresh connection; chunk arrival times and the usage."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    times, text, usage = [], [], None
    t0 = time.perf_counter()
    with httpx.Client(timeout=600, trust_env=False) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                if ch.get("text"):
                    times.append(time.perf_counter() - t0)
                    text.append(ch["text"])
    n = int((usage or {}).get("completion_tokens") or len(times))
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"tokens": n, "chunks": len(times), "ttft_s": times[0] if times else None,
            "decode_tok_s": (n - 1) / span if span > 0 else None, "text": "".join(text)}


def spec_counters(url: str) -> dict[str, float]:
    """evenflow's speculative counters and decode steps (summed over models)."""
    out = {"draft": 0.0, "accepted": 0.0, "decodes": 0.0}
    names = {"evenflow_speculative_draft_tokens_total": "draft", "evenflow_speculative_accepted_tokens_total":
             "accepted", 'evenflow_engine_step_tokens_total{kind="decode"': "decodes"}
    for line in httpx.get(url + "/metrics", timeout=30, trust_env=False).text.splitlines():
        for prefix, key in names.items():
            if line.startswith(prefix):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def stall(url: str, seconds: float, seed: int) -> dict[str, Any]:
    """4 streams + a 1.5k-token prompt, the independent client (OpenAI API); its JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, str(TOOLS / "stream_bench.py"), "--url", url, "--api", "openai", "--model", MODEL,
               "--scenario", "stall", "--streams", "4", "--long-prompt-tokens", "1500", "--short-max-tokens",
               "20000", "--long-max-tokens", "8", "--max-seconds", str(seconds), "--seed", str(seed),
               "--tail", "10", "--json-out", f.name]
        subprocess.run(cmd, check=True, capture_output=True, timeout=seconds + 120)
        return json.loads(Path(f.name).read_text())


def stall_summary(res: dict[str, Any]) -> dict[str, Any]:
    """The streams' P99 gap before and during the document, and the document's first token (None: not within
    the run, then `ttft_lower_bound_s` says how long it had)."""
    long = res.get("long") or {}
    return {"p99_during_ms": gap_p99(res, "during_prefill"), "p99_before_ms": gap_p99(res, "baseline"),
            "doc_ttft_s": long.get("ttft_s"), "doc_ttft_lower_bound_s": long.get("ttft_lower_bound_s")}


def gap_p99(res: dict[str, Any], window: str) -> float | None:
    """P99 inter-chunk gap (ms) of the short streams in a window of stream_bench's report."""
    w = (res.get("windows") or {}).get(window.replace("-", "_")) or {}
    v = w.get("p99_ms", w.get("p99"))
    return float(v) if v is not None else None


@contextlib.contextmanager
def servers(gguf: str, names: list[str]) -> Iterator[dict[str, str]]:
    """Every server up at once, the document warm in each."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        base = {"EVENFLOW_NUM_THREADS": str(THREADS), "OLLAMA_KEEP_ALIVE": "-1", "EVENFLOW_KV_CACHE_SIZE": "0"}
        for name in names:
            if name.startswith("evenflow"):
                store = stack.enter_context(tempfile.TemporaryDirectory(prefix="spec-bench-"))
                env = {**base, "OLLAMA_MODELS": store}
                if name == "evenflow spec off":
                    env["EVENFLOW_SPECULATIVE"] = "off"
                urls[name] = stack.enter_context(serve_daemon(env, "speculative_daemon.log"))
                import_model(urls[name], Path(gguf))
            elif name == "llama-server":
                urls[name] = stack.enter_context(llama_server(gguf, slots=5, ctx_per_slot=4096, threads=THREADS))
            else:
                urls[name] = stack.enter_context(llama_server_ngram(gguf, slots=5))
        yield urls


def run_stall_only(gguf: str, seconds: float, out: str, meta: dict[str, Any]) -> None:
    """The stall scenario alone, speculation off first (the full run goes the other way round)."""
    names = ["evenflow spec off", "evenflow"]
    res: dict[str, Any] = {}
    with servers(gguf, names) as urls:
        for name in names:
            raw = stall(urls[name], seconds, 7)
            res[name] = {**stall_summary(raw), "raw": raw}
            print(f"stall {name}: {({k: v for k, v in res[name].items() if k != 'raw'})}", flush=True)
    meta["loadavg_end"] = os.getloadavg()
    Path(out + "_stall.json").write_text(json.dumps({"meta": meta, "stall": res}, indent=1))


def summarize(rows: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for scenario in sorted({r["scenario"] for r in rows}):
        out[scenario] = {}
        for n in names:
            v = [r["decode_tok_s"] for r in rows
                 if r["scenario"] == scenario and r["server"] == n and r["decode_tok_s"]]
            out[scenario][n] = statistics.median(v) if v else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3", choices=["gemma3", "smollm2"])
    ap.add_argument("--gguf", help="a GGUF instead of --model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--doc-chars", type=int, default=10000)
    ap.add_argument("--stall-seconds", type=float, default=150)
    ap.add_argument("--skip-stall", action="store_true")
    ap.add_argument("--out", default=str(HERE / "speculative"))
    ap.add_argument("--stall-only", action="store_true",
                    help="only the stall scenario (speculation off first), written to OUT_stall.json")
    ap.add_argument("--report-only", action="store_true", help="rewrite OUT.md from OUT.json, run nothing")
    ap.add_argument("--only", help="only the scenarios whose name contains this (e.g. 'temperature'), no stall")
    ap.add_argument("--servers", help="comma-separated subset of the servers (e.g. 'evenflow,evenflow spec off')")
    a = ap.parse_args()
    if a.report_only:
        out = json.loads(Path(a.out + ".json").read_text())
        out["stall"] = {k: stall_summary(v) for k, v in out.get("stall_raw", {}).items()}
        rerun = Path(a.out + "_stall.json")
        if rerun.is_file():  # a --stall-only run, speculation off first: rows of its own
            out["stall"].update({f"{k} (--stall-only, off first)": {kk: vv for kk, vv in v.items() if kk != "raw"}
                                 for k, v in json.loads(rerun.read_text())["stall"].items()})
        Path(a.out + ".json").write_text(json.dumps(out, indent=1))
        Path(a.out + ".md").write_text(report(out, list(out["extraction_median"])))
        return
    gguf = a.gguf or subprocess.run([sys.executable, str(TOOLS / "real_models.py"), a.model], check=True,
                                    capture_output=True, text=True).stdout.strip()
    doc = document(a.doc_chars)
    names = ["evenflow", "evenflow spec off", "llama-server", "llama-server ngram-simple"]
    if a.servers:
        names = [n for n in names if n in a.servers.split(",")]
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    meta: dict[str, Any] = {"model": Path(gguf).name, "cpu": cpu, "threads": THREADS, "doc_chars": len(doc),
                            "max_tokens": a.max_tokens, "reps": a.reps, "loadavg_start": os.getloadavg(),
                            "time": time.strftime("%Y-%m-%d %H:%M"), "shared_machine": True,
                            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")}
    if a.stall_only:
        run_stall_only(gguf, a.stall_seconds, a.out, meta)
        return
    rows: list[dict[str, Any]] = []
    spec: dict[str, dict[str, float]] = {}
    with servers(gguf, names) as urls:
        for name, url in urls.items():  # warm-up: the document into every server's prefix cache
            complete(url, doc + EXTRACT[0][1], 4, 0.0, 1)
        jobs = [(f"extract: {q}", doc + p, 0.0) for q, p in EXTRACT]
        jobs += [("story, greedy", STORY, 0.0), ("story, temperature 0.8", STORY, 0.8)]
        if a.only:
            jobs = [j for j in jobs if a.only in j[0]]
        for rep in range(a.reps):
            for j, (scenario, prompt, temp) in enumerate(jobs):
                order = names[(rep + j) % len(names):] + names[:(rep + j) % len(names)]  # who goes first rotates
                for name in order:
                    before = spec_counters(urls[name]) if name.startswith("evenflow") else None
                    r = complete(urls[name], prompt, a.max_tokens, temp, 7 + rep)
                    if before is not None:
                        after = spec_counters(urls[name])
                        acc = spec.setdefault(f"{name}|{scenario.split(':')[0]}", {"draft": 0, "accepted": 0,
                                                                                     "decodes": 0})
                        for k in acc:
                            acc[k] += after[k] - before[k]
                    rows.append({"server": name, "scenario": scenario, "rep": rep, **r})
                    print(f"{rep} {scenario:32s} {name:26s} {r['tokens']:4d} tok "
                          f"{r['decode_tok_s'] or 0:6.1f} tok/s  {r['text'][:50]!r}", flush=True)
        stalls = {}
        if not a.skip_stall and not a.only:
            for name in ("evenflow", "evenflow spec off"):
                res = stall(urls[name], a.stall_seconds, 7)
                stalls[name] = {**stall_summary(res), "raw": res}
                print(f"stall {name}: P99 gap during ingestion {stalls[name]['p99_during_ms']} ms", flush=True)
    meta["loadavg_end"] = os.getloadavg()
    table = summarize(rows, names)
    # the extraction scenarios together: per server, the median over every extraction request
    ext = {n: statistics.median(v) for n in names if (v := [r["decode_tok_s"] for r in rows if r["server"] == n and
                                                            r["scenario"].startswith("extract") and r["decode_tok_s"]])}
    out = {"meta": meta, "rows": rows, "median_decode_tok_s": table, "extraction_median": ext,
           "speculation": {k: {**v, "acceptance": v["accepted"] / v["draft"] if v["draft"] else 0.0,
                               "tokens_per_forward": (v["decodes"] + v["accepted"]) / v["decodes"] if v["decodes"]
                               else 0.0} for k, v in spec.items()},
           "stall": {k: {kk: vv for kk, vv in v.items() if kk != "raw"} for k, v in stalls.items()},
           "stall_raw": {k: v["raw"] for k, v in stalls.items()}}
    Path(a.out + ".json").write_text(json.dumps(out, indent=1))
    Path(a.out + ".md").write_text(report(out, names))
    print(report(out, names))


def report(out: dict[str, Any], names: list[str]) -> str:
    m = out["meta"]
    off = "evenflow spec off"
    spin = f" GOMP_SPINCOUNT={m['gomp_spincount']} for every server." if m.get("gomp_spincount") is not None else ""
    lines = [f"# Speculative decoding: {m['model']}, {m['threads']} threads, {m['cpu']}", "",
             f"{m['time']};{spin} a machine shared with other engineers' work (load average "
             f"{m['loadavg_start'][0]:.1f} at the start, {m['loadavg_end'][0]:.1f} at the end): ratios within this "
             "run, not absolute speeds. "
             f"Greedy unless said; {m['reps']} rounds, {m['max_tokens']} tokens at most; median decode tokens/s.", "",
             "| scenario | " + " | ".join(names) + f" | evenflow / {off} |", "|---" * (len(names) + 2) + "|"]
    rows = [("extraction, all prompts", out["extraction_median"])] + list(out["median_decode_tok_s"].items())
    for scenario, vals in rows:
        cells = [f"{vals[n]:.1f}" if vals.get(n) else "-" for n in names]
        ratio = vals["evenflow"] / vals[off] if vals.get("evenflow") and vals.get(off) else None
        lines.append(f"| {scenario} | " + " | ".join(cells) + (f" | {ratio:.2f}x |" if ratio else " | - |"))
    pairs = [(r, o) for r in out["rows"] for o in out["rows"] if r["server"] == "evenflow" and o["server"] == off
             and r["scenario"] == o["scenario"] and r["rep"] == o["rep"] and "temperature" not in r["scenario"]]
    same = sum(r["text"] == o["text"] for r, o in pairs)
    lines += ["", f"Greedy answers equal to speculation off: {same} of {len(pairs)} (llama.cpp computes a verified "
              "row with other kernels than a one-token decode: rounding, then a near tie can go the other way; "
              "docs/api.md, *Speculative decoding*)."]
    lines += ["", "evenflow's own counters per kind of request (default daemon):", "",
              "| requests | draft tokens | accepted | acceptance | tokens per forward |", "|---|---|---|---|---|"]
    for k, v in out["speculation"].items():
        if k.startswith("evenflow|"):
            lines.append(f"| {k.split('|')[1]} | {v['draft']:.0f} | {v['accepted']:.0f} | {v['acceptance']:.0%} | "
                         f"{v['tokens_per_forward']:.2f} |")
    if out["stall"]:
        lines += ["", "4 streams decoding while the document (1.5k tokens) goes in, P99 gap of the streams:", "",
                  "| daemon | before the document | during its ingestion | the document's first token |",
                  "|---|---|---|---|"]
        for k, v in out["stall"].items():
            ttft = (f"{v['doc_ttft_s']:.1f} s" if v.get("doc_ttft_s") is not None
                    else f"not within the run (> {v.get('doc_ttft_lower_bound_s') or 0:.0f} s)")
            lines.append(f"| {k} | {v['p99_before_ms']} ms | {v['p99_during_ms']} ms | {ttft} |")
        lines += ["", "The two stall runs ran one after the other (not interleaved): compare each row's 'during' with "
                  "its own 'before'."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
