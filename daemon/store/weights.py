"""Metadata of model weights without loading them: GGUF headers and HF safetensors folders.

Big GGUF arrays (token lists, merges) are skipped, not materialised, unless asked for: reading a
150k-token vocabulary element by element costs seconds. Results are cached per (path, size, mtime).
"""
from __future__ import annotations

import functools
import json
import logging
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SMALL_ARRAY = 5  # Ollama shows arrays longer than this as [] in non-verbose model_info
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# llama.cpp's LlamaFileType ids -> Ollama's quantization_level names
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
               12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
               19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
               26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
               36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}
_GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
               12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}
_ST_DTYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8", "U8": "U8", "F8_E4M3": "F8_E4M3"}
SYNTHETIC_KEY = "evenflow.synthetic"


class WeightsError(ValueError):
    """Model files that cannot be read: not GGUF, truncated, or an HF folder without config.json."""


@dataclass
class WeightsInfo:
    """What the store needs from model weights for details, /api/show and chat formatting."""

    format: str  # gguf | safetensors
    architecture: str
    parameter_count: int
    file_type: str  # Ollama's quantization_level
    metadata: dict[str, Any]  # model_info keys (GGUF KV; big arrays as [] unless read verbose)
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    synthetic: bool = False
    tensors: list[dict[str, Any]] = field(default_factory=list)  # [{name, type, shape}] for verbose show

    @property
    def is_embedding(self) -> bool:
        """Embedding-only models declare a pooling type (Ollama's rule for the `embedding` capability)."""
        return f"{self.architecture}.pooling_type" in self.metadata or self.architecture in ("bert", "nomic-bert")


def human_number(n: int) -> str:
    """Parameter counts like Ollama's model_type: 8B, 8.0B, 25.3M, 135M, 12K."""
    for unit, scale in (("B", 1e9), ("M", 1e6)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    if n >= 1000:
        return f"{n / 1000:.0f}K"
    return str(n)


class _Cursor:
    def __init__(self, buf: Any, path: str):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def take(self, fmt: str) -> Any:
        n = struct.calcsize("<" + fmt)
        if self.pos + n > self.size:
            raise WeightsError(f"{self.path}: truncated GGUF header")
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > self.size:
            raise WeightsError(f"{self.path}: truncated GGUF header (string at {self.pos})")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip(self, vtype: int, count: int) -> None:
        if vtype == _STRING:
            for _ in range(count):
                n = self.take("Q")  # read first: `self.pos += self.take(..)` would lose the length bytes
                self.pos += n
        elif vtype in _SCALARS:
            self.pos += count * struct.calcsize("<" + _SCALARS[vtype])
        else:
            raise WeightsError(f"{self.path}: nested GGUF arrays are not supported")
        if self.pos > self.size:
            raise WeightsError(f"{self.path}: truncated GGUF header (array runs past the end)")

    def value(self, vtype: int, full: bool) -> tuple[Any, int | None]:
        """(value, array start offset if the array was skipped)."""
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype]), None
        if vtype == _STRING:
            return self.string(), None
        if vtype == _ARRAY:
            etype, count = self.take("I"), self.take("Q")
            if count > SMALL_ARRAY and not full:
                start = self.pos
                self.skip(etype, count)
                return (etype, count, start), start
            return [self.value(etype, full)[0] for _ in range(count)], None
        raise WeightsError(f"{self.path}: unknown GGUF value type {vtype}")


def _string_at(cur: _Cursor, start: int, index: int) -> str | None:
    cur.pos = start
    for _ in range(index):
        n = cur.take("Q")
        cur.pos += n
    return cur.string()


@functools.lru_cache(maxsize=64)
def _read_gguf_cached(path: str, size: int, mtime_ns: int) -> WeightsInfo:
    return _read_gguf(path, full=False)


def _read_gguf(path: str, full: bool) -> WeightsInfo:
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise WeightsError(f"{path}: not a GGUF file (bad magic; expected b'GGUF')")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_gguf(_Cursor(buf, path), full)


def _parse_gguf(cur: _Cursor, full: bool) -> WeightsInfo:
    cur.pos = 4
    version = cur.take("I")
    if version not in (2, 3):
        raise WeightsError(f"{cur.path}: unsupported GGUF version {version}")
    n_tensors, n_kv = cur.take("Q"), cur.take("Q")
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise WeightsError(f"{cur.path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
    md: dict[str, Any] = {}
    skipped: dict[str, tuple[int, int, int]] = {}
    for _ in range(n_kv):
        key = cur.string()
        value, start = cur.value(cur.take("I"), full)
        if start is not None:
            skipped[key] = value
            md[key] = []
        else:
            md[key] = value
    tensors, params, type_counts = [], 0, {}
    for _ in range(n_tensors):
        name = cur.string()
        shape = [cur.take("Q") for _ in range(cur.take("I"))]
        ggml_type = cur.take("I")
        cur.take("Q")  # data offset: not needed for metadata
        n = 1
        for d in shape:
            n *= d
        params += n
        if len(shape) >= 2:
            type_counts[ggml_type] = type_counts.get(ggml_type, 0) + 1
        tensors.append({"name": name, "type": _GGML_TYPES.get(ggml_type, str(ggml_type)), "shape": shape})

    def token(id_key: str) -> str | None:
        tid = md.get(id_key)
        if not isinstance(tid, int):
            return None
        toks = md.get("tokenizer.ggml.tokens")
        if isinstance(toks, list) and toks and 0 <= tid < len(toks):
            return toks[tid]
        if "tokenizer.ggml.tokens" in skipped:
            etype, count, start = skipped["tokenizer.ggml.tokens"]
            if etype == _STRING and 0 <= tid < count:
                return _string_at(cur, start, tid)
        return None

    arch = str(md.get("general.architecture") or "")
    ft = md.get("general.file_type")
    file_type = _FILE_TYPES.get(ft, "") if isinstance(ft, int) else ""
    if not file_type and type_counts:
        file_type = _GGML_TYPES.get(max(type_counts, key=type_counts.__getitem__), "unknown")
    template = md.get("tokenizer.chat_template")
    return WeightsInfo(
        format="gguf", architecture=arch, parameter_count=params, file_type=file_type, metadata=md,
        chat_template=template if isinstance(template, str) else None,
        bos_token=token("tokenizer.ggml.bos_token_id"), eos_token=token("tokenizer.ggml.eos_token_id"),
        synthetic=bool(md.get(SYNTHETIC_KEY)), tensors=tensors,
    )


def read_gguf(path: str | Path, full: bool = False) -> WeightsInfo:
    """Header metadata of a GGUF file; `full` also materialises big arrays (for verbose show)."""
    path = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise WeightsError(f"{path}: cannot read model file: {e.strerror}") from e
    if full:  # verbose show: big arrays materialised, so not kept in the cache
        return _read_gguf(path, full=True)
    return _read_gguf_cached(path, st.st_size, st.st_mtime_ns)


def is_gguf(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _token_text(v: Any) -> str | None:
    if isinstance(v, dict):  # tokenizer_config.json may store AddedToken dicts
        v = v.get("content")
    return v if isinstance(v, str) else None


def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise WeightsError(f"{path.name}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise WeightsError(f"{path.name}: not a safetensors file (header length {n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise WeightsError(f"{path.name}: safetensors header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise WeightsError(f"{path.name}: safetensors header is not an object")
    return header


def read_hf(files: dict[str, Path]) -> WeightsInfo:
    """Metadata of an HF model given {relative filename: path}: config.json, tokenizer_config, safetensors."""
    if "config.json" not in files:
        raise WeightsError("safetensors models need a config.json file")
    try:
        config = json.loads(Path(files["config.json"]).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise WeightsError(f"config.json is not readable JSON: {e}") from e
    if not isinstance(config, dict):
        raise WeightsError("config.json must hold a JSON object")
    tok_cfg: dict[str, Any] = {}
    if "tokenizer_config.json" in files:
        try:
            tok_cfg = json.loads(Path(files["tokenizer_config.json"]).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.warning("tokenizer_config.json is not valid JSON; ignoring it")
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if "chat_template.jinja" in files:
        template = Path(files["chat_template.jinja"]).read_text(encoding="utf-8")
    params, dtypes = 0, {}
    for name, path in files.items():
        if not name.endswith(".safetensors"):
            continue
        for tname, t in _safetensors_header(Path(path)).items():
            if tname == "__metadata__" or not isinstance(t, dict):
                continue
            n = 1
            for d in t.get("shape", []):
                n *= int(d)
            params += n
            dtypes[t.get("dtype")] = dtypes.get(t.get("dtype"), 0) + n
    arch = str(config.get("model_type") or (config.get("architectures") or ["unknown"])[0]).lower()
    file_type = _ST_DTYPES.get(max(dtypes, key=dtypes.__getitem__), "") if dtypes else ""
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        file_type = str(quant["quant_method"]).upper()
    md: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": params}
    for k, v in config.items():
        if isinstance(v, (str, int, float, bool)) and k != "model_type":
            md[f"{arch}.{k}"] = v
    marker = config.get("evenflow")
    synthetic = bool(config.get("evenflow_synthetic")) or (isinstance(marker, dict) and bool(marker.get("synthetic")))
    if synthetic:
        md[SYNTHETIC_KEY] = True
    return WeightsInfo(format="safetensors", architecture=arch, parameter_count=params, file_type=file_type,
                       metadata=md, chat_template=template if isinstance(template, str) else None,
                       bos_token=_token_text(tok_cfg.get("bos_token")), eos_token=_token_text(tok_cfg.get("eos_token")),
                       synthetic=synthetic)
