"""Where the daemon's memory goes with 5 MB requests, and what stays once every model is unloaded (issue 40).

    python docs/bench/rss_after_unload.py [--gguf PATH] [--clients 4] [--env KEY=VALUE ...]

A DEFAULT `evenflow serve` (a temp store, a free loopback port) in a child process; the GGUF (SmolLM2-135M Instruct
Q4_1 by default) imported with /api/blobs + /api/create. The daemon's RSS and peak RSS (VmHWM, /proc) are read
after each phase: loaded; 5 MB of text on /api/generate (refused) and on /api/embed, /api/embeddings and
/v1/embeddings (truncated to the window, one after the other, then `--clients` at once); unloaded (1 s later); and
after the daemon's periodic malloc_trim (35 s later). The last reading is split into anonymous memory and mapped
files (the libraries). Writes rss_after_unload.json and .md next to this script.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from events_overhead import DEFAULT_GGUF, MODEL, cpu_model, daemon_pid, import_model  # noqa: E402
from perf_suite import serve_daemon  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog. " * 120_000)[:5_000_000]
EMBEDS = [("/api/embed", {"model": MODEL, "input": TEXT}), ("/api/embeddings", {"model": MODEL, "prompt": TEXT}),
          ("/v1/embeddings", {"model": MODEL, "input": TEXT})]


def memory(pid: int) -> dict[str, int]:
    """RSS and peak RSS in MiB; anonymous and file-backed RSS in MiB."""
    st = Path(f"/proc/{pid}/status").read_text()
    kb = {k: int(st.split(k + ":")[1].split()[0]) for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}
    return {"rss_mib": kb["VmRSS"] // 1024, "peak_mib": kb["VmHWM"] // 1024, "anon_mib": kb["RssAnon"] // 1024,
            "file_mib": kb["RssFile"] // 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="a daemon setting off its default")
    args = ap.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as store:
        with serve_daemon({"OLLAMA_MODELS": store, **env}, "rss_after_unload_daemon.log") as url:
            pid = daemon_pid(url)

            def mark(phase: str, seconds: float = 0.0, **extra) -> None:
                rows.append({"phase": phase, "seconds": round(seconds, 1), **memory(pid), **extra})
                print(json.dumps(rows[-1]), flush=True)

            mark("started")
            import_model(url, args.gguf)
            with httpx.Client(base_url=url, timeout=3600, trust_env=False) as c:
                c.post("/api/generate", json={"model": MODEL, "prompt": "hi", "options": {"num_predict": 1}})
                mark("loaded")
                t = time.perf_counter()
                r = c.post("/api/generate", json={"model": MODEL, "prompt": TEXT, "stream": False})
                mark("5 MB on /api/generate", time.perf_counter() - t, status=r.status_code)
                for path, body in EMBEDS:
                    t = time.perf_counter()
                    r = c.post(path, json=body)
                    mark(f"5 MB on {path}", time.perf_counter() - t, status=r.status_code)
                t = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                    codes = list(pool.map(lambda i: httpx.post(url + EMBEDS[i % 3][0], json=EMBEDS[i % 3][1],
                                                               timeout=3600, trust_env=False).status_code,
                                          range(args.clients)))
                mark(f"{args.clients} at once", time.perf_counter() - t, status=sorted(set(codes)))
                c.post("/api/generate", json={"model": MODEL, "keep_alive": 0})
                while c.get("/api/ps").json()["models"]:
                    time.sleep(0.1)
                time.sleep(1)
                mark("unloaded, 1 s later")
                time.sleep(35)
                mark("unloaded, after a periodic malloc_trim (35 s)")
    out = {"model": args.gguf.name, "daemon_env": env, "cpu": cpu_model(), "rows": rows,
           "note": "machine shared with other work unless stated otherwise"}
    (HERE / "rss_after_unload.json").write_text(json.dumps(out, indent=2) + "\n")
    md = ["| phase | seconds | RSS MiB | peak MiB | anon MiB | files MiB | status |", "|---|---|---|---|---|---|---|"]
    md += [f"| {r['phase']} | {r['seconds']} | {r['rss_mib']} | {r['peak_mib']} | {r['anon_mib']} | {r['file_mib']} | "
           f"{r.get('status', '')} |" for r in rows]
    md += ["", f"{args.gguf.name}, llama.cpp, daemon settings {env or 'default'}, {out['cpu']}."]
    (HERE / "rss_after_unload.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
