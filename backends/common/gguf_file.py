"""A small, fast GGUF parser: metadata as Python values, tensors as mmapped bytes dequantised on demand.

gguf.GGUFReader builds one numpy view per metadata item, which takes seconds for a 128k-token vocab;
this reads the same layout (GGUF v2/v3, little-endian) in a fraction of that and checks every bound, so
a truncated or corrupt file fails with a `ModelLoadError` naming the file instead of a numpy error.
"""
from __future__ import annotations

import logging
import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from ..base import ModelLoadError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# GGUF value type -> (struct format, numpy dtype) for fixed-size scalars.
_SCALARS: dict[int, tuple[str, Any]] = {
    0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
    4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
    10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9


def is_gguf(path: str) -> bool:
    """True when `path` is a file starting with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except (IsADirectoryError, FileNotFoundError, PermissionError):
        return False


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first), i.e. GGUF dims reversed
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: mmap.mmap, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise ModelLoadError(f"{self.path}: truncated GGUF (needs {start + n} bytes, file has {len(self.buf)})")
        self.pos += n
        return start

    def scalar(self, vtype: int) -> Any:
        fmt, _ = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(10)
        start = self.take(n)
        return self.buf[start : start + n].decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, n = self.scalar(4), self.scalar(10)
            if itype in _SCALARS:  # numeric arrays in one frombuffer, not one read per item
                dt = np.dtype(_SCALARS[itype][1]).newbyteorder("<")
                start = self.take(n * dt.itemsize)
                return np.frombuffer(self.buf, dtype=dt, count=n, offset=start).tolist()
            return [self.value(itype) for _ in range(n)]
        raise ModelLoadError(f"{self.path}: corrupt GGUF (unknown value type {vtype} at byte {self.pos})")


class GGUFFile:
    """A parsed GGUF file: `metadata` dict, `tensors` by name, `array(name)` -> float32 numpy."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot open ({e})") from None
        cur = _Cursor(self._mm, path)
        if self._mm[:4] != GGUF_MAGIC:
            raise ModelLoadError(f"{path}: not a GGUF file (bad magic {bytes(self._mm[:4])!r})")
        cur.take(4)
        self.version = cur.scalar(4)
        if self.version not in (2, 3):
            raise ModelLoadError(f"{path}: unsupported GGUF version {self.version}; supported: 2, 3")
        n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
        if n_tensors > 1 << 24 or n_kv > 1 << 24:
            raise ModelLoadError(f"{path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar(4)
            if n_dims > 8:
                raise ModelLoadError(f"{path}: corrupt GGUF (tensor {name!r} has {n_dims} dims)")
            dims = [cur.scalar(10) for _ in range(n_dims)]
            infos.append((name, dims, cur.scalar(4), cur.scalar(10)))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (cur.pos + align - 1) // align * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, dims, qt, off in infos:
            try:
                qtype = GGMLQuantizationType(qt)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelLoadError(f"{path}: tensor {name!r} has unknown ggml type {qt}") from None
            n_el = int(np.prod(dims, dtype=np.int64))
            n_bytes = n_el // block * type_size
            t = GGUFTensor(name, tuple(int(d) for d in reversed(dims)), qtype, data_start + off, n_bytes)
            if t.offset + n_bytes > len(self._mm):
                raise ModelLoadError(
                    f"{path}: truncated GGUF: tensor {name!r} needs bytes up to {t.offset + n_bytes}, "
                    f"file has {len(self._mm)}"
                )
            self.tensors[name] = t

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 numpy in numpy order, dequantised if needed."""
        t = self.tensors[name]
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        if t.qtype == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(t.shape)
        if t.qtype == GGMLQuantizationType.F16:
            return raw.view(np.float16).astype(np.float32).reshape(t.shape)
        if t.qtype == GGMLQuantizationType.BF16:
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
        rows = raw.reshape(-1, t.n_bytes // max(1, t.n_elements // t.shape[-1]))
        try:
            out = dequantize(rows, t.qtype)
        except NotImplementedError:
            raise ModelLoadError(f"{self.path}: tensor {name!r} uses {t.qtype.name}, which cannot be dequantised") from None
        return out.reshape(t.shape)

    def close(self) -> None:
        try:
            self._mm.close()
        except BufferError:  # numpy views still alive; the OS unmaps when they go
            pass
