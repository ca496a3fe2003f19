"""A tiny LLaVA-style vision projector GGUF (clip.cpp's `mlp` projector type) with random weights.

Real tensor names and metadata for ONE projector type, so llama.cpp's libmtmd loads it: a ViT of `layers` blocks
(the LLaVA graph runs all but the last), a two-layer MLP projecting to the paired text model's hidden size. An
image becomes (image_size / patch_size)^2 embedding rows; the model's image attention is causal (LLaVA)."""
from __future__ import annotations

import os
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tokenizer import cache_dir


@dataclass(frozen=True)
class ProjectorSpec:
    text_hidden_size: int  # the paired text model's embedding length (mtmd refuses a mismatch)
    image_size: int = 32
    patch_size: int = 8  # (32 / 8)^2 = 16 image tokens
    hidden_size: int = 32  # the vision tower's width
    intermediate_size: int = 48  # != hidden_size: clip.cpp swaps ffn up/down of legacy files when they are equal
    layers: int = 2
    heads: int = 2
    projection_hidden: int = 64
    seed: int = 7

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def key(self) -> str:
        return "-".join(str(v) for v in (self.text_hidden_size, self.image_size, self.patch_size, self.hidden_size,
                                         self.intermediate_size, self.layers, self.heads, self.projection_hidden,
                                         self.seed))


def projector_tensors(spec: ProjectorSpec) -> dict[str, np.ndarray]:
    """GGUF name -> array in numpy order (rows = outputs); ggml's ne is the reverse of the shape."""
    rng = np.random.default_rng(spec.seed)
    h, ff, p = spec.hidden_size, spec.intermediate_size, spec.patch_size
    n_pos = spec.image_tokens

    def w(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {
        "v.patch_embd.weight": w(h, 3, p, p, scale=0.05),  # conv2d kernel, ne = [p, p, 3, h]
        "v.patch_embd.bias": w(h),
        "v.position_embd.weight": w(n_pos, h),
        "v.pre_ln.weight": np.ones(h, np.float32),
        "v.pre_ln.bias": np.zeros(h, np.float32),
    }
    for i in range(spec.layers):
        b = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t[f"{b}.{name}.weight"] = w(h, h)
            t[f"{b}.{name}.bias"] = w(h, scale=0.02)
        for name in ("ln1", "ln2"):
            t[f"{b}.{name}.weight"] = np.ones(h, np.float32)
            t[f"{b}.{name}.bias"] = np.zeros(h, np.float32)
        t[f"{b}.ffn_up.weight"] = w(ff, h)
        t[f"{b}.ffn_up.bias"] = w(ff, scale=0.02)
        t[f"{b}.ffn_down.weight"] = w(h, ff)
        t[f"{b}.ffn_down.bias"] = w(h, scale=0.02)
    # the embeddings land in the text model's residual stream: keep them at the scale of its token embeddings
    t["mm.0.weight"] = w(spec.projection_hidden, h)
    t["mm.0.bias"] = w(spec.projection_hidden, scale=0.02)
    t["mm.2.weight"] = w(spec.text_hidden_size, spec.projection_hidden, scale=0.1)
    t["mm.2.bias"] = w(spec.text_hidden_size, scale=0.02)
    return t


def write_projector(spec: ProjectorSpec, path: str | Path) -> Path:
    """Write the projector GGUF atomically (general.architecture = clip, as Ollama's create detects it)."""
    from gguf import GGUFWriter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        wr = GGUFWriter(tmp, "clip")
        wr.add_name("evenflow synthetic projector")
        wr.add_type("mmproj")
        wr.add_file_type(1)  # mostly f16
        wr.add_bool("clip.has_vision_encoder", True)
        wr.add_bool("clip.has_audio_encoder", False)
        wr.add_string("clip.projector_type", "mlp")
        wr.add_bool("clip.use_gelu", True)
        wr.add_uint32("clip.vision.image_size", spec.image_size)
        wr.add_uint32("clip.vision.patch_size", spec.patch_size)
        wr.add_uint32("clip.vision.embedding_length", spec.hidden_size)
        wr.add_uint32("clip.vision.feed_forward_length", spec.intermediate_size)
        wr.add_uint32("clip.vision.block_count", spec.layers)
        wr.add_uint32("clip.vision.projection_dim", spec.text_hidden_size)
        wr.add_uint32("clip.vision.attention.head_count", spec.heads)
        wr.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
        wr.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        wr.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        wr.add_bool("evenflow.synthetic", True)
        for name, arr in projector_tensors(spec).items():
            # 2-D and larger weights in F16 as llama.cpp's converter stores them (im2col takes the kernel's type)
            wr.add_tensor(name, arr.astype(np.float16) if arr.ndim >= 2 else arr)
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def cached_projector(text_hidden_size: int, **overrides: int) -> Path:
    """The projector for a text model of that hidden size, written once under the synthetic cache."""
    spec = ProjectorSpec(text_hidden_size, **overrides)
    path = cache_dir() / "projectors" / f"mmproj-{spec.key()}.gguf"
    if not path.exists():
        write_projector(spec, path)
    return path


def random_png(width: int, height: int, seed: int = 0) -> bytes:
    """A valid RGB PNG of random pixels (an image to ask the synthetic vision model about)."""
    px = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + px[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
