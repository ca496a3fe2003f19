"""Read a GGUF file's header (metadata and tensor table) without llama.cpp, to validate it and fill ModelInfo.

llama.cpp only returns NULL for a bad file, so we check the magic, parse the header and make sure the
tensor data is all there before handing the path over; a clear `ModelLoadError` names what is wrong.
`gguf.GGUFReader` materialises every element of the token arrays (seconds for a 150k vocab), so this is
a small dedicated parser that skips large arrays instead.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from ..base import ModelInfo, ModelLoadError

GGUF_MAGIC = b"GGUF"
MAX_ARRAY_KEPT = 1024  # arrays longer than this (token lists, merges) are skipped, not materialised

# GGUF value types -> struct format (scalars); 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass
class TensorEntry:
    """One tensor of the GGUF tensor table."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section

    @property
    def nbytes(self) -> int:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        n = 1
        for d in self.shape:
            n *= d
        return n // block * type_size


@dataclass
class GGUFHeader:
    """Metadata key/values (large arrays skipped) and the tensor table of a GGUF file."""

    path: str
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorEntry] = field(default_factory=list)
    skipped_arrays: dict[str, int] = field(default_factory=dict)  # key -> element count


class _Cursor:
    """Little-endian reader over a memory map that reports truncation as ModelLoadError."""

    def __init__(self, buf: mmap.mmap, path: str):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def take(self, fmt: str) -> Any:
        n = struct.calcsize("<" + fmt)
        if self.pos + n > self.size:
            raise ModelLoadError(f"{self.path}: truncated GGUF header (needs {self.pos + n} bytes, file has {self.size})")
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > self.size:
            raise ModelLoadError(f"{self.path}: truncated GGUF header (string of {n} bytes at {self.pos})")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            n = self.take("Q")
            self.pos += n
        if self.pos > self.size:
            raise ModelLoadError(f"{self.path}: truncated GGUF header (string array runs past the end)")

    def value(self, vtype: int, key: str, skipped: dict[str, int]) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.take("I"), self.take("Q")
            if count > MAX_ARRAY_KEPT:
                skipped[key] = count
                if etype == 8:
                    self.skip_strings(count)
                elif etype in _SCALARS:
                    self.pos += count * struct.calcsize("<" + _SCALARS[etype])
                else:
                    raise ModelLoadError(f"{self.path}: unsupported nested array in metadata key {key!r}")
                return None
            return [self.value(etype, key, skipped) for _ in range(count)]
        raise ModelLoadError(f"{self.path}: unknown GGUF value type {vtype} for key {key!r}")


def read_header(path: str) -> GGUFHeader:
    """Parse and validate a GGUF file; raise ModelLoadError naming the file and the reason."""
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory; the llama.cpp backend loads a single GGUF file")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such model file")
    size = os.path.getsize(path)
    if size < 24:
        raise ModelLoadError(f"{path}: not a GGUF file (only {size} bytes)")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelLoadError(f"{path}: not a GGUF file (bad magic bytes; expected b'GGUF')")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, path), path, size)


def _parse(cur: _Cursor, path: str, size: int) -> GGUFHeader:
    cur.pos = 4
    version = cur.take("I")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: unsupported GGUF version {version} (supported: 2, 3; big-endian files are not)")
    n_tensors, n_kv = cur.take("Q"), cur.take("Q")
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise ModelLoadError(f"{path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
    header = GGUFHeader(path, version, {})
    for _ in range(n_kv):
        key = cur.string()
        header.metadata[key] = cur.value(cur.take("I"), key, header.skipped_arrays)
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("I")
        if n_dims > 8:
            raise ModelLoadError(f"{path}: corrupt tensor info for {name!r} ({n_dims} dims)")
        shape = tuple(cur.take("Q") for _ in range(n_dims))
        ggml_type, offset = cur.take("I"), cur.take("Q")
        try:
            GGMLQuantizationType(ggml_type)
        except ValueError:
            raise ModelLoadError(f"{path}: tensor {name!r} has unknown ggml type {ggml_type}") from None
        header.tensors.append(TensorEntry(name, shape, ggml_type, offset))
    align = int(header.metadata.get("general.alignment", 32)) or 32
    data_start = (cur.pos + align - 1) // align * align
    end = max((t.offset + t.nbytes for t in header.tensors), default=0)
    if header.tensors and data_start + end > size:
        raise ModelLoadError(f"{path}: truncated GGUF file: tensor data needs {data_start + end} bytes, file has {size}")
    return header


def file_type_name(header: GGUFHeader) -> str:
    """Ollama's quantization level: F32, F16, Q8_0, Q4_K_M, ... from general.file_type or the tensors."""
    ft = header.metadata.get("general.file_type")
    if isinstance(ft, int):
        try:
            name = LlamaFileType(ft).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    # no (known) file type: the most common type among 2-D weights
    counts: dict[int, int] = {}
    for t in header.tensors:
        if len(t.shape) >= 2:
            counts[t.ggml_type] = counts.get(t.ggml_type, 0) + 1
    return GGMLQuantizationType(max(counts, key=counts.__getitem__)).name if counts else "unknown"


def model_info(header: GGUFHeader, vocab_size: int, parameter_count: int) -> ModelInfo:
    """ModelInfo from the `{arch}.*` keys; the full (array-trimmed) metadata goes to /api/show."""
    md = header.metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{header.path}: GGUF has no general.architecture key")

    def key(name: str, default: int = 0) -> int:
        v = md.get(f"{arch}.{name}", default)
        return int(v[0] if isinstance(v, list) and v else v or default)

    heads = key("attention.head_count")
    shown = {k: v for k, v in md.items() if v is not None}
    for k, n in header.skipped_arrays.items():
        shown[k] = None  # present but not shown, like Ollama's non-verbose model_info
    shown["general.parameter_count"] = parameter_count
    return ModelInfo(
        architecture=arch,
        vocab_size=vocab_size,
        context_length=key("context_length", 2048),
        embedding_length=key("embedding_length"),
        block_count=key("block_count"),
        head_count=heads,
        head_count_kv=key("attention.head_count_kv", heads),
        parameter_count=parameter_count,
        file_type=file_type_name(header),
        metadata=shown,
    )


def kv_bytes_per_token(info: ModelInfo, header: GGUFHeader, bytes_per_elem: int = 2) -> int:
    """Approximate KV-cache bytes per token (K and V, all layers) for sizing the context."""
    md, arch = header.metadata, info.architecture
    head_dim = int(md.get(f"{arch}.attention.key_length", 0) or (info.embedding_length // max(info.head_count, 1)))
    return 2 * info.block_count * info.head_count_kv * head_dim * bytes_per_elem
