"""A cold prefill of a ~1.4k-token document on real Gemma 3 270M (issue 37): what each llama.cpp setting costs, in
evenflow's runner (llama-cpp-python) and in llama-server (xllamacpp), measured as CPU seconds.

    python docs/bench/window_prefill.py                    # 1 thread, 3 rounds, ~15 min on a quiet 2-core machine
    python docs/bench/window_prefill.py --threads 2 --model smollm2

A shared machine's wall clock says little (other work steals the cores mid-pass, and llama.cpp's threads then wait
on each other); the CPU time one thread spends on the pass is the work itself. Settings: the KV types (evenflow's
CPU default is a q8_0 K and an f16 V; llama-server's f16/f16), flash attention (evenflow's CPU default off,
llama-server's auto = on), and the window layers' cache at full size (`swa_full`: evenflow keeps it, the cells a
prefix hit after a long answer needs; llama-server's default is off: a window plus a batch). Each round runs every
setting once, in order, on a document it has not seen (no prefix cache); the best round of each is reported.
evenflow: an Engine on the runner at the daemon's step size (512) with nobody else running, the time from submit
to the first token; llama-server: a non-streamed /v1/completions, its own `prompt_ms` and the process's CPU time.
Results: docs/bench/window_prefill.json (appended), docs/bench/window_prefill.md (the latest run), stdout.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from kv_disk import cpu_model  # noqa: E402
from window_cache import real_model  # noqa: E402

# name -> (evenflow kv_cache_type, flash_attention, swa_full) ; llama-server: (cache_type_k, flash_attn_type, swa_full)
EVENFLOW = {"evenflow defaults (q8_0 K / f16 V, FA off, swa_full)": ("auto", "auto", True),
            "swa_full off": ("auto", "auto", False),
            "f16 / f16": ("f16", "auto", True),
            "f16 / f16, FA on, swa_full off (llama-server's)": ("f16", "on", False)}
SERVER = {"llama-server defaults (f16, FA auto, swa_full off)": (1, -1, False),
          "FA off": (1, 0, False),
          "FA off, q8_0 K, swa_full (evenflow's)": (8, 0, True)}


def document(i: int) -> str:
    return f"Report {i}.\n" + " ".join(f"Paragraph {k}: the river town of Elm{k} trades wool, salt and {k * 3} "
                                       "barrels of cider each autumn." for k in range(55)) + "\nQuestion: what?"


def evenflow_prefill(gguf: Path, setting: tuple, threads: int, text: str) -> dict:
    import llama_cpp.llama_cpp as L

    from evenflow.backends.base import RunnerSettings, load_runner
    from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams

    kv, fa, swa_full = setting
    default_params = L.llama_context_default_params

    def params():  # the runner takes llama.cpp's defaults for what it does not set itself
        p = default_params()
        p.swa_full = swa_full
        return p

    L.llama_context_default_params = params
    try:
        r = load_runner("llamacpp", str(gguf), RunnerSettings(context_length=4096, num_threads=threads,
                                                             max_num_batched_tokens=512, kv_cache_type=kv,
                                                             flash_attention=fa))
    finally:
        L.llama_context_default_params = default_params
    try:
        ids = r.tokenizer.encode(text, add_special=True)
        engine = Engine(r, EngineConfig(max_num_batched_tokens=512, target_itl_ms=None))
        t0, c0 = time.perf_counter(), time.process_time()
        stream = engine.submit(ids, SamplingParams(temperature=0, num_predict=1), loop=None)
        while engine.run_once():
            pass
        list(stream)
        return {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0, "tokens": len(ids),
                "kv_types": list(r.kv_types)}
    finally:
        r.close()


def server_prefill(gguf: Path, setting: tuple, threads: int, text: str) -> dict:
    import httpx
    import xllamacpp

    from llama_server import make_params

    p = make_params(gguf, slots=4, ctx_per_slot=4096, threads=threads)
    p.cache_type_k, p.flash_attn_type, p.swa_full = setting
    server = xllamacpp.Server(p)
    try:
        url = server.listening_address.rstrip("/")
        with httpx.Client(timeout=7200, trust_env=False) as c:
            c.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1}).raise_for_status()
        t0, c0 = time.perf_counter(), time.process_time()
        with httpx.Client(timeout=7200, trust_env=False) as c:
            out = c.post(url + "/v1/completions", json={"prompt": text, "max_tokens": 1, "temperature": 0}).json()
        t = out.get("timings", {})
        return {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0,
                "prompt_s": t.get("prompt_ms", 0) / 1e3, "tokens": t.get("prompt_n")}
    finally:
        del server
        gc.collect()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "window_prefill.json")
    ap.add_argument("--md", type=Path, default=HERE / "window_prefill.md")
    ap.add_argument("--note", default="", help="a line for the markdown (how busy the machine was, say)")
    a = ap.parse_args()
    gguf = real_model(a.model)
    runs: dict[str, list[dict]] = {}
    for rnd in range(a.rounds):
        for i, (name, setting) in enumerate([*EVENFLOW.items(), *SERVER.items()]):
            text = document(100 * rnd + i)
            fn = evenflow_prefill if name in EVENFLOW else server_prefill
            res = fn(gguf, setting, a.threads, text)
            runs.setdefault(name, []).append(res)
            print(f"round {rnd} | {name}: {res['cpu_s']:.2f} CPU s, {res['wall_s']:.2f} s wall", flush=True)
    best = {k: min(v, key=lambda x: x["cpu_s"]) for k, v in runs.items()}
    base = best[next(iter(EVENFLOW))]["cpu_s"]
    rows = ["| runner | setting | CPU s (best round) | vs evenflow's defaults | wall s (that round) |",
            "|---|---|---|---|---|"]
    for name, b in best.items():
        who = "evenflow (llama-cpp-python)" if name in EVENFLOW else "llama-server (xllamacpp)"
        rows.append(f"| {who} | {name} | {b['cpu_s']:.2f} | {b['cpu_s'] / base:.2f}x | {b['wall_s']:.2f} |")
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu_model(), "loadavg": os.getloadavg(),
              "args": {k: str(v) for k, v in vars(a).items()}, "runs": runs}
    old = json.loads(a.out.read_text()) if a.out.exists() else []
    a.out.write_text(json.dumps(old + [record], indent=1))
    head = (f"{a.model}, a {best[next(iter(EVENFLOW))]['tokens']}-token document, {a.threads} thread(s), "
            f"{a.rounds} rounds; {record['cpu']}, load average at the end "
            f"{', '.join(f'{x:.1f}' for x in record['loadavg'])}")
    table = "\n".join(rows)
    print(f"\n{head}\n\n{table}")
    a.md.write_text(f"# Cold prefill by llama.cpp setting (`docs/bench/window_prefill.py`)\n\n{head} ({record['time']})."
                    f" {a.note}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
