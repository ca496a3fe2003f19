"""Metadata of model weights without loading them: GGUF headers and HF safetensors folders.

GGUF headers are parsed by `backends.common.gguf_file` in lazy mode: big arrays (token lists, merges)
stay in the file unless asked for, so a 150k-token vocabulary costs milliseconds. Results are cached
per (path, size, mtime).
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...backends.base import ModelLoadError
from ...backends.common.gguf_checks import check_hparams
from ...backends.common.gguf_file import GGUFArray, GGUFFile, file_type_name
from ...backends.common.safetensors_header import read_header as read_safetensors_header

log = logging.getLogger(__name__)

SMALL_ARRAY = 5  # Ollama shows arrays longer than this as [] in non-verbose model_info
_ST_DTYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8", "U8": "U8", "F8_E4M3": "F8_E4M3"}
SYNTHETIC_KEY = "evenflow.synthetic"
# A scripted test model (backends/synthetic/scripted.py) runs as llama.cpp's `gpt2` but speaks another family's formats
FAMILY_KEY = "evenflow.scripted.architecture"


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
    def family(self) -> str:
        """The model family (details.family): the architecture, or the family a scripted model stands in for."""
        override = self.metadata.get(FAMILY_KEY)
        return override if isinstance(override, str) and override else self.architecture

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


def _read_gguf(path: str, full: bool, check: bool = False) -> WeightsInfo:
    try:
        with GGUFFile(path, lazy_arrays_over=None if full else SMALL_ARRAY) as gf:
            if check:
                check_hparams(gf.metadata, path)
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


def _check_hf_config(config: dict[str, Any]) -> None:
    """An architecture evenflow runs must have hyperparameters its loaders accept (a 400 at create, not at load)."""
    from ...backends.common.model_args import SUPPORTED_ARCHITECTURES, ModelArgs

    if str(config.get("model_type")) in SUPPORTED_ARCHITECTURES:
        try:
            ModelArgs.from_hf_config(config)
        except ModelLoadError as e:
            raise WeightsError(str(e)) from None


def read_gguf(path: str | Path, full: bool = False, check: bool = False) -> WeightsInfo:
    """Header metadata of a GGUF file; `full` also materialises big arrays (for verbose show); `check` also
    refuses hyperparameters a backend would crash on (for /api/create)."""
    path = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise WeightsError(f"{path}: cannot read model file: {e.strerror}") from e
    if check:
        return _read_gguf(path, full=False, check=True)
    if full:  # verbose show: big arrays materialised, so not kept in the cache
        return _read_gguf(path, full=True)
    return _read_gguf_cached(path, st.st_size, st.st_mtime_ns)


def is_projector(path: str | Path) -> bool:
    """A GGUF vision projector (general.architecture `clip`, as Ollama's create tells it apart); False otherwise."""
    try:
        return read_gguf(path).architecture == "clip"
    except WeightsError:
        return False


def projector_info(path: str | Path) -> dict[str, Any]:
    """/api/show's projector_info: the projector's `clip.*` metadata (and its architecture), as Ollama lists it."""
    md = read_gguf(path).metadata
    info = {k: v for k, v in md.items() if k.startswith("clip.") and not isinstance(v, list)}
    info["general.architecture"] = "clip"
    return info


def _token_text(v: Any) -> str | None:
    if isinstance(v, dict):  # tokenizer_config.json may store AddedToken dicts
        v = v.get("content")
    return v if isinstance(v, str) else None


def _json_file(path: Path, name: str) -> Any:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # "\ud800" escapes decode to text nothing can encode
        return data
    except RecursionError:
        raise WeightsError(f"{name} is not readable JSON: nested too deeply") from None
    except UnicodeEncodeError:
        raise WeightsError(f"{name} holds a lone UTF-16 surrogate escape, which is not Unicode text") from None
    except (OSError, ValueError) as e:
        raise WeightsError(f"{name} is not readable JSON: {str(e)[:200]}") from None


def _safetensors_params(path: Path, name: str) -> dict[str, int]:
    """{dtype: element count} of one safetensors file, its header checked entry by entry."""
    try:
        with open(path, "rb") as f:
            header, _ = read_safetensors_header(f, os.fstat(f.fileno()).st_size, name)
    except ModelLoadError as e:
        raise WeightsError(str(e)) from None
    counts: dict[str, int] = {}
    for t in header.values():
        n = 1
        for d in t["shape"]:
            n *= d
        counts[t["dtype"]] = counts.get(t["dtype"], 0) + n
    return counts


def read_hf(files: dict[str, Path]) -> WeightsInfo:
    """Metadata of an HF model given {relative filename: path}: config.json, tokenizer_config, safetensors.
    Errors name the files by these relative names (never a store path)."""
    if "config.json" not in files:
        raise WeightsError("safetensors models need a config.json file")
    config = _json_file(files["config.json"], "config.json")
    if not isinstance(config, dict):
        raise WeightsError("config.json must hold a JSON object")
    tok_cfg: Any = {}
    if "tokenizer_config.json" in files:
        try:
            tok_cfg = _json_file(files["tokenizer_config.json"], "tokenizer_config.json")
        except WeightsError as e:
            log.warning("%s; ignoring it", e)
    if not isinstance(tok_cfg, dict):
        tok_cfg = {}
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if "chat_template.jinja" in files:
        try:
            template = Path(files["chat_template.jinja"]).read_text(encoding="utf-8")
        except (OSError, ValueError) as e:
            raise WeightsError(f"chat_template.jinja is not readable UTF-8 text: {str(e)[:200]}") from None
    params, dtypes = 0, {}
    for name, path in files.items():
        if not name.endswith(".safetensors"):
            continue
        for dtype, n in _safetensors_params(Path(path), name).items():
            params += n
            dtypes[dtype] = dtypes.get(dtype, 0) + n
    _check_hf_config(config)
    archs = config.get("architectures")
    arch = str(config.get("model_type") or (archs[0] if isinstance(archs, list) and archs else "unknown")).lower()[:100]
    file_type = _ST_DTYPES.get(max(dtypes, key=dtypes.__getitem__), "") if dtypes else ""
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        file_type = str(quant["quant_method"]).upper()
    md: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": params}
    for k, v in config.items():
        if k != "model_type" and (isinstance(v, (str, int, bool)) or isinstance(v, float) and math.isfinite(v)):
            md[f"{arch}.{k}"] = v
    marker = config.get("evenflow")
    synthetic = bool(config.get("evenflow_synthetic")) or (isinstance(marker, dict) and bool(marker.get("synthetic")))
    if synthetic:
        md[SYNTHETIC_KEY] = True
    return WeightsInfo(format="safetensors", architecture=arch, parameter_count=params, file_type=file_type,
                       metadata=md, chat_template=template if isinstance(template, str) else None,
                       bos_token=_token_text(tok_cfg.get("bos_token")), eos_token=_token_text(tok_cfg.get("eos_token")),
                       synthetic=synthetic)
