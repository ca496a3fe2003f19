"""Metadata of model weights without loading them: GGUF headers and HF safetensors folders.

GGUF headers are parsed by `backends.common.gguf_file` in lazy mode: big arrays (token lists, merges)
stay in the file unless asked for, so a 150k-token vocabulary costs milliseconds. Results are cached
per (path, size, mtime).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...backends.base import ModelLoadError
from ...backends.common.gguf_file import GGUFArray, GGUFFile, file_type_name

log = logging.getLogger(__name__)

SMALL_ARRAY = 5  # Ollama shows arrays longer than this as [] in non-verbose model_info
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


@functools.lru_cache(maxsize=64)
def _read_gguf_cached(path: str, size: int, mtime_ns: int) -> WeightsInfo:
    return _read_gguf(path, full=False)


def _read_gguf(path: str, full: bool) -> WeightsInfo:
    try:
        with GGUFFile(path, lazy_arrays_over=None if full else SMALL_ARRAY) as gf:
            return _gguf_info(gf)
    except ModelLoadError as e:  # the message already names the file and the reason
        raise WeightsError(str(e)) from e


def _gguf_info(gf: GGUFFile) -> WeightsInfo:
    """WeightsInfo of an open GGUF file; big arrays (still in the file) show as []."""
    md = {k: [] if isinstance(v, GGUFArray) else v for k, v in gf.metadata.items()}

    def token(id_key: str) -> str | None:  # one element of the (maybe lazy) token list, not the whole list
        tid, toks = gf.metadata.get(id_key), gf.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tid, int) and isinstance(toks, (list, GGUFArray)) and 0 <= tid < len(toks):
            text = toks[tid]
            return text if isinstance(text, str) else None
        return None

    template = md.get("tokenizer.chat_template")
    return WeightsInfo(
        format="gguf", architecture=str(md.get("general.architecture") or ""),
        parameter_count=sum(t.n_elements for t in gf.tensors.values()),
        file_type=file_type_name(md, gf.tensors.values()), metadata=md,
        chat_template=template if isinstance(template, str) else None,
        bos_token=token("tokenizer.ggml.bos_token_id"), eos_token=token("tokenizer.ggml.eos_token_id"),
        synthetic=bool(md.get(SYNTHETIC_KEY)),
        tensors=[{"name": t.name, "type": t.qtype.name, "shape": list(reversed(t.shape))} for t in gf.tensors.values()],
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
