"""Structured-output overhead: 8 streams with a JSON schema vs 8 without, on a daemon with default settings.

Starts the daemon in this process (loopback, a temporary store, default settings: backend auto), creates the
bench model, and drives /api/generate over HTTP with N concurrent streams, first unconstrained, then each with
`format` = a JSON schema. The engine's grammar work (the batched token masks of a step plus advancing each
matcher over its sampled token) is timed in place; the decode step is the daemon's own step event. Prints a
table and writes docs/bench/grammar_overhead.json.

    python docs/bench/grammar_overhead.py            # bench model, 8 streams, 96 tokens each
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from evenflow.backends.synthetic import cached_model, make_spec
from evenflow.daemon.settings import load_settings
from evenflow.daemon.engine import engine as engine_mod
from evenflow.daemon.engine import grammar as grammar_mod
from evenflow.daemon.server import bind_socket, create_app

HERE = Path(__file__).resolve().parent
# Long enough that no stream finishes before num_predict: an array of at least 40 small objects.
SCHEMA = {"type": "object", "properties": {"people": {"type": "array", "minItems": 40, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                     "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                     "kind": {"enum": ["cat", "dog", "bird"]}},
    "required": ["name", "age", "kind"], "additionalProperties": False}}},
    "required": ["people"], "additionalProperties": False}


class GrammarTimer:
    """Wraps the engine's two grammar calls (mask_rows per step, Constraint.consume per token) with timers."""

    def __init__(self) -> None:
        self.mask_s: list[float] = []
        self.consume_s = 0.0
        self._mask, self._consume = engine_mod.mask_rows, grammar_mod.Constraint.consume

        def mask(executor, logits, rows):
            t = time.perf_counter()
            self._mask(executor, logits, rows)
            if rows:
                self.mask_s.append(time.perf_counter() - t)

        def consume(c, token):
            t = time.perf_counter()
            ok = self._consume(c, token)
            self.consume_s += time.perf_counter() - t
            return ok

        engine_mod.mask_rows = mask
        grammar_mod.Constraint.consume = consume


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except Exception:  # noqa: BLE001 - informational only
        return platform.processor() or "unknown"


async def drive(url: str, n: int, tokens: int, fmt) -> list[str]:
    async def one(c: httpx.AsyncClient, i: int) -> str:
        body = {"model": "bench", "prompt": f"List people, batch {i}:", "stream": False,
                "options": {"temperature": 0, "num_predict": tokens}}
        if fmt is not None:
            body["format"] = fmt
        r = await c.post("/api/generate", json=body)
        r.raise_for_status()
        return r.json()["response"]

    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        return await asyncio.gather(*(one(c, i) for i in range(n)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    gguf = Path(cached_model(make_spec(args.preset), ("gguf",), "f16")["gguf"])
    tmp = tempfile.mkdtemp(prefix="evenflow-grammar-bench-")
    settings = load_settings({}, {"host": "127.0.0.1:0", "models": tmp, "no_demo": True})
    sock = bind_socket(settings)
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        data = gguf.read_bytes()
        import hashlib

        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        httpx.post(f"{url}/api/blobs/{digest}", content=data, timeout=600).raise_for_status()
        httpx.post(f"{url}/api/create", json={"model": "bench", "files": {gguf.name: digest}, "stream": False},
                   timeout=600).raise_for_status()
        asyncio.run(drive(url, 1, 2, None))  # load the model
        engine = app.state.ctx.manager.models["bench:latest"].engine
        backend = app.state.ctx.manager.models["bench:latest"].backend
        steps: list[dict] = []
        engine.subscribe(lambda e: steps.append(e) if e["type"] == "step" else None)
        timer = GrammarTimer()
        rows = {}
        # a third run, unconstrained again: the forward pass does not see the grammar, so a dearer forward in the
        # later runs is the run order (the earlier runs' prompts held in the cache), not the constraint
        for label, fmt in (("unconstrained", None), ("json schema", SCHEMA), ("unconstrained 2", None)):
            steps.clear()
            timer.mask_s.clear()
            timer.consume_s = 0.0
            t0 = time.perf_counter()
            asyncio.run(drive(url, args.streams, args.tokens, fmt))
            wall = time.perf_counter() - t0
            full = [s for s in steps if s["decodes"] == args.streams and s["prefill_tokens"] == 0]
            step_ms = statistics.median(s["step_ms"] for s in full) if full else float("nan")
            # the forward pass is the model's; the rest of a step (scheduling, sampling, masks, streaming out) is ours
            fwd_ms = statistics.median(s["forward_ms"] for s in full) if full else float("nan")
            rest_ms = statistics.median(s["step_ms"] - s["forward_ms"] for s in full) if full else float("nan")
            mask_ms = statistics.median(timer.mask_s) * 1e3 if timer.mask_s else 0.0
            consume_ms = timer.consume_s * 1e3 / max(len(full), 1)
            rows[label] = {"decode_step_ms_p50": step_ms, "forward_ms_p50": fwd_ms, "outside_forward_ms_p50": rest_ms,
                           "mask_ms_p50": mask_ms, "consume_ms_per_step": consume_ms,
                           "steps": len(full), "wall_s": wall,
                           "tokens_per_s": args.streams * args.tokens / wall}
        base = rows["unconstrained"]["decode_step_ms_p50"]
        g = rows["json schema"]
        grammar_ms = g["mask_ms_p50"] + g["consume_ms_per_step"]
        result = {"backend": backend, "preset": args.preset, "streams": args.streams, "tokens": args.tokens,
                  "cpu": cpu_model(), "rows": rows, "grammar_ms_per_step": grammar_ms,
                  "overhead_pct_of_decode_step": 100 * grammar_ms / base,
                  "step_ratio_constrained_vs_free": g["decode_step_ms_p50"] / base,
                  "outside_forward_extra_ms": g["outside_forward_ms_p50"] - rows["unconstrained"]["outside_forward_ms_p50"]}
        print(f"backend {backend}, model {args.preset} (f16 GGUF), {args.streams} streams x {args.tokens} tokens, "
              f"CPU {result['cpu']}")
        print(f"{'run':<15}{'decode step p50 ms':>20}{'forward':>9}{'outside it':>12}{'mask p50 ms':>13}"
              f"{'consume ms/step':>17}{'tok/s':>8}")
        for label, r in rows.items():
            print(f"{label:<15}{r['decode_step_ms_p50']:>20.1f}{r['forward_ms_p50']:>9.1f}{r['outside_forward_ms_p50']:>12.2f}"
                  f"{r['mask_ms_p50']:>13.3f}"
                  f"{r['consume_ms_per_step']:>17.3f}{r['tokens_per_s']:>8.1f}")
        print(f"grammar work per step: {grammar_ms:.3f} ms = {result['overhead_pct_of_decode_step']:.2f}% of an "
              f"unconstrained decode step; constrained/free step time {result['step_ratio_constrained_vs_free']:.3f}x; "
              f"outside the forward pass a constrained step took {result['outside_forward_extra_ms']:.2f} ms more")
        (HERE / "grammar_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    finally:
        server.should_exit = True
        thread.join(30)


if __name__ == "__main__":
    main()
