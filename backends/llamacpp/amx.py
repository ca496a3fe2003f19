"""Whether llama.cpp's "extra buffer types" (AMX / weight repacking) are safe on this CPU.

Some VMs advertise AMX in cpuid but fault on the tile instructions: llama.cpp then dies with SIGILL at
the first decode of a Q8_0 model, taking the daemon with it. So extra buffer types stay off unless a
one-time probe in a subprocess (tiny synthetic Q8_0 model, extra bufts on, a few decodes) survives.
The verdict is cached per CPU model string and llama.cpp build; EVENFLOW_LLAMACPP_EXTRA_BUFTS =
auto | on | off overrides.

`auto` repacks only on a CPU with AMX: on an AVX2 CPU (an AMD EPYC) the repacked weights made a 4096-token prompt
alone 27% slower (34.97 s against 27.54 s, docs/performance.md) and decode steps no faster.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ENV_VAR = "EVENFLOW_LLAMACPP_EXTRA_BUFTS"
PROBE_TIMEOUT_S = 120
_MODES = ("auto", "on", "off")
_decided: bool | None = None  # per process: the probe's answer does not change while we run


def cpu_model() -> str:
    """The CPU model string plus its AMX flags (a VM may mask them), e.g. 'Intel(R) Xeon(R) ... amx_int8'."""
    name, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = " ".join(sorted(w for w in line.split(":", 1)[1].split() if w.startswith("amx")))
    except OSError:
        import platform

        name = platform.processor() or platform.machine()
    return f"{name} {flags}".strip()


def _cache_file() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("evenflow")) / "llamacpp_extra_bufts.json"


def _cache_key() -> str:
    from .lib import llama_cpp

    return hashlib.sha256(f"{cpu_model()}|{llama_cpp.__version__}".encode()).hexdigest()[:16]


def extra_bufts_enabled() -> bool:
    """The model param `use_extra_bufts` to load with: env override, cached verdict, else probe once."""
    global _decided
    mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"{ENV_VAR}={mode!r} is not one of {', '.join(_MODES)}")
    if mode != "auto":
        return mode == "on"
    if _decided is None:
        _decided = has_amx() and _cached_or_probe()
        if not _decided:
            log.info("llama.cpp extra buffer types off on %r (no AMX, or the probe failed)", cpu_model())
    return _decided


def has_amx() -> bool:
    return "amx_int8" in cpu_model().split()


def _cached_or_probe() -> bool:
    path, key = _cache_file(), _cache_key()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache and isinstance(cache[key].get("safe"), bool):
        return cache[key]["safe"]
    try:
        safe, detail = run_probe()
    except Exception as e:  # whatever goes wrong, the answer is "off", never a failed model load
        safe, detail = False, f"probe could not run: {e!r}"
    log.info("llama.cpp extra buffer types on %r: %s (%s)", cpu_model(), "safe" if safe else "disabled", detail)
    cache[key] = {"cpu": cpu_model(), "safe": safe, "detail": detail}
    try:  # atomic write: another daemon may probe at the same time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:
        log.warning("could not cache the extra-bufts verdict in %s", path, exc_info=True)
    return safe


def run_probe() -> tuple[bool, str]:
    """Load a tiny Q8_0 model with extra bufts on and decode in a child process; (safe, detail)."""
    with tempfile.TemporaryDirectory(prefix="evenflow-amx-") as tmp:
        model = os.path.join(tmp, "probe-q8_0.gguf")
        write_probe_model(model)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "evenflow.backends.llamacpp.amx", model],
                capture_output=True, timeout=PROBE_TIMEOUT_S, text=True,
            )
        except subprocess.TimeoutExpired:
            return False, f"probe timed out after {PROBE_TIMEOUT_S}s"
    if proc.returncode == 0 and "PROBE-OK" in proc.stdout:
        return True, "probe decoded with extra buffer types"
    tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
    return False, f"probe exited with {proc.returncode} {tail[0][:200]}"


def write_probe_model(path: str, n_embd: int = 256, n_ff: int = 512, n_layer: int = 1) -> None:
    """A random 1-layer llama in Q8_0 with a 259-token byte-fallback SPM vocab (shapes AMX accepts)."""
    from gguf import GGMLQuantizationType, GGUFWriter, TokenType
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    n_vocab = len(tokens) + (-len(tokens)) % 32
    tokens += [f"<pad{i}>".encode() for i in range(n_vocab - len(tokens))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.UNUSED] * (n_vocab - len(types))
    w = GGUFWriter(path, "llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(7)  # MOSTLY_Q8_0
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def q8(name: str, rows: int, cols: int) -> None:
        data = quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), GGMLQuantizationType.Q8_0)
        w.add_tensor(name, data, raw_dtype=GGMLQuantizationType.Q8_0)

    def f32(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    q8("token_embd.weight", n_vocab, n_embd)
    f32("output_norm.weight", n_embd)
    q8("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        f32(f"blk.{i}.attn_norm.weight", n_embd)
        f32(f"blk.{i}.ffn_norm.weight", n_embd)
        for t in ("q", "k", "v", "output"):
            q8(f"blk.{i}.attn_{t}.weight", n_embd, n_embd)
        q8(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        q8(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        q8(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _probe_main(model_path: str) -> int:
    """Child process: load with extra bufts, prefill 32 tokens then decode a few; SIGILL kills us here."""
    from .lib import L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = True
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        print("PROBE-FAIL load", flush=True)
        return 2
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, 64, 64, 1, 1
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(64, 0, 1)
    pos = 0
    for n in (32, 1, 1, 1):  # a prompt then decodes: both matmul paths run
        batch.n_tokens = n
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 3 + (pos * 7) % 256, pos, 1
            batch.seq_id[i][0], batch.logits[i] = 0, int(i == n - 1)
            pos += 1
        if L.llama_decode(ctx, batch) != 0:
            print("PROBE-FAIL decode", flush=True)
            return 3
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    print("PROBE-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1]))
