"""Read an HF model directory: config.json, *.safetensors (numpy), tokenizer files, generation config."""
from __future__ import annotations

import json
import logging
import mmap
import os
import struct
from typing import Any, Iterator

import numpy as np
from tokenizers import Tokenizer as HFTok

from ..base import ModelLoadError
from .model_args import ModelArgs, ModelFiles
from .hf_tokenizer import HFTokenizer
from .safetensors_header import parse_header

log = logging.getLogger(__name__)

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I32": np.int32, "I64": np.int64,
              "I8": np.int8, "U8": np.uint8, "I16": np.int16, "BOOL": np.bool_}


def _read_json(path: str, required: bool) -> dict[str, Any] | None:
    if not os.path.exists(path):
        if required:
            raise ModelLoadError(f"{path}: file not found")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # a "\ud800" escape is not text anything can encode
    except UnicodeEncodeError:
        raise ModelLoadError(f"{path}: cannot read JSON (a lone UTF-16 surrogate escape)") from None
    except RecursionError:
        raise ModelLoadError(f"{path}: cannot read JSON (nested too deeply)") from None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def is_hf_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))


class SafetensorsFile:
    """A memory-mapped .safetensors file giving float32 numpy arrays (BF16 widened by hand: numpy has none)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot open safetensors file ({e})") from None
        size = len(self._mm)
        if size < 8:
            raise ModelLoadError(f"{path}: truncated safetensors file ({size} bytes)")
        (hlen,) = struct.unpack("<Q", self._mm[:8])
        if 8 + hlen > size:
            raise ModelLoadError(f"{path}: truncated safetensors header (needs {8 + hlen} bytes, file has {size})")
        self._base = 8 + hlen
        # every entry's dtype, shape and offsets checked against the file (a bad one is a ModelLoadError here,
        # not a numpy error at the first tensor read)
        self.header: dict[str, dict[str, Any]] = parse_header(self._mm[8 : 8 + hlen], size - self._base, path)

    def names(self) -> list[str]:
        return list(self.header)

    def dtype(self, name: str) -> str:
        return self.header[name]["dtype"]

    def numel(self, name: str) -> int:
        return int(np.prod(self.header[name]["shape"], dtype=np.int64))

    def get(self, name: str) -> np.ndarray:
        h = self.header[name]
        start, end = (self._base + o for o in h["data_offsets"])
        buf = np.frombuffer(self._mm, dtype=np.uint8, count=end - start, offset=start)
        dt = h["dtype"]
        if dt == "BF16":
            arr = (buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt in _ST_DTYPES:
            arr = buf.view(_ST_DTYPES[dt]).astype(np.float32)
        else:
            raise ModelLoadError(f"{self.path}: tensor {name!r} has dtype {dt}; supported: BF16, {', '.join(_ST_DTYPES)}")
        return arr.reshape(h["shape"])


def _load_hf_tokenizer(path: str) -> HFTokenizer:
    tj = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tj):
        raise ModelLoadError(f"{path}: no tokenizer.json (only fast tokenizers are supported)")
    try:
        tok = HFTok.from_file(tj)
    except Exception as e:  # the tokenizers package raises plain Exceptions
        raise ModelLoadError(f"{tj}: cannot parse tokenizer ({e})") from None
    tcfg = _read_json(os.path.join(path, "tokenizer_config.json"), required=False) or {}
    gcfg = _read_json(os.path.join(path, "generation_config.json"), required=False) or {}
    cfg = _read_json(os.path.join(path, "config.json"), required=True) or {}

    def token_id(value: Any) -> int | None:
        if isinstance(value, dict):  # AddedToken serialisation
            value = value.get("content")
        return tok.token_to_id(value) if isinstance(value, str) else None

    n_vocab = tok.get_vocab_size(with_added_tokens=True)

    def ids(value: Any) -> list[int]:  # config files are untrusted: only ids the vocabulary has
        items = value if isinstance(value, list) else [value]
        return [i for i in items if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_vocab]

    bos_id = token_id(tcfg.get("bos_token"))
    if bos_id is None:
        bos_id = next(iter(ids(gcfg.get("bos_token_id", cfg.get("bos_token_id")))), None)
    eos_ids: set[int] = set()
    if token_id(tcfg.get("eos_token")) is not None:
        eos_ids.add(token_id(tcfg.get("eos_token")))  # type: ignore[arg-type]
    for src in (cfg.get("eos_token_id"), gcfg.get("eos_token_id")):
        eos_ids.update(ids(src))
    if "add_bos_token" in tcfg:
        add_bos = bool(tcfg["add_bos_token"])
    else:  # no explicit flag: trust the tokenizer.json post-processor (Llama 3 adds BOS there)
        probe = tok.encode("a", add_special_tokens=True).ids
        add_bos = bos_id is not None and bool(probe) and probe[0] == bos_id
    spec = json.loads(tok.to_str())
    # GPT-2 style vocabularies map bytes to printable characters; SentencePiece ones use ▁ and <0xNN>.
    byte_level = "ByteLevel" in json.dumps([spec.get("decoder"), spec.get("pre_tokenizer")])
    byte_scheme = "byte_level" if byte_level else "spm"
    return HFTokenizer(tok, bos_id=bos_id, eos_ids=eos_ids, add_bos=add_bos, byte_scheme=byte_scheme,
                       add_eos=bool(tcfg.get("add_eos_token", False)), eos_id=token_id(tcfg.get("eos_token")))


def _chat_template(path: str) -> str | None:
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    tcfg = _read_json(os.path.join(path, "tokenizer_config.json"), required=False) or {}
    tpl = tcfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) else None


class HFModel:
    """An HF directory opened for loading: args, tokenizer, chat template and lazily read weights."""

    def __init__(self, path: str) -> None:
        if not is_hf_dir(path):
            raise ModelLoadError(f"{path}: not a GGUF file nor an HF directory with config.json")
        self.path = path
        self.config = _read_json(os.path.join(path, "config.json"), required=True) or {}
        self.args = ModelArgs.from_hf_config(self.config, source=os.path.join(path, "config.json"))
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise ModelLoadError(f"{path}: no *.safetensors weight files")
        self._files = [SafetensorsFile(os.path.join(path, f)) for f in files]
        self._where = {n: st for st in self._files for n in st.names()}
        self.tokenizer = _load_hf_tokenizer(path)
        self.chat_template = _chat_template(path)

    def tensor_names(self) -> list[str]:
        return list(self._where)

    def tensor(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise ModelLoadError(f"{self.path}: weight {name!r} not found in the safetensors files")
        return self._where[name].get(name)

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(HF name, float32 array) one at a time, so peak host memory stays one tensor."""
        for name in self._where:
            yield name, self.tensor(name)

    @property
    def parameter_count(self) -> int:
        return sum(st.numel(n) for st in self._files for n in st.names())

    @property
    def file_type(self) -> str:
        dtypes = {st.dtype(n) for st in self._files for n in st.names()}
        for dt in ("BF16", "F16", "F32"):
            if dt in dtypes:
                return dt
        return next(iter(dtypes), "")

    def files(self) -> ModelFiles:
        return ModelFiles(self.path, self.args, self.tokenizer, self.chat_template, self.file_type)
