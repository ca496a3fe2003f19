"""Images in (issue 30): what an image question costs, alone and beside running streams, at DEFAULT settings.

    PYTHONPATH=... python docs/bench/vision_bench.py                    # synthetic demo model + 256-row projector
    python docs/bench/vision_bench.py --streams 4 --images 3

A default daemon (`evenflow serve`, EVENFLOW_BACKEND=llamacpp, nothing else set) in a temp store; the synthetic
`demo` text model (qwen3, hidden 256, Q8_0) with a synthetic LLaVA-style `mlp` projector (224 px, 14 px patches:
256 image rows, a 6-block ViT of width 256), random weights, created from both GGUFs.
1. alone: an /api/chat question with a fresh image (TTFT, each of --images different images: encode + prefill),
   then the same image again (its rows from the encoder's cache, its KV from the prefix cache).
2. beside streams: --streams /api/generate streams decode; once each has tokens, a baseline window of --window s,
   then an image question is sent; the streams' inter-token gaps are reported for the baseline window and for the
   time the image question is admitted (sent -> its first token), P50/P99/max, with the question's TTFT.
Results: a markdown table on stdout; docs/bench/vision_bench.json (appended).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from perf_suite import StepRecorder, serve_daemon  # noqa: E402

MODEL = "vis-bench"


def png(seed: int, side: int = 224) -> bytes:
    from evenflow.backends.synthetic.projector import random_png

    return random_png(side, side, seed)


def model_files() -> list[Path]:
    from evenflow.backends.synthetic import cached_model, make_spec
    from evenflow.backends.synthetic.projector import cached_projector

    text = cached_model(make_spec("demo"), formats=("gguf",), gguf_dtype="q8_0")["gguf"]
    proj = cached_projector(256, image_size=224, patch_size=14, hidden_size=256, intermediate_size=512, layers=6,
                            heads=4, projection_hidden=512)
    return [text, proj]


def create(url: str) -> None:
    files = {}
    with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
        for p in model_files():
            data = p.read_bytes()
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            c.post(f"/api/blobs/{digest}", content=data).raise_for_status()
            files[p.name] = digest
        c.post("/api/create", json={"model": MODEL, "files": files, "stream": False}).raise_for_status()


def ask_image(url: str, image: bytes | None, n: int = 4, text: str = "What is in this picture?") -> dict:
    """A streamed /api/chat question (with the image, if any): TTFT, total, prompt_eval_count."""
    msg = {"role": "user", "content": text}
    if image is not None:
        msg["images"] = [base64.b64encode(image).decode()]
    body = {"model": MODEL, "stream": True, "options": {"num_predict": n, "temperature": 0}, "messages": [msg]}
    t0, first, last = time.perf_counter(), None, {}
    with httpx.Client(timeout=600, trust_env=False) as c, c.stream("POST", url + "/api/chat", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line:
                continue
            last = json.loads(line)
            if first is None:
                first = time.perf_counter()
    return {"ttft_ms": (first - t0) * 1e3, "total_ms": (time.perf_counter() - t0) * 1e3,
            "prompt_eval_count": last.get("prompt_eval_count"), "error": last.get("error")}


class Stream(threading.Thread):
    """A streamed /api/generate decoding until `stop`; token arrival times kept."""

    def __init__(self, url: str, i: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.i, self.stop = url, i, stop
        self.times: list[float] = []

    def run(self) -> None:
        body = {"model": MODEL, "prompt": f"Stream {self.i}: tell a long story.", "stream": True,
                "options": {"num_predict": 100000, "temperature": 0.8, "seed": self.i}}
        with httpx.Client(timeout=600, trust_env=False) as c, c.stream("POST", self.url + "/api/generate",
                                                                       json=body) as r:
            for line in r.iter_lines():
                if line:
                    self.times.append(time.perf_counter())
                if self.stop.is_set():
                    return


def gaps(streams: list[Stream], t0: float, t1: float) -> list[float]:
    out = []
    for s in streams:
        ts = s.times
        out += [(b - a) * 1e3 for a, b in zip(ts, ts[1:]) if t0 <= b <= t1]
    return out


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--images", type=int, default=3)
    ap.add_argument("--window", type=float, default=3.0, help="baseline seconds of streams alone")
    args = ap.parse_args()
    store = Path(tempfile.mkdtemp(prefix="vision-bench-"))
    result: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": platform.processor(),
                    "cores": os.cpu_count(), "loadavg_before": os.getloadavg(), "streams": args.streams}
    with serve_daemon({"OLLAMA_MODELS": str(store), "EVENFLOW_BACKEND": "llamacpp"}, "vision_bench_daemon.log") as url:
        create(url)
        ask_image(url, png(999))  # load the model and warm up
        alone = [ask_image(url, png(i)) for i in range(args.images)]
        cached = ask_image(url, png(0))
        result["alone"] = alone
        result["cached"] = cached
        recorder = StepRecorder(url)
        stop = threading.Event()
        streams = [Stream(url, i, stop) for i in range(args.streams)]
        for s in streams:
            s.start()
        while any(len(s.times) < 3 for s in streams):
            time.sleep(0.05)
        t_base = time.perf_counter()
        time.sleep(args.window)
        t_sent = time.perf_counter()
        q = ask_image(url, png(4242))
        t_first = t_sent + q["ttft_ms"] / 1e3
        time.sleep(1.0)
        # the same beside a text question of the image question's length (a document), for comparison
        words = " ".join(f"item{k}" for k in range(q["prompt_eval_count"] or 256))
        t_text = time.perf_counter()
        qt = ask_image(url, None, text=words)
        t_text_first = t_text + qt["ttft_ms"] / 1e3
        time.sleep(0.5)
        stop.set()
        wall = time.time() - time.perf_counter()  # step events carry wall-clock times
        steps = [st for st in recorder.stop() if t_sent + wall <= st["time"] <= t_first + wall]
        base, during = gaps(streams, t_base, t_sent), gaps(streams, t_sent, t_first)
        text_gaps = gaps(streams, t_text, t_text_first)
        result["beside_text"] = {"question": qt, "gaps": len(text_gaps), "p50_ms": pct(text_gaps, 50),
                                 "p99_ms": pct(text_gaps, 99), "max_ms": max(text_gaps, default=float("nan"))}
        result["beside"] = {"question": q, "baseline_gaps": len(base), "during_gaps": len(during),
                            "baseline_p50_ms": pct(base, 50), "baseline_p99_ms": pct(base, 99),
                            "baseline_max_ms": max(base, default=float("nan")),
                            "during_p50_ms": pct(during, 50), "during_p99_ms": pct(during, 99),
                            "during_max_ms": max(during, default=float("nan")),
                            # the engine's steps meanwhile: a long one is the engine's, a gap without one is not
                            "steps": len(steps), "step_max_ms": max((st["step_ms"] for st in steps), default=0),
                            "step_prefill_tokens": sum(st["prefill_tokens"] for st in steps),
                            "step_ms": [round(st["step_ms"], 1) for st in steps]}
    result["loadavg_after"] = os.getloadavg()
    b = result["beside"]
    print("| measurement | value |\n|---|---|")
    for i, a in enumerate(alone):
        print(f"| image question alone, image {i} (encode + prefill): TTFT | {a['ttft_ms']:.0f} ms "
              f"({a['prompt_eval_count']} prompt tokens) |")
    print(f"| same image again (cached rows + prefix cache): TTFT | {cached['ttft_ms']:.0f} ms |")
    print(f"| beside {args.streams} streams: image question TTFT | {b['question']['ttft_ms']:.0f} ms |")
    print(f"| streams' gaps, baseline ({b['baseline_gaps']}): P50 / P99 / max | {b['baseline_p50_ms']:.0f} / "
          f"{b['baseline_p99_ms']:.0f} / {b['baseline_max_ms']:.0f} ms |")
    print(f"| streams' gaps while the image question is admitted ({b['during_gaps']}): P50 / P99 / max | "
          f"{b['during_p50_ms']:.0f} / {b['during_p99_ms']:.0f} / {b['during_max_ms']:.0f} ms |")
    t = result["beside_text"]
    print(f"| beside {args.streams} streams: a text question of {t['question']['prompt_eval_count']} tokens: TTFT | "
          f"{t['question']['ttft_ms']:.0f} ms |")
    print(f"| streams' gaps while that text question is admitted ({t['gaps']}): P50 / P99 / max | {t['p50_ms']:.0f} / "
          f"{t['p99_ms']:.0f} / {t['max_ms']:.0f} ms |")
    print(f"| engine steps meanwhile: count / longest / prefill tokens | {b['steps']} / {b['step_max_ms']:.0f} ms / "
          f"{b['step_prefill_tokens']} |")
    print(f"\nload average before {result['loadavg_before']}, after {result['loadavg_after']}")
    out = HERE / "vision_bench.json"
    runs = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(runs + [result], indent=1) + "\n")


if __name__ == "__main__":
    main()
