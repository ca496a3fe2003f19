"""A document's KV after an unload and after a restart (issue 31), as a user gets it: a DEFAULT daemon over HTTP.

    python docs/bench/kv_disk.py --gguf /tmp/bench-q8.gguf                   # 8k and 16k documents, ~10 min
    python docs/bench/kv_disk.py --gguf /tmp/bench-q8.gguf --doc-tokens 2000  # a quick look

Per document size, one daemon (defaults, plus EVENFLOW_BACKEND=llamacpp EVENFLOW_NUM_THREADS=2, what `auto` picks
on this machine anyway, and OLLAMA_CONTEXT_LENGTH = the document + 2048; the disk cache in a temp folder):
  1. cold: the document + question 1 (nothing cached)
  2. in memory: the document + question 2 (the model stays loaded)
  3. restart: SIGTERM (timed: the daemon writes the document's KV before it exits), then a start on the same store
     and cache folder
  4. after restart: the document + question 3, answered at length (300 tokens: a new long conversation to save)
  5. unload: `{"model", "keep_alive": 0}` as Ollama's clients unload; timed until /api/ps lists nothing, and until
     the saved prefix (the document, question 3 and its answer) is on disk
  6. after unload: the document + question 4 (the model loads again; the prefix comes from disk); then question 1
     again, whose reply must equal the cold one
TTFT is measured at the client (streamed /api/generate); a reply after a load also reports Ollama's
`load_duration`, given separately. The disk read rate is the restore event's bytes / read time (/api/events).
Results: docs/bench/kv_disk.json (appended) and a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
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
from next_question import document  # noqa: E402
from perf_suite import free_port  # noqa: E402


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


class Daemon:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "evenflow.clients.cli", "serve", "--no-demo"],
                                     env={**os.environ, **env, "OLLAMA_HOST": f"127.0.0.1:{self.port}"},
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(1200):
            try:
                if httpx.get(self.url + "/", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"evenflow exited with {self.proc.returncode}; see {log}")
            time.sleep(0.1)
        self.events: list[dict] = []
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        try:
            with httpx.stream("GET", self.url + "/api/events", timeout=None, trust_env=False) as r:
                for line in r.iter_lines():
                    if line.strip():
                        ev = json.loads(line)
                        if ev.get("type") == "kv_disk":
                            self.events.append(ev)
        except httpx.HTTPError:
            pass

    def stop(self) -> float:
        """SIGTERM, as a service manager stops it; seconds until the process exited."""
        t0 = time.perf_counter()
        self.proc.terminate()
        self.proc.wait(300)
        self.log.close()
        return time.perf_counter() - t0


def ask(url: str, prompt: str, num_predict: int = 8) -> dict:
    """One streamed /api/generate on a fresh connection: TTFT, the reply, Ollama's final counters."""
    body = {"model": MODEL, "prompt": prompt, "stream": True,
            "options": {"temperature": 0, "num_predict": num_predict}}
    t0 = time.perf_counter()
    ttft, out, last = None, [], {}
    with httpx.stream("POST", url + "/api/generate", json=body, timeout=3600, trust_env=False) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.strip():
                continue
            part = json.loads(line)
            if part.get("response"):
                ttft = ttft or time.perf_counter() - t0
                out.append(part["response"])
            if part.get("done"):
                last = part
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - t0, "reply": "".join(out),
            "load_s": last.get("load_duration", 0) / 1e9, "prompt_tokens": last.get("prompt_eval_count")}


def unload(d: Daemon) -> dict:
    t0 = time.perf_counter()
    before = httpx.get(d.url + "/api/ps", trust_env=False).json().get("kv_cache", {}).get("written_bytes", 0)
    httpx.post(d.url + "/api/generate", json={"model": MODEL, "keep_alive": 0}, timeout=600,
               trust_env=False).raise_for_status()
    while httpx.get(d.url + "/api/ps", trust_env=False).json()["models"]:
        time.sleep(0.01)
    gone = time.perf_counter() - t0
    saving = next((e for e in reversed(d.events) if e.get("event") == "saving"), {})
    while saving and httpx.get(d.url + "/api/ps", trust_env=False).json()["kv_cache"]["written_bytes"] - before < \
            saving.get("bytes", 0):
        time.sleep(0.01)
    return {"unload_s": gone, "on_disk_s": time.perf_counter() - t0, "saved_bytes": saving.get("bytes", 0)}


def run(gguf: Path, doc_tokens: int, work: Path) -> dict:
    env = {"EVENFLOW_BACKEND": "llamacpp", "EVENFLOW_NUM_THREADS": "2",
           "OLLAMA_CONTEXT_LENGTH": str(doc_tokens + 2048), "OLLAMA_MODELS": str(work / "models"),
           "EVENFLOW_KV_CACHE_DIR": str(work / "kv")}
    doc = document(0, doc_tokens)
    q = [f"{doc}\nQuestion {i}: what does the report say about region {i}?" for i in range(5)]
    log = HERE / "kv_disk_daemon.log"
    d = Daemon(env, log)
    import_model(d.url, gguf)
    res: dict = {"doc_tokens_asked": doc_tokens}
    res["cold"] = ask(d.url, q[1])
    res["in_memory"] = ask(d.url, q[2])
    res["shutdown_s"] = d.stop()
    t0 = time.perf_counter()
    d = Daemon(env, log)
    res["startup_s"] = time.perf_counter() - t0
    res["after_restart"] = ask(d.url, q[3], num_predict=300)
    restored = [e for e in d.events if e.get("event") == "restored"]
    res["restore_event_restart"] = restored[-1] if restored else None
    res["saved_at_shutdown_bytes"] = httpx.get(d.url + "/api/ps", trust_env=False).json()["kv_cache"]["size"]
    res["unload"] = unload(d)
    res["after_unload"] = ask(d.url, q[4])
    restored = [e for e in d.events if e.get("event") == "restored"]
    res["restore_event_unload"] = restored[-1] if restored else None
    res["cold_again"] = ask(d.url, q[1])
    res["same_reply_as_cold"] = res["cold_again"]["reply"] == res["cold"]["reply"]
    res["cache_usage"] = httpx.get(d.url + "/api/ps", trust_env=False).json().get("kv_cache")
    d.stop()
    return res


def table(results: list[dict]) -> str:
    rows = ["| document | cold TTFT | in-memory hit | after unload: TTFT (of which load) | after restart: TTFT (of which "
            "load) | vs in-memory / vs cold | restored | disk read | unload (until on disk) | shutdown with the write "
            "| reply = cold |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c, m, u, s = (r[k]["ttft_s"] for k in ("cold", "in_memory", "after_unload", "after_restart"))
        ev = r.get("restore_event_restart") or r.get("restore_event_unload") or {}
        rate = ev.get("bytes", 0) / (ev.get("read_ms", 0) / 1e3) / 2**20 if ev.get("read_ms") else 0
        rows.append(
            f"| {r['cold']['prompt_tokens']} tok | {c:.2f} s | {m:.3f} s | {u:.3f} s ({r['after_unload']['load_s']:.2f}) "
            f"| {s:.3f} s ({r['after_restart']['load_s']:.2f}) | {max(u, s) / m:.1f}x / {max(u, s) / c:.4f}x "
            f"| {ev.get('tokens', 0)} tok, {ev.get('bytes', 0) / 2**20:.0f} MiB | {rate:.0f} MiB/s "
            f"({ev.get('read_ms', 0):.0f} ms read, {ev.get('ms', 0):.0f} ms into llama.cpp) "
            f"| {r['unload']['unload_s']:.2f} s ({r['unload']['on_disk_s']:.2f} s, "
            f"{r['unload']['saved_bytes'] / 2**20:.0f} MiB) | {r['shutdown_s']:.2f} s "
            f"({r['saved_at_shutdown_bytes'] / 2**20:.0f} MiB) "
            f"| {r['same_reply_as_cold']} |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--doc-tokens", type=int, nargs="+", default=[8000, 16000])
    p.add_argument("--out", type=Path, default=HERE / "kv_disk.json")
    a = p.parse_args()
    results = []
    for n in a.doc_tokens:
        with tempfile.TemporaryDirectory(prefix="kv-disk-bench-") as work:
            results.append(run(a.gguf, n, Path(work)))
            print(table(results[-1:]), flush=True)
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu_model(), "loadavg": os.getloadavg(),
              "gguf": a.gguf.name, "results": results}
    old = json.loads(a.out.read_text()) if a.out.exists() else []
    a.out.write_text(json.dumps(old + [record], indent=1))
    print(f"\n{record['cpu']}, load average {record['loadavg']}\n" + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
