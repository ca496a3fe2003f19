"""Run inside an RPC build of llama-cpp-python (tests/test_llamacpp_rpc.py starts it): greedy tokens of a GGUF,
through our runner's step loop, printed as JSON; with --expect-offload it also checks the placement."""
from __future__ import annotations

import json
import logging
import sys

import numpy as np

from evenflow.backends.base import Batch, RunnerSettings, load_runner

PROMPTS = ["The quick brown fox jumps over the lazy dog", "Once upon a time, in a land far away,",
           "def fibonacci(n):\n    if n < 2:\n        return n\n" * 3]


def main(path: str, expect_offload: bool, num_gpu: int | None) -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    native = logging.getLogger("evenflow.backends.llamacpp.native")
    native.setLevel(logging.DEBUG)
    native.addHandler(Keep())
    # f16 KV and no flash attention on both sides: the CPU build would otherwise pick a q8_0 K by default
    r = load_runner("llamacpp", path, RunnerSettings(max_num_seqs=4, block_size=16, num_kv_blocks=64,
                                                     context_length=512, max_num_batched_tokens=256,
                                                     flash_attention="off", kv_cache_type="f16", num_gpu=num_gpu))
    out: dict = {"device": r.device, "gpu_layers": r.placement.gpu_layers,
                 "devices": [d.name for d in r.placement.devices], "vram_bytes": r.vram_bytes,
                 "assigned_rpc": sum("assigned to device RPC" in ln for ln in lines),
                 "rpc_buffers": [ln.split(":", 1)[-1].strip() for ln in lines if "RPC0" in ln and "buffer size" in ln]}
    prompts = [r.tokenizer.encode(p) for p in PROMPTS]
    for chunk in (None, 1, 7, 64):
        toks = []
        for slot, p in enumerate(prompts):  # three sequences, decodes riding along with chunks
            toks.append([])
        pos = [0] * len(prompts)
        while any(len(t) < 8 for t in toks):
            spans = []
            for s, p in enumerate(prompts):
                if len(toks[s]) >= 8:
                    continue
                if pos[s] < len(p):
                    n = len(p) - pos[s] if chunk is None else min(chunk, len(p) - pos[s])
                    spans.append((s, p[pos[s]:pos[s] + n], pos[s], [], pos[s] + n == len(p)))
                    pos[s] += n
                else:
                    spans.append((s, [toks[s][-1]], pos[s], [], True))
                    pos[s] += 1
            logits = r.step(Batch.from_spans(spans, 16))
            rows = [sp[0] for sp in spans if sp[4]]
            for row, s in enumerate(rows):
                toks[s].append(int(np.argmax(logits[row])))
        for s in range(len(prompts)):
            r.free(s)
        out[f"tokens_chunk_{chunk}"] = toks
    r.close()
    print("RESULT " + json.dumps(out))
    if expect_offload and not (out["gpu_layers"] > 0 and out["devices"] and out["devices"][0].startswith("RPC")):
        sys.exit(f"not offloaded: {out}")


if __name__ == "__main__":
    n = sys.argv[3] if len(sys.argv) > 3 else "none"
    main(sys.argv[1], sys.argv[2] == "offload", None if n == "none" else int(n))
