"""The device check for an NVIDIA GPU (issue 32): one command, offline, about 10 minutes. Writes JSON + a table.

    python3 docs/bench/gpu_check.py --sdist llama_cpp_python-0.3.36.tar.gz            # on the GPU machine
    python3 docs/bench/gpu_check.py --sdist ... --cpu                                 # the same path on a CPU, tiny

What it does, each part recorded (a part that fails is reported with its error, the others still run):
1. build: llama.cpp from the llama-cpp-python sdist's own vendor/llama.cpp (the source the installed bindings
   match) with CMake: -DGGML_CUDA=on (not with --cpu), shared libraries and llama-server. evenflow then loads those
   libraries (LLAMA_CPP_LIB_PATH) and llama-server is that build's binary: the same kernels on both sides.
   With --no-build (the default with --cpu): the installed llama-cpp-python, and llama-server from the
   `xllamacpp` wheel (in-process).
2. invariance: tests/test_engine_backends.py (chunked == monolithic greedy tokens with concurrent decodes,
   preemption) on torch (CUDA when present) and on llama.cpp at full offload.
3. model: a random 8B-shaped (Llama 3) Q4_K_M GGUF (docs/bench/gguf_q4km.py), tokenizer from the sdist.
4. stall: 4 streams decoding while a 2k / 8k / 16k-token document arrives; evenflow (auto backend, 50 ms target)
   vs llama-server (5 slots, n_batch 2048), the same client (`evenflow bench stall`): P99 gap before / during,
   the document's TTFT.
5. decode: tok/s at 1 and 8 streams for both (`evenflow bench poisson`, all at once, ignore_eos).
6. torch: decode tok/s of one stream on a ~1B synthetic HF model (bf16, CUDA) and the HBM bandwidth that
   implies (weight bytes read per token x tokens/s), against the card's peak where known.
Nothing here goes to the network: carry the sdist (pip download --no-binary :all: --no-deps
llama-cpp-python==<installed version>) and the wheels evenflow needs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

# peak HBM/GDDR bandwidth, GB/s, of cards this check is meant for (vendor spec sheets)
PEAK_GBS = {"RTX 4090": 1008, "H100 80GB HBM3": 3350, "H100 PCIe": 2000, "H100 NVL": 3900, "H200": 4800,
            "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "L40S": 864, "RTX 6000 Ada": 960}
FULL = dict(lengths=[2048, 8192, 16384], shape=dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8),
            torch_spec=dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                            num_key_value_heads=8, vocab_size=32000, max_position_embeddings=8192),
            decode_tokens=256, torch_tokens=200)
TINY = dict(lengths=[256, 512, 1024], shape=dict(layers=2, hidden=256, ffn=512, heads=4, kv_heads=2),
            torch_spec=dict(), decode_tokens=32, torch_tokens=32)


def importable(work: Path) -> Path:
    """A folder whose `evenflow` is this checkout (a symlink), for the subprocesses: the check runs the code here."""
    pp = work / "pythonpath"
    pp.mkdir(parents=True, exist_ok=True)
    link = pp / "evenflow"
    if not link.exists():
        link.symlink_to(ROOT, target_is_directory=True)
    return pp


ONLY: set[str] = set()  # --only: the measuring parts to run (source, build and model always run; they are cached)


def part(results: dict, name: str, fn: Callable[[], Any]) -> Any:
    """Run one part, record its result or its error and its time; never raises."""
    if ONLY and name not in ONLY | {"source", "build", "model"}:
        return None
    t0 = time.time()
    print(f"== {name}", flush=True)
    try:
        out = fn()
        results[name] = {"ok": True, "seconds": round(time.time() - t0, 1), "result": out}
    except Exception as e:  # noqa: BLE001 - the other parts still run
        out = None
        results[name] = {"ok": False, "seconds": round(time.time() - t0, 1), "error": f"{type(e).__name__}: {e}"}
    print(f"   {'ok' if results[name]['ok'] else 'FAILED: ' + results[name]['error']} "
          f"({results[name]['seconds']} s)", flush=True)
    return out


def extract(sdist: Path, work: Path) -> Path:
    src = work / "src"
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        src.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tf:
            top = tf.getmembers()[0].name.split("/")[0]
            tf.extractall(work / "src-tmp", filter="data")
        shutil.rmtree(src)
        (work / "src-tmp" / top).rename(src)
        shutil.rmtree(work / "src-tmp")
    return src / "vendor" / "llama.cpp"


def build(llama_src: Path, work: Path, cuda: bool) -> dict:
    """Shared libraries + llama-server from one CMake tree; returns where they are."""
    out = work / ("build-cuda" if cuda else "build-cpu")
    args = ["cmake", "-S", str(llama_src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if cuda:
        args += ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=native"]
    log = work / "build.log"
    with open(log, "ab") as f:
        for cmd in (args, ["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2), "--target", "llama", "ggml",
                           "llama-server"]):
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode:
                tail = log.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{' '.join(cmd[:3])} failed (log {log}):\n{tail}")
    bin_dir = out / "bin"
    return {"lib_dir": str(bin_dir), "llama_server": str(bin_dir / "llama-server"), "cuda": cuda}


def run_tests(env: dict) -> dict:
    """tests/test_engine_backends.py on every backend present; pass/fail counts and the failures' names."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                        str(ROOT / "tests" / "test_engine_backends.py")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
    failed = [ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    if r.returncode not in (0, 1):
        raise RuntimeError(f"pytest exited {r.returncode}: {tail}")
    return {"summary": tail, "failed": failed, "passed": r.returncode == 0}


def bench(args: list[str], env: dict) -> dict:
    """`evenflow bench ...` with --json; its JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "bench", *args, "--json", f.name, "--quiet"],
                       cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
        return json.loads(Path(f.name).read_text())


def stall_row(url: str, protocol: str, model: str, length: int, env: dict) -> dict:
    d = bench(["stall", "--url", url, "--protocol", protocol, "--model", model, "--streams", "4", "-L", str(length),
               "--ignore-eos", "on", "--long-output-len", "8"], env)
    w = (d.get("stall") or {}).get("windows") or {}
    return {"L": length, "p99_before_ms": (w.get("before_ms") or {}).get("p99"),
            "p99_during_ms": (w.get("during_ms") or {}).get("p99"), "max_during_ms": (w.get("during_ms") or {}).get("max"),
            "long_ttft_ms": (d.get("stall") or {}).get("long_ttft_ms"), "warnings": d.get("warnings")}


def decode_rate(url: str, protocol: str, model: str, streams: int, tokens: int, env: dict) -> float:
    d = bench(["poisson", "--url", url, "--protocol", protocol, "--model", model, "--rate", "inf",
               "--num-requests", str(streams), "--max-concurrency", str(streams), "--prompt-len", "32",
               "--output-len", str(tokens), "--ignore-eos", "on"], env)
    return float(d["summary"]["output_throughput"])


def server_rows(url: str, protocol: str, model: str, cfg: dict, env: dict) -> dict:
    rows = [stall_row(url, protocol, model, L, env) for L in cfg["lengths"]]
    return {"stall": rows, "decode_tok_s_1": decode_rate(url, protocol, model, 1, cfg["decode_tokens"], env),
            "decode_tok_s_8": decode_rate(url, protocol, model, 8, cfg["decode_tokens"], env)}


def evenflow_server(gguf: Path, work: Path, ctx: int, env: dict) -> dict:
    from default_stall import import_model
    from perf_suite import serve_daemon

    store = work / "store"
    daemon_env = {**env, "OLLAMA_MODELS": str(store), "EVENFLOW_TARGET_ITL_MS": "50", "OLLAMA_CONTEXT_LENGTH": str(ctx),
                  "OLLAMA_KEEP_ALIVE": "-1", "EVENFLOW_MAX_SEQS": "5"}  # llama-server's 5 slots
    with serve_daemon(daemon_env, str(work / "gpu_check_daemon.log")) as url:  # an absolute name: the log goes there
        import_model(url, gguf)
        import httpx

        ps = httpx.post(url + "/api/generate", json={"model": "bench/q8", "prompt": "hi", "stream": False,
                                                     "options": {"num_predict": 1}}, timeout=600, trust_env=False)
        ps.raise_for_status()
        loaded = httpx.get(url + "/api/ps", trust_env=False).json()["models"][0]
        out = server_rows(url, "ollama-generate", "bench/q8", CFG, env)
        out["ps"] = {k: loaded.get(k) for k in ("size", "size_vram", "context_length")}
        return out


def llama_server_rows(gguf: Path, built: dict | None, ctx: int, env: dict, work: Path) -> dict:
    if built is None:  # the xllamacpp wheel, in this process
        from llama_server import llama_server

        with llama_server(gguf, n_batch=2048, n_ubatch=512, slots=5, ctx_per_slot=ctx) as url:
            return {"server": "xllamacpp", **server_rows(url, "openai-completions", "bench", CFG, env)}
    from perf_suite import free_port
    import httpx

    port = free_port()
    cmd = [built["llama_server"], "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", "5",
           "-c", str(ctx * 5), "-b", "2048", "-ub", "512", "-ngl", "999",
           "--no-repack"]  # as evenflow's default (and llama_server.py): AMX repacking faults (SIGILL) on some VMs
    with open(work / "gpu_check_llama_server.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**env, "LD_LIBRARY_PATH": built["lib_dir"]})
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(1200):
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode}; see {work}/gpu_check_llama_server.log")
                try:
                    if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
            return {"server": "llama-server (same build)",
                    **server_rows(url, "openai-completions", Path(gguf).name, CFG, env)}
        finally:
            proc.terminate()
            proc.wait(30)


def torch_decode(cfg: dict, cpu: bool) -> dict:
    import torch

    from engine_stall import run_policy
    from evenflow.backends.base import RunnerSettings, load_runner
    from evenflow.backends.synthetic import cached_model, make_spec
    from evenflow.daemon.engine import EngineConfig

    spec = make_spec("bench" if not cpu else "tiny", **cfg["torch_spec"])
    path = cached_model(spec, ("hf",), "f32")["hf"]
    device = "cpu" if cpu or not torch.cuda.is_available() else "cuda"
    runner = load_runner("torch", str(path), RunnerSettings(max_num_seqs=2, context_length=1024, device=device))
    try:
        params = sum(p.numel() * p.element_size() for p in runner.model.parameters())
        r = run_policy(runner, EngineConfig(target_itl_ms=50.0), n_streams=1, prompt_len=64, warm_tokens=8,
                       before_tokens=cfg["torch_tokens"], after_tokens=2, vocab=runner.info.vocab_size)
        tok_s = r["decode_tok_s"]
        name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
        peak = next((v for k, v in PEAK_GBS.items() if k in name), None)
        gbs = params * tok_s / 1e9
        return {"device": name, "dtype": str(runner.dtype), "weight_bytes": params, "decode_tok_s": tok_s,
                "bandwidth_gbs": gbs, "peak_gbs": peak, "bandwidth_use": gbs / peak if peak else None}
    finally:
        runner.close()


def table(results: dict) -> str:
    lines = ["| part | ok | s | figures |", "|---|---|---|---|"]
    for name, r in results.items():
        if not isinstance(r, dict) or "ok" not in r:
            continue
        fig = ""
        res = r.get("result")
        if name in ("evenflow", "llama_server") and res:
            fig = "; ".join(f"L={x['L']}: P99 {x['p99_before_ms'] or float('nan'):.0f}/"
                            f"{x['p99_during_ms'] or float('nan'):.0f} ms, TTFT {x['long_ttft_ms'] or float('nan'):.0f} ms"
                            for x in res["stall"])
            fig += f"; decode {res['decode_tok_s_1']:.1f} tok/s x1, {res['decode_tok_s_8']:.1f} tok/s x8"
            if "ps" in res:
                fig += f"; /api/ps size_vram {res['ps']['size_vram']}"
        elif name == "torch" and res:
            fig = (f"{res['device']}: {res['decode_tok_s']:.1f} tok/s, {res['bandwidth_gbs']:.1f} GB/s"
                   + (f" ({100 * res['bandwidth_use']:.0f}% of {res['peak_gbs']})" if res["bandwidth_use"] else ""))
        elif name.startswith("invariance") and res:
            fig = res["summary"]
        elif not r["ok"]:
            fig = r["error"][:200]
        lines.append(f"| {name} | {'yes' if r['ok'] else 'NO'} | {r['seconds']} | {fig} |")
    return "\n".join(lines) + "\n"


CFG: dict = FULL


def main(argv: list[str] | None = None) -> int:
    global CFG, ONLY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", required=True, type=Path, help="llama_cpp_python-<version>.tar.gz (the installed version)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "evenflow-gpu-check")
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU: proves the whole path runs")
    ap.add_argument("--build", action=argparse.BooleanOptionalAction, default=None,
                    help="build llama.cpp + llama-server from the sdist (default: yes, except with --cpu)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default docs/bench/gpu_check[_cpu].json)")
    ap.add_argument("--only", default="", help="comma list of parts to (re)run: invariance, evenflow, llama_server, "
                    "torch (the build and the model are reused from --work)")
    a = ap.parse_args(argv)
    ONLY = {p.strip() for p in a.only.split(",") if p.strip()}
    CFG = TINY if a.cpu else FULL
    out = a.out or HERE / ("gpu_check_cpu.json" if a.cpu else "gpu_check.json")
    a.work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(importable(a.work)))  # torch_decode runs here, the servers in subprocesses
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(importable(a.work)),
                                                                     os.environ.get("PYTHONPATH")]))}
    results: dict[str, Any] = {"mode": "cpu" if a.cpu else "gpu", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "host": platform.node(), "machine": platform.machine()}
    llama_src = part(results, "source", lambda: str(extract(a.sdist, a.work)))
    built = None
    if (a.build if a.build is not None else not a.cpu) and llama_src:
        built = part(results, "build", lambda: build(Path(llama_src), a.work, cuda=not a.cpu))
        if built:
            env["LLAMA_CPP_LIB_PATH"] = built["lib_dir"]
    results["check"] = subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "serve", "--check"], env=env,
                                      capture_output=True, text=True, cwd=ROOT).stdout.splitlines()
    part(results, "invariance", lambda: run_tests(env))
    gguf = a.work / ("tiny-q4km.gguf" if a.cpu else "llama8b-q4km.gguf")

    def model() -> dict:
        if gguf.exists():
            return {"path": str(gguf), "cached": True}
        from gguf_q4km import write

        vocab = Path(llama_src) / "models" / "ggml-vocab-llama-bpe.gguf"
        return write(gguf, vocab, ctx=131072, **CFG["shape"])

    ctx = max(CFG["lengths"]) + 2048
    if part(results, "model", model):
        part(results, "evenflow", lambda: evenflow_server(gguf, a.work, ctx, env))
        part(results, "llama_server", lambda: llama_server_rows(gguf, built, ctx, env, a.work))
    part(results, "torch", lambda: torch_decode(CFG, a.cpu))
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    md = out.with_suffix(".md")
    md.write_text(f"# GPU check ({results['mode']}, {results['started']}, {results['host']})\n\n" + table(results))
    print(md.read_text())
    return 0 if all(r.get("ok") for r in results.values() if isinstance(r, dict) and "ok" in r) else 1


if __name__ == "__main__":
    sys.exit(main())
