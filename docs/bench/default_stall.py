"""Stall and TTFT as a user gets them: a DEFAULT `evenflow serve`, side by side with llama-server (issue 11).

    python docs/bench/default_stall.py --gguf bench-q8.gguf --lengths 2048,8192,16384 --alone 4096,16384

evenflow runs with only EVENFLOW_BACKEND=llamacpp EVENFLOW_TARGET_ITL_MS=150 EVENFLOW_NUM_THREADS=2 (plus
OLLAMA_CONTEXT_LENGTH = L + 1024 where the prompt does not fit the default 4096-token window, a store in a temp
directory and a free loopback port); the GGUF is imported with /api/blobs + /api/create. llama-server
(xllamacpp, in this process) runs the same GGUF with n_batch 64 for the stall and at its defaults (n_batch
2048, n_ubatch 512) for TTFT alone, 5 slots, 2 threads, repacking off. The client is the independent
`../shared/tools/stream_bench.py` (OpenAI /v1/completions) for every row, plus `evenflow bench stall` for
evenflow. Each row gets a fresh server. evenflow's /api/events step events are kept (step cost vs context).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llama_server import llama_server  # noqa: E402
from perf_suite import StepRecorder, serve_daemon  # noqa: E402

TOOLS = Path(os.environ.get("EVENFLOW_SHARED_TOOLS", HERE.parents[2] / "shared" / "tools"))
MODEL = "bench/q8"
DEFAULT_ENV = {"EVENFLOW_BACKEND": "llamacpp", "EVENFLOW_TARGET_ITL_MS": "150", "EVENFLOW_NUM_THREADS": "2"}


DAEMON_NUM_CTX = 4096  # evenflow's (and Ollama's) default OLLAMA_CONTEXT_LENGTH


def cpu_load() -> dict:
    """Load average and CPU pressure stall time so far: the machine is shared with niced background work."""
    some = Path("/proc/pressure/cpu").read_text().split()[4] if Path("/proc/pressure/cpu").exists() else "total=0"
    return {"loadavg": os.getloadavg(), "cpu_some_us": int(some.split("=")[1])}


def import_model(url: str, gguf: Path) -> None:
    data = gguf.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
        c.post(f"/api/blobs/{digest}", content=data).raise_for_status()
        c.post("/api/create", json={"model": MODEL, "files": {gguf.name: digest}, "stream": False}).raise_for_status()


def stream_bench(url: str, scenario: str, L: int, seconds: float, seed: int) -> dict:
    """The independent client, OpenAI protocol; returns its JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, str(TOOLS / "stream_bench.py"), "--url", url, "--api", "openai", "--model", MODEL,
               "--scenario", scenario, "--streams", "4", "--long-prompt-tokens", str(L), "--short-max-tokens",
               "20000", "--long-max-tokens", "8", "--max-seconds", str(seconds), "--seed", str(seed),
               "--no-chunk-times", "--json-out", f.name]
        p = subprocess.run(cmd, capture_output=True, text=True)
        print(p.stdout[-3000:], p.stderr[-2000:], flush=True)
        return json.loads(Path(f.name).read_text()) if Path(f.name).stat().st_size else {"error": p.stderr[-2000:]}


def evenflow_bench(url: str, L: int, seconds: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, "-m", "evenflow.clients.cli", "bench", "stall", "--url", url, "-p",
               "openai-completions", "-L", str(L), "--output-len", "20000", "--duration", str(seconds), "-q",
               "--request-timeout", str(seconds), "--json", f.name]
        p = subprocess.run(cmd, capture_output=True, text=True)
        print(p.stdout[-3000:], p.stderr[-2000:], flush=True)
        if not Path(f.name).stat().st_size:
            return {"error": p.stderr[-2000:]}
        full = json.loads(Path(f.name).read_text())
        return {k: full.get(k) for k in ("summary", "stall", "warnings", "config", "calibration")}


def run_evenflow(gguf: Path, L: int, scenario: str, clients: list[str], seconds: float, seed: int,
                 extra_env: dict[str, str]) -> dict:
    env = {**DEFAULT_ENV, **extra_env}
    if L + 1024 > DAEMON_NUM_CTX:
        env["OLLAMA_CONTEXT_LENGTH"] = str(L + 1024)
    label = " ".join(f"{k}={v}" for k, v in extra_env.items()) or "defaults"
    row: dict = {"server": "evenflow", "label": label, "L": L, "scenario": scenario, "env": dict(env)}
    with tempfile.TemporaryDirectory() as store:
        env["OLLAMA_MODELS"] = store
        with serve_daemon(env, "default_stall_daemon.log") as url:
            import_model(url, gguf)
            rec = StepRecorder(url)
            for client in clients:  # "stream_bench#2": the same client again, on the same (now warm) daemon
                t = time.time()
                kind, _, again = client.partition("#")  # again: another seed, so not a prefix-cache hit
                row[client] = stream_bench(url, scenario, L, seconds, seed + int(again or 0)) \
                    if kind == "stream_bench" else evenflow_bench(url, L, seconds)
                row[client]["wall_s"] = time.time() - t
            time.sleep(0.5)
            row["steps"] = rec.stop()
            row["kv_layout"] = next((e.get("kv_layout") for e in rec.events if e.get("event") == "loaded"), None)
    return row


def run_llama_server(gguf: Path, L: int, scenario: str, seconds: float, seed: int) -> dict:
    nb, nub = (64, 64) if scenario == "stall" else (2048, 512)
    row: dict = {"server": f"llama-server n_batch {nb}", "L": L, "scenario": scenario, "n_batch": nb,
                 "n_ubatch": nub}
    with llama_server(gguf, n_batch=nb, n_ubatch=nub, slots=5, ctx_per_slot=L + 1024, threads=2) as url:
        row["stream_bench"] = stream_bench(url, scenario, L, seconds, seed)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--lengths", default="2048,8192,16384", help="stall: long-prompt tokens")
    ap.add_argument("--alone", default="4096,16384", help="TTFT of a long prompt alone")
    ap.add_argument("--servers", default="evenflow,llama-server")
    ap.add_argument("--clients", default="stream_bench,evenflow_bench",
                    help="evenflow's clients, in turn on one daemon; a #N suffix runs a client again (e.g. "
                         "stream_bench,stream_bench#2: a fresh daemon's first long prompt against a warm one's)")
    ap.add_argument("--max-seconds", type=float, default=3600)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=HERE / "default_stall.json")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="a non-default daemon setting for an A/B row (the row is labelled with it)")
    a = ap.parse_args()
    if not all(re.fullmatch(r"(stream_bench|evenflow_bench)(#\d+)?", c) for c in a.clients.split(",")):
        ap.error(f"--clients: stream_bench or evenflow_bench (with an optional #N), not {a.clients!r}")
    extra_env = dict(kv.split("=", 1) for kv in a.env)
    out = json.loads(a.out.read_text()) if a.out.exists() else {"rows": []}
    out["cpu"] = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    jobs = [("stall", int(x)) for x in a.lengths.split(",") if x] + [("prefill", int(x)) for x in a.alone.split(",") if x]
    for scenario, L in jobs:
        for server in a.servers.split(","):
            print(f"== {server} {scenario} L={L}", flush=True)
            load0, t0 = cpu_load(), time.time()
            if server == "evenflow":
                clients = a.clients.split(",") if scenario == "stall" else ["stream_bench"]
                row = run_evenflow(a.gguf, L, scenario, clients, a.max_seconds, a.seed, extra_env)
            else:
                row = run_llama_server(a.gguf, L, scenario, a.max_seconds, a.seed)
            load1 = cpu_load()
            row["load"] = {"loadavg_start": load0["loadavg"], "loadavg_end": load1["loadavg"],
                           "cpu_pressure_pct": 100 * (load1["cpu_some_us"] - load0["cpu_some_us"]) / 1e6
                           / max(time.time() - t0, 1e-9)}
            row["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            row["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=HERE).stdout.strip()
            out["rows"].append(row)
            a.out.write_text(json.dumps(out, separators=(",", ":")))  # compact: a row holds its step events


if __name__ == "__main__":
    main()
