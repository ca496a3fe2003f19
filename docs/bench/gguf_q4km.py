"""A random-weight Llama GGUF laid out as llama.cpp's Q4_K_M (Q4_K weights; Q6_K for the output head and for
attn_v / ffn_down in the layers Q4_K_M gives more bits), written in seconds: the K-quant blocks are random
bytes with fixed scales, so no weight is quantized in Python. For performance work only (its text is noise).

    python docs/bench/gguf_q4km.py --vocab-from ggml-vocab-llama-bpe.gguf --out llama8b-q4km.gguf   # 8B shape
    python docs/bench/gguf_q4km.py --vocab-from ... --layers 2 --hidden 256 --ffn 512 --heads 4 --kv-heads 2 ...

The output rows of the vocabulary's control, unused and byte tokens are zero (as /work/shared/tools/make_gguf.py
does): greedy decoding then never ends on an EOS, so streams run as long as a benchmark wants.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

Q4_K_BYTES, Q6_K_BYTES, QK = 144, 210, 256  # bytes per block of 256 values
SHAPE_8B = dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, ctx=131072)  # Llama-3-8B


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the layers whose attn_v / ffn_down Q4_K_M keeps in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_K blocks whose values are ~N(0, 0.02)-sized: d * sc * q - dmin * m, sc, m in 0..63, q in 0..15."""
    b = rng.integers(0, 256, size=(rows * cols // QK, Q4_K_BYTES), dtype=np.uint8)
    b[:, 0:2] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)  # d
    b[:, 2:4] = np.frombuffer(np.float16(7.5e-4).tobytes(), np.uint8)  # dmin
    return b.reshape(rows, cols // QK * Q4_K_BYTES)


def q6_k(rng: np.random.Generator, rows: int, cols: int, zero_rows: np.ndarray | None = None) -> np.ndarray:
    """Random Q6_K blocks (d * scale * (q - 32)); `zero_rows` get d = 0 (their dot products are exactly 0)."""
    per_row = cols // QK
    b = rng.integers(0, 256, size=(rows, per_row, Q6_K_BYTES), dtype=np.uint8)
    b[:, :, 208:210] = np.frombuffer(np.float16(2e-5).tobytes(), np.uint8)
    if zero_rows is not None and len(zero_rows):
        b[zero_rows, :, 208:210] = 0
    return b.reshape(rows, per_row * Q6_K_BYTES)


def write(out: str | Path, vocab_from: str | Path, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
          ctx: int, seed: int = 0) -> dict:
    """Write the GGUF; returns its shape and size."""
    import gguf
    from gguf import GGMLQuantizationType as T, GGUFReader, GGUFValueType, GGUFWriter

    if hidden % QK or ffn % QK:
        raise ValueError(f"hidden ({hidden}) and ffn ({ffn}) must be multiples of {QK} for K-quants")
    t0 = time.time()
    rd = GGUFReader(str(vocab_from))
    tok = {k: f for k, f in rd.fields.items() if k.startswith("tokenizer.")}
    n_vocab = len(tok["tokenizer.ggml.tokens"].data)
    head_dim = hidden // heads
    w = GGUFWriter(str(out), arch="llama", use_temp_file=True)
    w.add_name(f"random-llama-L{layers}-H{hidden}-q4_k_m")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for k, f in tok.items():
        vtype = f.types[0]
        w.add_key_value(k, f.contents(), vtype, sub_type=f.types[-1] if vtype == GGUFValueType.ARRAY else None)
    zero = None
    if "tokenizer.ggml.token_type" in tok:
        tt = np.asarray(tok["tokenizer.ggml.token_type"].contents())
        zero = np.nonzero(~np.isin(tt, (1, 4)))[0]
    rng = np.random.default_rng(seed)
    size = 0

    def add(name: str, data: np.ndarray, rows: int, cols: int, qtype) -> None:
        nonlocal size
        w.add_tensor(name, data, raw_dtype=qtype)  # a (rows, bytes per row) uint8 array: gguf derives the shape
        size += data.nbytes

    def norm(name: str) -> None:
        nonlocal size
        w.add_tensor(name, np.ones(hidden, dtype=np.float32))
        size += 4 * hidden

    add("token_embd.weight", q4_k(rng, n_vocab, hidden), n_vocab, hidden, T.Q4_K)
    kv = kv_heads * head_dim
    for i in range(layers):
        big = more_bits(i, layers)
        norm(f"blk.{i}.attn_norm.weight")
        add(f"blk.{i}.attn_q.weight", q4_k(rng, hidden, hidden), hidden, hidden, T.Q4_K)
        add(f"blk.{i}.attn_k.weight", q4_k(rng, kv, hidden), kv, hidden, T.Q4_K)
        add(f"blk.{i}.attn_v.weight", (q6_k if big else q4_k)(rng, kv, hidden), kv, hidden, T.Q6_K if big else T.Q4_K)
        add(f"blk.{i}.attn_output.weight", q4_k(rng, hidden, hidden), hidden, hidden, T.Q4_K)
        norm(f"blk.{i}.ffn_norm.weight")
        add(f"blk.{i}.ffn_gate.weight", q4_k(rng, ffn, hidden), ffn, hidden, T.Q4_K)
        add(f"blk.{i}.ffn_up.weight", q4_k(rng, ffn, hidden), ffn, hidden, T.Q4_K)
        add(f"blk.{i}.ffn_down.weight", (q6_k if big else q4_k)(rng, hidden, ffn), hidden, ffn,
            T.Q6_K if big else T.Q4_K)
    norm("output_norm.weight")
    add("output.weight", q6_k(rng, n_vocab, hidden, zero), n_vocab, hidden, T.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"path": str(out), "layers": layers, "hidden": hidden, "ffn": ffn, "heads": heads, "kv_heads": kv_heads,
            "vocab": n_vocab, "weight_bytes": size, "seconds": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-from", required=True, help="a GGUF to copy tokenizer.* from (llama.cpp's "
                    "models/ggml-vocab-llama-bpe.gguf: Llama 3's 128k vocabulary)")
    ap.add_argument("--out", required=True)
    for k, v in SHAPE_8B.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(write(a.out, a.vocab_from, a.layers, a.hidden, a.ffn, a.heads, a.kv_heads, a.ctx, a.seed))


if __name__ == "__main__":
    main()
