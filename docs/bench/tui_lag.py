"""The monitor's own lag while a ~3.6k-token document is ingested and 8 streams run.

Starts `evenflow serve` (default settings, a fresh store: the synthetic `demo` model) on a free loopback port,
drives it over HTTP from another process (8 chats + the demo document), and runs the monitor headless
(`App.run_test`) with a 20 ms timer probe: lag = how late each tick fired (the UI loop was busy that long).
Prints a table and writes docs/bench/tui_lag.json.  Usage: python docs/bench/tui_lag.py [--log-content]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from evenflow.tui.app import EvenflowApp
from evenflow.tui.demo import document, start_daemon, stop_daemon
from evenflow.tui.state import percentile

STREAMS = 8


def _load(url: str, done: "multiprocessing.synchronize.Event") -> None:
    """8 streams (256 tokens each) and, once they decode, the long document; in its own process."""
    import threading

    def chat(i: int) -> None:
        httpx.post(url + "/api/generate", timeout=600, json={
            "model": "demo", "prompt": f"story {i}", "stream": False, "options": {"num_predict": 256, "seed": i}})

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    httpx.post(url + "/api/generate", timeout=600, json={"model": "demo", "prompt": document(), "stream": False,
                                                         "options": {"num_predict": 8}})
    for t in threads:
        t.join()
    done.set()


async def measure(url: str) -> dict:
    app = EvenflowApp(url, probe_lag=True)
    async with app.run_test(size=(120, 40)) as pilot:
        while not app.connected:
            await pilot.pause(0.05)
        done = multiprocessing.Event()
        proc = multiprocessing.Process(target=_load, args=(url, done))
        t0 = time.perf_counter()
        proc.start()
        app.lags.clear()
        app.render_s.clear()
        while not done.is_set():
            await pilot.pause(0.1)
        wall = time.perf_counter() - t0
        proc.join()
        lags, renders = [x * 1e3 for x in app.lags], [x * 1e3 for x in app.render_s]
        return {"wall_s": wall, "events": app.state.events, "dropped": app.state.dropped_total,
                "lag_ms": {q: percentile(lags, q) for q in (50, 99, 100)}, "lag_samples": len(lags),
                "render_ms": {q: percentile(renders, q) for q in (50, 99, 100)}, "renders": len(renders)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-content", action="store_true", help="run the daemon with --log-content (text on screen)")
    args = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"http://127.0.0.1:{port}"
    store = tempfile.mkdtemp(prefix="evenflow-tui-bench-")
    os.environ["EVENFLOW_MODELS"] = store
    if not args.log_content:
        os.environ.pop("EVENFLOW_LOG_CONTENT", None)
    proc, log = start_daemon(url, log_content=args.log_content)
    try:
        httpx.post(url + "/api/generate", json={"model": "demo", "prompt": "", "stream": False}, timeout=300)
        r = asyncio.run(measure(url))
    finally:
        stop_daemon(proc)
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    r.update(cpu=cpu or platform.processor(), streams=STREAMS, log_content=args.log_content,
             document_tokens="~3.6k (demo model)")
    print(f"| metric | P50 | P99 | max |\n|---|---|---|---|")
    for k in ("lag_ms", "render_ms"):
        print(f"| {k} | {r[k][50]:.1f} | {r[k][99]:.1f} | {r[k][100]:.1f} |")
    print(f"{r['lag_samples']} lag samples, {r['renders']} renders, {r['events']} events ({r['dropped']} dropped) "
          f"in {r['wall_s']:.1f} s; {r['cpu']}; machine shared and noisy")
    out = Path(__file__).with_name("tui_lag.json")
    out.write_text(json.dumps(r, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
