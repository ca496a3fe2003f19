"""The monitor's own lag while ~3.6k-token documents are ingested and 7 chats decode (8 sequences).

Starts `evenflow serve` (default settings, a fresh store: the synthetic `demo` model) on a free loopback port,
drives it over HTTP from another process (7 streaming chats, then 10 demo documents one after another while they
decode; the chats hang up once the last is in), and runs the monitor headless
(`App.run_test`) with a 20 ms timer probe: lag = how late each tick fired (the UI loop was busy that long), measured over
the window in which 10 documents go in, one after another.
Prints a table and writes docs/bench/tui_lag.json.  Usage: python docs/bench/tui_lag.py [--log-content] [--screenshot docs/tui_monitor.svg]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import multiprocessing
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from evenflow.tui.app import PROBE_S, EvenflowApp
from evenflow.tui.demo import document, start_daemon, stop_daemon
from evenflow.tui.state import percentile

CHATS = 7  # + the document = 8 sequences: what a default daemon runs at once on the demo model (a 9th queues)
LATE_S = 0.02  # a tick this late counts as "late" in the busy/starved split
slow: list[str] = []


def _load(url: str, chats: int, docs: int, decoding: "multiprocessing.synchronize.Event", done: "multiprocessing.synchronize.Event") -> None:
    """`chats` streaming chats; once all decode, `docs` long documents one after another (each its own first line, so
    no prefix-cache hit); when the last is in, the chats hang up. In its own process."""
    import threading

    first = threading.Barrier(chats + 1)
    stop = threading.Event()

    def chat(i: int) -> None:
        body = {"model": "demo", "prompt": f"story {i}", "options": {"num_predict": 4000, "ignore_eos": True, "seed": i}}
        with httpx.stream("POST", url + "/api/generate", json=body, timeout=600) as r:
            lines = r.iter_lines()
            next(lines)
            first.wait()
            for _ in lines:
                if stop.is_set():
                    break  # hanging up: the daemon frees the sequence

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(chats)]
    for t in threads:
        t.start()
    first.wait()
    decoding.set()
    for k in range(docs):
        httpx.post(url + "/api/generate", timeout=600, json={
            "model": "demo", "prompt": f"Document {k + 1} of {docs}.\n" + document(), "stream": False,
            "options": {"num_predict": 8}}).raise_for_status()
    done.set()
    stop.set()
    for t in threads:
        t.join()


callback_cpu: list[float] = []  # the UI thread's CPU seconds per event-loop callback


def _time_callbacks() -> None:
    """Time every callback the loop runs in CPU seconds: how long our code held the loop, whatever the machine's
    load (a starved process does not accrue CPU time, so this is the lag the app would cause on an idle core)."""
    run = asyncio.events.Handle._run

    def timed(handle: asyncio.events.Handle) -> None:
        c = time.thread_time()
        run(handle)
        callback_cpu.append(time.thread_time() - c)

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]


class _SlowCallbacks(logging.Handler):
    """asyncio's debug mode logs every callback that held the loop over slow_callback_duration: keep their names."""

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Executing"):
            slow.append(re.sub(r" at 0x[0-9a-f]+|\(\)|<Handle |<TimerHandle |\d+\.\d+ seconds|took|[<>]|when=\S+",
                               "", msg).strip()[:140])


def _ingesting(app: EvenflowApp) -> bool:
    """The document is half in and other streams decode: the moment the README's screenshot shows."""
    streams = list(app.state.streams.values())
    return (any(s.state == "ingesting" and s.prompt_tokens > 1000 and s.progress >= 0.5 for s in streams)
            and sum(s.state == "decoding" for s in streams) >= 3)


async def measure(url: str, chats: int, docs: int, slow_callbacks: bool, screenshot: str | None = None) -> dict:
    if slow_callbacks:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = LATE_S
        logging.getLogger("asyncio").addHandler(_SlowCallbacks())
    app = EvenflowApp(url, probe_lag=True)
    async with app.run_test(size=(120, 40)) as pilot:
        while not app.connected:
            await pilot.pause(0.05)
        decoding, done = multiprocessing.Event(), multiprocessing.Event()
        proc = multiprocessing.Process(target=_load, args=(url, chats, docs, decoding, done))
        proc.start()
        while not decoding.is_set():  # the window measured: the document going in while all chats decode
            await pilot.pause(0.02)
        t0 = time.perf_counter()
        app.lags.clear()
        app.lag_cpu.clear()
        app.render_s.clear()
        slow.clear()
        callback_cpu.clear()
        cpu0 = time.process_time()
        decoding_now: list[int] = []  # streams the monitor shows decoding, every 0.1 s of the window
        while not done.is_set():
            await pilot.pause(0.1)
            if not done.is_set():
                decoding_now.append(sum(s.state == "decoding" for s in app.state.streams.values()))
            if screenshot and _ingesting(app):
                path = Path(screenshot).resolve()
                app.save_screenshot(path.name, str(path.parent))
                screenshot = None
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        proc.join()
        lags, renders = [x * 1e3 for x in app.lags], [x * 1e3 for x in app.render_s]
        # A late tick either had the UI thread busy (it used the CPU for most of the interval: our code blocked the
        # loop) or had it waiting for a core (the OS ran the daemon or someone else: the machine's load).
        late = [(lag, c) for lag, c in zip(app.lags, app.lag_cpu) if lag > LATE_S]
        busy = sum(c >= 0.5 * (lag + PROBE_S) for lag, c in late)
        return {"wall_s": wall, "events": app.state.events, "dropped": app.state.dropped_total,
                "lag_ms": {q: percentile(lags, q) for q in (50, 99, 100)}, "lag_samples": len(lags),
                "late_samples": len(late), "late_busy": busy, "late_starved": len(late) - busy,
                "ui_cpu_share": cpu / wall,
                "decoding_streams_min": min(decoding_now[decoding_now.index(chats):] if chats in decoding_now else [0]),
                "render_ms": {q: percentile(renders, q) for q in (50, 99, 100)}, "renders": len(renders),
                "callback_cpu_ms": {q: percentile([x * 1e3 for x in callback_cpu], q) for q in (50, 99, 99.9, 100)},
                "callbacks": len(callback_cpu), "callbacks_over_20ms_cpu": sum(x > LATE_S for x in callback_cpu),
                "slow_callbacks": collections.Counter(slow).most_common(8)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-content", action="store_true", help="run the daemon with --log-content (text on screen)")
    ap.add_argument("--slow-callbacks", action="store_true",
                    help="asyncio debug mode: name the callbacks that held the UI loop over 20 ms (slows it a little)")
    ap.add_argument("--chats", type=int, default=CHATS, help=f"chats decoding while the document goes in (default {CHATS})")
    ap.add_argument("--documents", type=int, default=10, help="documents sent one after another (default 10)")
    ap.add_argument("--max-seqs", type=int, default=0,
                    help="run the daemon with EVENFLOW_MAX_SEQS (default: its own default, 8 on the demo model)")
    ap.add_argument("--screenshot", default=None, metavar="SVG",
                    help="save the monitor as SVG once the document is half in (README: docs/tui_monitor.svg)")
    ap.add_argument("--out", default=None, help="JSON file to write (default docs/bench/tui_lag.json)")
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
    if args.max_seqs:
        os.environ["EVENFLOW_MAX_SEQS"] = str(args.max_seqs)
    proc, log = start_daemon(url, log_content=args.log_content)
    try:
        httpx.post(url + "/api/generate", json={"model": "demo", "prompt": "", "stream": False}, timeout=300)
        _time_callbacks()
        r = asyncio.run(measure(url, args.chats, args.documents, args.slow_callbacks, args.screenshot))
    finally:
        stop_daemon(proc)
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    r.update(screenshot_taken_in_window=bool(args.screenshot))  # saving the SVG blocks the loop once: not a lag figure
    r.update(cpu=cpu or platform.processor(), chats=args.chats, documents=args.documents, max_seqs=args.max_seqs or "default", log_content=args.log_content,
             document_tokens="~3.6k (demo model)")
    print(f"| metric | P50 | P99 | max |\n|---|---|---|---|")
    for k in ("lag_ms", "render_ms"):
        print(f"| {k} | {r[k][50]:.1f} | {r[k][99]:.1f} | {r[k][100]:.1f} |")
    print(f"{r['lag_samples']} lag samples, {r['renders']} renders, {r['events']} events ({r['dropped']} dropped) "
          f"in {r['wall_s']:.1f} s (the documents going in; the monitor showed >= {r['decoding_streams_min']} streams decoding "
          f"throughout); {r['cpu']}")
    print(f"ticks over {LATE_S * 1e3:.0f} ms late: {r['late_samples']} ({r['late_busy']} with the UI thread busy, "
          f"{r['late_starved']} waiting for a CPU); the UI process used {r['ui_cpu_share']:.0%} of one core")
    cb = r["callback_cpu_ms"]
    print(f"UI thread CPU per loop callback: P50 {cb[50]:.2f} ms, P99 {cb[99]:.2f} ms, P99.9 {cb[99.9]:.1f} ms, "
          f"max {cb[100]:.1f} ms over {r['callbacks']} callbacks ({r['callbacks_over_20ms_cpu']} over 20 ms)")
    for name, n in r["slow_callbacks"]:
        print(f"  {n:4d} x {name}")
    out = Path(args.out) if args.out else Path(__file__).with_name("tui_lag.json")
    out.write_text(json.dumps(r, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
