"""make_model / cached_model: write a spec's formats to a directory, or once into a shared on-disk cache."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from .archs import GGUF_ONLY
from .gguf_writer import GGUF_DTYPES, write_gguf
from .hf import write_hf
from .spec import ModelSpec, make_spec, spec_hash
from .tokenizer import cache_dir
from .random_weights import build_weights

log = logging.getLogger(__name__)

FORMATS = ("hf", "gguf")


def _as_spec(spec_or_preset: ModelSpec | str) -> ModelSpec:
    return make_spec(spec_or_preset) if isinstance(spec_or_preset, str) else spec_or_preset


def _check(spec: ModelSpec, formats: Iterable[str], gguf_dtype: str) -> tuple[str, ...]:
    formats = tuple(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"formats {formats!r} invalid; allowed: a non-empty subset of {FORMATS}")
    if "hf" in formats and spec.architecture in GGUF_ONLY:
        raise ValueError(f"architecture {spec.architecture!r} is written as GGUF only (llama.cpp runs it; the torch "
                         "and MLX backends do not): ask for formats=('gguf',)")
    if gguf_dtype not in GGUF_DTYPES:
        raise ValueError(f"gguf_dtype {gguf_dtype!r} is not supported; allowed: {', '.join(GGUF_DTYPES)}")
    return formats


def gguf_filename(spec: ModelSpec, gguf_dtype: str) -> str:
    return f"{spec.name}-{gguf_dtype}.gguf"


def make_model(spec_or_preset: ModelSpec | str, out_dir: str | Path, formats: Iterable[str] = FORMATS,
               gguf_dtype: str = "f32") -> dict[str, Path]:
    """Write the requested formats under out_dir: {"hf": out_dir/hf, "gguf": out_dir/<name>-<dtype>.gguf}."""
    spec = _as_spec(spec_or_preset)
    formats = _check(spec, formats, gguf_dtype)
    out = Path(out_dir)
    weights = None if spec.architecture in GGUF_ONLY else build_weights(spec)
    paths: dict[str, Path] = {}
    if "hf" in formats:
        paths["hf"] = write_hf(spec, out / "hf", weights=weights)
    if "gguf" in formats:
        paths["gguf"] = write_gguf(spec, out / gguf_filename(spec, gguf_dtype), dtype=gguf_dtype, weights=weights)
    return paths


def cached_model(preset_or_spec: ModelSpec | str = "tiny", formats: Iterable[str] = FORMATS,
                 gguf_dtype: str = "f32") -> dict[str, Path]:
    """Like make_model, but each artifact is written once under cache_dir()/models/<spec hash>, atomically."""
    spec = _as_spec(preset_or_spec)
    formats = _check(spec, formats, gguf_dtype)
    entry = cache_dir() / "models" / spec_hash(spec)[:20]
    entry.mkdir(parents=True, exist_ok=True)
    spec_file = entry / "spec.json"
    if not spec_file.exists():
        _atomic_text(spec_file, json.dumps(spec.to_dict(), indent=2, sort_keys=True))
    paths = {"hf": entry / "hf", "gguf": entry / gguf_filename(spec, gguf_dtype)}
    missing = [f for f in formats if not paths[f].exists()]
    if missing:
        weights = None if spec.architecture in GGUF_ONLY else build_weights(spec)
        if "hf" in missing:
            tmp = Path(tempfile.mkdtemp(dir=entry, prefix=".hf-"))
            try:
                write_hf(spec, tmp, weights=weights)
                os.rename(tmp, paths["hf"])  # atomic; fails if a parallel process got there first
            except OSError:
                if not paths["hf"].exists():
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        if "gguf" in missing:
            write_gguf(spec, paths["gguf"], dtype=gguf_dtype, weights=weights)  # temp file + os.replace
    return {f: paths[f] for f in formats}


def _atomic_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
