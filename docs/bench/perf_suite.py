"""evenflow vs llama-server, side by side, over HTTP on this machine: the figures in docs/performance.md.

    python docs/bench/perf_suite.py                 # everything (~30 min on 2 cores)
    python docs/bench/perf_suite.py --quick         # L=2048 only, fewer configs

The synthetic `bench` model (Llama shape, ~250M params) as a Q8_0 GGUF; evenflow on the llama.cpp backend
and llama-server (from the `xllamacpp` wheel) both with the same thread count. Every server is started
fresh for its configuration; the client (`evenflow.clients.bench`) speaks OpenAI /v1/completions to both.
Writes docs/bench/perf_suite.json, docs/bench/stall_*.png and docs/performance.md's tables (perf_tables.md).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np

from evenflow.backends.synthetic import cached_model, make_spec
from evenflow.clients.bench import Calibration, run_stall
from evenflow.clients.bench_http import make_prompt, stream_request
from evenflow.clients.bench_metrics import RequestRecord
from evenflow.clients.bench_report import write_timeline_png

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llama_server import llama_server  # noqa: E402

MODEL = "bench"
PROTOCOL = "openai-completions"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def import_model(store: Path, gguf: Path) -> None:
    from evenflow.daemon.store import ModelStore, create_model

    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    st = ModelStore(store)
    with gguf.open("rb") as f:
        st.write_blob(digest, iter(lambda: f.read(1 << 20), b""))
    for _ in create_model(st, MODEL, files={gguf.name: digest}):
        pass


@contextlib.contextmanager
def serve_daemon(env: dict[str, str], log_name: str) -> Iterator[str]:
    """`evenflow serve --no-demo` on a free loopback port with `env` over os.environ; yields its URL."""
    port = free_port()
    full = {**os.environ, **env, "OLLAMA_HOST": f"127.0.0.1:{port}"}
    log = open(HERE / log_name, "ab")
    proc = subprocess.Popen([sys.executable, "-m", "evenflow.clients.cli", "serve", "--no-demo"], env=full,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"evenflow exited with {proc.returncode}; see {log.name}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def evenflow_daemon(store: Path, threads: int, ctx: int, env: dict[str, str]):
    """The perf suite's daemon: llama.cpp, its thread count and context, 9 slots, never unloading."""
    return serve_daemon({"OLLAMA_MODELS": str(store), "EVENFLOW_BACKEND": "llamacpp",
                         "EVENFLOW_NUM_THREADS": str(threads), "OLLAMA_CONTEXT_LENGTH": str(ctx),
                         "OLLAMA_KEEP_ALIVE": "-1", "EVENFLOW_MAX_SEQS": "9", **env}, "perf_suite_daemon.log")


class StepRecorder:
    """Collects evenflow's /api/events step events in a thread (to fit the measured step-cost model)."""

    def __init__(self, url: str) -> None:
        self.steps: list[dict] = []
        self.events: list[dict] = []  # model events (loaded: backend, slots, kv_layout)
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
                        if ev.get("type") == "step":
                            self.steps.append(ev)
                        elif ev.get("type") == "model":
                            self.events.append(ev)
        except httpx.HTTPError:
            pass

    def stop(self) -> list[dict]:
        self._stop.set()
        return self.steps


def fit_step_cost(steps: list[dict]) -> np.ndarray | None:
    """Least squares t = a + b*decodes + c*prefill + d*context over measured steps with decodes > 0."""
    rows = [(1.0, s["decodes"], s["prefill_tokens"], s.get("attention_work", 0), s["step_ms"] / 1e3)
            for s in steps if s["decodes"] > 0]
    if len(rows) < 8:
        return None
    a = np.array(rows)
    coef, *_ = np.linalg.lstsq(a[:, :4], a[:, 4], rcond=None)
    return coef


def frontier_ttft(coef: np.ndarray, target_s: float, prompt_len: int, decodes: int, decode_work: int) -> float:
    """TTFT if every step took the largest chunk the fitted cost allows under the target (no margin)."""
    a, b, c, d = coef

    def cost(done: int, chunk: int) -> float:
        return a + b * decodes + c * chunk + d * (decode_work + chunk * done + chunk * (chunk + 1) / 2)

    done, t = 0, 0.0
    while done < prompt_len:
        chunk = 1
        while chunk < prompt_len - done and cost(done, chunk + 1) <= target_s:
            chunk += 1
        t += cost(done, chunk)
        done += chunk
    return t


async def ttft_alone(url: str, model: str, cal: Calibration, prompt_len: int, seed: int = 7) -> float:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=600) as client:
        rec = RequestRecord(rid=0, kind="long", prompt_len_target=prompt_len, output_len=2)
        t0 = time.perf_counter()
        await stream_request(client, PROTOCOL, model, make_prompt(cal.words_for(prompt_len), seed), rec, t0, seed)
        if rec.error or not rec.token_times:
            raise RuntimeError(f"TTFT request failed: {rec.error}")
        return rec.token_times[0] - rec.start


async def throughput(url: str, model: str, n: int, output_len: int = 96) -> float:
    """Aggregate decode tokens/s of n concurrent streams, over the window where all n are decoding."""
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=600) as client:
        t0 = time.perf_counter()
        recs = [RequestRecord(rid=i, kind="stream", prompt_len_target=32, output_len=output_len) for i in range(n)]
        await asyncio.gather(*(stream_request(client, PROTOCOL, model, make_prompt(24, 1000 + i), r, t0, i)
                               for i, r in enumerate(recs)))
    start = max(r.token_times[0] for r in recs)
    end = min(r.token_times[-1] for r in recs)
    count = sum(sum(1 for t in r.token_times if start < t <= end) for r in recs)
    return count / max(end - start, 1e-9)


def paired_phase(out: dict[str, Any], store: Path, gguf: Path, threads: int, ctx: int, big: str,
                 lengths: list[int], cals: dict[int, Calibration], reps: int) -> None:
    """TTFT alone and aggregate throughput, paired: the servers under comparison are all up at once (idle ones
    cost nothing) and take turns, rep after rep, so a slow minute of this shared machine hits every side
    instead of deciding a ratio. Each sample is kept; the tables report the median."""
    ad150 = {"EVENFLOW_TARGET_ITL_MS": "150", "EVENFLOW_MAX_BATCHED_TOKENS": big}
    mono = {"EVENFLOW_PREFILL": "monolithic", "EVENFLOW_TARGET_ITL_MS": "0", "EVENFLOW_MAX_BATCHED_TOKENS": big}
    with contextlib.ExitStack() as stack:
        ev = stack.enter_context(evenflow_daemon(store, threads, ctx, ad150))
        ev_mono = stack.enter_context(evenflow_daemon(store, threads, ctx, mono))
        ls = stack.enter_context(llama_server(gguf, n_batch=2048, n_ubatch=512, slots=9, ctx_per_slot=ctx,
                                              threads=threads, verbosity=0))
        alone = [("evenflow adaptive 150 ms", ev, MODEL), ("evenflow monolithic", ev_mono, MODEL),
                 ("llama-server defaults (n_batch 2048, n_ubatch 512)", ls, "bench")]
        for url, model in ((ev, MODEL), (ev_mono, MODEL), (ls, "bench")):  # load and warm every server
            asyncio.run(throughput(url, model, 1, output_len=8))
        samples: dict[tuple, list[float]] = {}
        for rep in range(reps):
            for L in [x for x in lengths if x in cals]:
                for label, url, model in alone:
                    t = asyncio.run(ttft_alone(url, model, cals[L], L, seed=7 + rep))
                    samples.setdefault(("ttft_alone", label, L), []).append(t)
                    print(f"rep {rep} L={L} {label:48s} TTFT alone {t:.2f} s", flush=True)
            for n in (1, 4, 8):
                for label, url, model in (("evenflow", ev, MODEL), ("llama-server", ls, "bench")):
                    tok_s = asyncio.run(throughput(url, model, n))
                    samples.setdefault(("throughput", label, n), []).append(tok_s)
                    print(f"rep {rep} {n} streams {label:12s} {tok_s:.1f} tok/s", flush=True)
    for (kind, label, x), v in samples.items():
        if kind == "ttft_alone":
            out["ttft_alone"].append({"config": label, "L": x, "ttft_s": float(np.median(v)), "samples": v})
        else:
            out["throughput"].append({"config": label, "streams": x, "tok_s": float(np.median(v)), "samples": v})


def memory_bandwidth_gbs() -> float:
    a = np.ones(256 * 1024 * 1024 // 8)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        s = float(a.sum())
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    assert s > 0
    return best


def stall_row(res, label: str, extra: dict[str, Any]) -> dict[str, Any]:
    d = res.to_dict()
    w = d["stall"]["windows"] or {}
    return {"config": label, **extra, "before": w.get("before_ms", {}), "during": w.get("during_ms", {}),
            "ttft_s": (d["stall"]["long_ttft_ms"] or float("nan")) / 1e3,
            "long_prompt_tokens": d["stall"]["long_prompt_tokens"], "warnings": d["warnings"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--lengths", default="2048,4096")
    ap.add_argument("--targets", default="100,150,250")
    ap.add_argument("--budgets", default="16,64,256")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--only", default=None, help="run only the configurations whose label contains this text")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the paired TTFT-alone and throughput runs")
    args = ap.parse_args()
    lengths = [2048] if args.quick else [int(x) for x in args.lengths.split(",")]
    targets = [150] if args.quick else [int(x) for x in args.targets.split(",")]
    args.reps = 1 if args.quick else args.reps
    budgets = [64] if args.quick else [int(x) for x in args.budgets.split(",")]
    gguf = Path(cached_model(make_spec("bench"), formats=("gguf",), gguf_dtype="q8_0")["gguf"])
    ctx = max(lengths) + 1024
    store = Path(tempfile.mkdtemp(prefix="evenflow-perf-store-"))
    import_model(store, gguf)
    out: dict[str, Any] = {"meta": {
        "model": "synthetic bench preset (llama, 16 layers, hidden 1024, FFN 2816, 16/8 heads, 32k vocab), Q8_0 GGUF",
        "gguf_bytes": gguf.stat().st_size, "threads": args.threads, "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
        "protocol": PROTOCOL, "streams": args.streams}, "stall": [], "ttft_alone": [], "throughput": []}
    bw = memory_bandwidth_gbs()
    out["bandwidth"] = {"measured_gbs": bw, "weight_bytes": gguf.stat().st_size,
                        "single_stream_bound_tok_s": bw * 1e9 / gguf.stat().st_size}
    print(f"memory read bandwidth {bw:.1f} GB/s -> single-stream decode bound "
          f"{out['bandwidth']['single_stream_bound_tok_s']:.1f} tok/s", flush=True)
    cals: dict[int, Calibration] = {}
    big = str(max(lengths) + 64)

    def ev_configs():
        for t in targets:
            yield f"evenflow adaptive {t} ms", {"EVENFLOW_TARGET_ITL_MS": str(t), "EVENFLOW_MAX_BATCHED_TOKENS": big}, t
        for b in budgets:
            yield f"evenflow fixed budget {b}", {"EVENFLOW_TARGET_ITL_MS": "0", "EVENFLOW_MAX_BATCHED_TOKENS": str(b)}, None
        yield "evenflow monolithic", {"EVENFLOW_PREFILL": "monolithic", "EVENFLOW_TARGET_ITL_MS": "0",
                                      "EVENFLOW_MAX_BATCHED_TOKENS": big}, None

    ls_configs = [("llama-server defaults (n_batch 2048, n_ubatch 512)", 2048, 512),
                  ("llama-server n_batch 512", 512, 512), ("llama-server n_batch 64", 64, 64)]
    if args.quick:
        ls_configs = ls_configs[:1] + ls_configs[2:]

    def stall(url: str, L: int, label: str, extra: dict) -> dict:
        res = asyncio.run(run_stall(url, PROTOCOL, MODEL if "evenflow" in label else None, args.streams, L,
                                    output_len=3000, long_output_len=4, warmup_s=3.0, tail_s=1.0,
                                    calibration=cals.get(L), duration=900, label={"config": label}))
        if L not in cals and res.calibration is not None:
            cals[L] = res.calibration
        row = stall_row(res, label, extra)
        slug = label.split(" (")[0].replace(" ", "_").replace(",", "")
        write_timeline_png(res, HERE / f"stall_{slug}_L{L}.png")
        b, d = row["before"], row["during"]
        print(f"L={L} {label:48s} P99 before {b.get('p99', float('nan')):7.1f} ms | P99/max during "
              f"{d.get('p99', float('nan')):7.1f}/{d.get('max', float('nan')):7.1f} ms | TTFT {row['ttft_s']:.2f} s",
              flush=True)
        return row

    def wanted(label: str) -> bool:
        return args.only is None or args.only in label

    for label, env, target in ev_configs():
        if not wanted(label):
            continue
        with evenflow_daemon(store, args.threads, ctx, env) as url:
            for L in lengths:
                rec = StepRecorder(url)
                row = stall(url, L, label, {"L": L, "target_ms": target})
                steps = rec.stop()
                coef = fit_step_cost(steps)
                if coef is not None and target:
                    dec = [s for s in steps if s["decodes"] == args.streams and s["prefill_tokens"] == 0]
                    dctx = int(np.median([s["attention_work"] for s in dec])) if dec else 0
                    row["frontier_ttft_s"] = frontier_ttft(coef, target / 1e3, row["long_prompt_tokens"] or L,
                                                           args.streams, dctx)
                    row["step_cost_fit"] = coef.tolist()
                out["stall"].append(row)
    for label, nb, nub in ls_configs:
        if not wanted(label):
            continue
        with llama_server(gguf, n_batch=nb, n_ubatch=nub, slots=args.streams + 1, ctx_per_slot=ctx,
                          threads=args.threads, verbosity=0) as url:
            for L in lengths:
                out["stall"].append(stall(url, L, label, {"L": L, "n_batch": nb}))
    if args.only is None:
        paired_phase(out, store, gguf, args.threads, ctx, big, lengths, cals, args.reps)
    out_path = HERE / ("perf_suite.json" if args.only is None and not args.quick else "perf_suite_partial.json")
    out_path.write_text(json.dumps(out, indent=2, default=float))
    print(json.dumps(out["ttft_alone"], indent=1), json.dumps(out["throughput"], indent=1))


if __name__ == "__main__":
    main()
