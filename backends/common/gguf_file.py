"""The one GGUF parser: metadata as Python values, tensors as mmapped bytes dequantised on demand.

gguf.GGUFReader builds one numpy view per metadata item, which takes seconds for a 128k-token vocab;
this reads the same layout (GGUF v2/v3, little-endian) in a fraction of that and checks every bound, so
a truncated or corrupt file fails with a `ModelLoadError` naming the file instead of a numpy error.
With `lazy_arrays_over=N`, metadata arrays longer than N (token lists, merges) stay in the file as
`GGUFArray`s (len, indexed reads, tolist) so that a header read costs milliseconds, not a vocab decode.
"""
from __future__ import annotations

import logging
import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

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
_U64 = struct.Struct("<Q").unpack_from
# llama.cpp's gguf reader: tensors have at most GGML_MAX_DIMS dims and names shorter than GGML_MAX_NAME bytes;
# a file breaking either is refused there, so it is refused here too (with a reason instead of a NULL).
MAX_DIMS = 4
MAX_TENSOR_NAME = 63
MAX_ARRAY_NESTING = 4  # arrays of arrays (llama.cpp reads none): deeper ones are a crafted file, not a model
_INT64_MAX = (1 << 63) - 1
# Ollama's quantization_level names where they differ from gguf's LlamaFileType names
_FILE_TYPE_NAMES = {38: "MXFP4"}


def is_gguf(path: str) -> bool:
    """True when `path` is a file starting with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
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


def file_type_name(metadata: dict[str, Any], tensors: Iterable[GGUFTensor]) -> str:
    """Ollama's quantization level (F16, Q8_0, Q4_K_M...): general.file_type, else the commonest 2-D tensor type, else ""."""
    ft = metadata.get("general.file_type")
    if isinstance(ft, int) and not isinstance(ft, bool) and ft != LlamaFileType.GUESSED:
        if ft in _FILE_TYPE_NAMES:
            return _FILE_TYPE_NAMES[ft]
        try:
            return LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            log.debug("unknown general.file_type %d; naming the file type after its tensors", ft)
    counts = Counter(t.qtype.name for t in tensors if len(t.shape) >= 2)
    return counts.most_common(1)[0][0] if counts else ""


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: mmap.mmap, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def truncated(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: truncated GGUF ({what}; file has {len(self.buf)} bytes)")

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise self.truncated(f"needs {start + n} bytes")
        self.pos += n
        return start

    def scalar(self, vtype: int) -> Any:
        fmt, _ = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(10)
        start = self.take(n)
        return self.buf[start : start + n].decode("utf-8", errors="replace")

    def strings(self, count: int, key: str, keep: bool) -> list[str] | None:
        """`count` strings from here: decoded when `keep`, else only stepped over (the lazy-mode fast path)."""
        buf, pos, out = self.buf, self.pos, [] if keep else None
        if count > (len(buf) - pos) // 8:  # each string takes at least its 8-byte length
            raise self.truncated(f"array {key!r} of {count} strings at byte {pos}")
        try:  # one tight loop: this walk is most of the cost of reading a 150k-token vocab
            if out is None:
                for _ in range(count):
                    pos += 8 + _U64(buf, pos)[0]
            else:
                append = out.append
                for _ in range(count):
                    n = _U64(buf, pos)[0]
                    append(buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
                    pos += 8 + n
        except (struct.error, OverflowError):  # a length ran past the end (OverflowError: far past)
            pos = len(buf) + 1
        if pos > len(buf):
            raise self.truncated(f"array {key!r} runs past the end")
        self.pos = pos
        return out

    def value(self, vtype: int, key: str, lazy_over: int | None = None, file: "GGUFFile | None" = None,
              depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ModelLoadError(f"{self.path}: corrupt GGUF (unknown value type {vtype} for key {key!r} at byte {self.pos})")
        itype, n = self.scalar(4), self.scalar(10)
        lazy = file is not None and lazy_over is not None and n > lazy_over and itype in (_STRING, *_SCALARS)
        start = self.pos
        if itype == _STRING:
            items = self.strings(n, key, keep=not lazy)
        elif itype in _SCALARS:  # numeric arrays in one frombuffer, not one read per item
            dt = np.dtype(_SCALARS[itype][1]).newbyteorder("<")
            self.take(n * dt.itemsize)
            items = None if lazy else np.frombuffer(self.buf, dtype=dt, count=n, offset=start).tolist()
        else:  # arrays of arrays: rare and small, read element by element (each takes at least 12 bytes)
            if itype != _ARRAY:
                raise ModelLoadError(f"{self.path}: corrupt GGUF (unknown element type {itype} in array {key!r})")
            if depth + 1 >= MAX_ARRAY_NESTING:
                raise ModelLoadError(f"{self.path}: corrupt GGUF (array {key!r} nests arrays deeper than "
                                     f"{MAX_ARRAY_NESTING} levels)")
            if n > (len(self.buf) - self.pos) // 12:
                raise self.truncated(f"array {key!r} of {n} arrays at byte {self.pos}")
            items = [self.value(itype, key, depth=depth + 1) for _ in range(n)]
        return GGUFArray(file, key, itype, n, start) if lazy else items


class GGUFArray:
    """A metadata array left in the file (lazy mode): `len()`, `[i]`, iteration and `tolist()` read on demand."""

    def __init__(self, file: "GGUFFile", key: str, etype: int, count: int, start: int) -> None:
        self.file, self.key, self.etype, self.count, self.start = file, key, etype, count, start
        self._offsets: list[int] | None = None  # string arrays: byte offset of each element, built on first [i]

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        kind = "string" if self.etype == _STRING else np.dtype(_SCALARS[self.etype][1]).name
        return f"GGUFArray({self.key!r}, {self.count} x {kind})"

    def _buf(self) -> mmap.mmap:
        if self.file._mm.closed:
            raise ValueError(f"{self.file.path}: GGUF file closed; read {self.key!r} before close()")
        return self.file._mm

    def __getitem__(self, i: int) -> Any:
        if not isinstance(i, int):
            raise TypeError(f"GGUFArray indices must be int, not {type(i).__name__}; use tolist() for slices")
        if not -self.count <= i < self.count:
            raise IndexError(f"{self.key}: index {i} out of range for {self.count} elements")
        i %= self.count
        buf = self._buf()
        if self.etype != _STRING:
            fmt = _SCALARS[self.etype][0]
            return struct.unpack_from(fmt, buf, self.start + i * struct.calcsize(fmt))[0]
        if self._offsets is None:  # bounds were checked when the header was parsed
            offsets, pos = [], self.start
            for _ in range(self.count):
                offsets.append(pos)
                pos += 8 + _U64(buf, pos)[0]
            self._offsets = offsets
        pos = self._offsets[i]
        return buf[pos + 8 : pos + 8 + _U64(buf, pos)[0]].decode("utf-8", errors="replace")

    def tolist(self) -> list[Any]:
        """All elements as Python values."""
        buf = self._buf()
        if self.etype == _STRING:
            cur = _Cursor(buf, self.file.path)
            cur.pos = self.start
            return cur.strings(self.count, self.key, keep=True) or []
        dt = np.dtype(_SCALARS[self.etype][1]).newbyteorder("<")
        return np.frombuffer(buf, dtype=dt, count=self.count, offset=self.start).tolist()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())


class GGUFFile:
    """A parsed GGUF file: `metadata` dict, `tensors` by name, `array(name)` -> float32 numpy.

    `lazy_arrays_over=N` leaves metadata arrays of more than N strings or numbers in the file as
    `GGUFArray`s, readable until `close()`; the default (None) reads every value into Python.
    """

    def __init__(self, path: str, lazy_arrays_over: int | None = None) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot open ({e})") from None
        try:
            self._parse(lazy_arrays_over)
        except BaseException:
            self._mm.close()
            raise

    def _parse(self, lazy_over: int | None) -> None:
        path, mm = self.path, self._mm
        cur = _Cursor(mm, path)
        if mm[:4] != GGUF_MAGIC:
            raise ModelLoadError(f"{path}: not a GGUF file (bad magic {bytes(mm[:4])!r}; expected {GGUF_MAGIC!r})")
        cur.take(4)
        self.version = cur.scalar(4)
        if self.version not in (2, 3):
            raise ModelLoadError(
                f"{path}: unsupported GGUF version {self.version}; supported: 2, 3 (big-endian files are not)"
            )
        n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
        if n_tensors > 1 << 24 or n_kv > 1 << 24:
            raise ModelLoadError(f"{path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            if key in self.metadata:
                raise ModelLoadError(f"{path}: corrupt GGUF (duplicate metadata key {key!r})")
            self.metadata[key] = cur.value(cur.scalar(4), key, lazy_over, self)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar(4)
            if n_dims > MAX_DIMS:
                raise ModelLoadError(f"{path}: corrupt GGUF (tensor {name[:80]!r} has {n_dims} dims; at most {MAX_DIMS})")
            dims = [cur.scalar(10) for _ in range(n_dims)]
            infos.append((name, dims, cur.scalar(4), cur.scalar(10)))
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise ModelLoadError(f"{path}: corrupt GGUF (general.alignment {align!r}; expected a power of two)")
        data_start = (cur.pos + align - 1) // align * align
        self.tensors: dict[str, GGUFTensor] = {}
        expected_offset = 0  # llama.cpp wants the tensors packed in order, each padded to the alignment
        for name, dims, qt, off in infos:
            t = self._tensor(name, dims, qt, off, data_start)
            if off != expected_offset:
                raise ModelLoadError(f"{path}: corrupt GGUF (tensor {name!r} has data offset {off}, expected "
                                     f"{expected_offset})")
            expected_offset += (t.n_bytes + align - 1) // align * align
            if t.offset + t.n_bytes > len(mm):
                raise ModelLoadError(
                    f"{path}: truncated GGUF: tensor {name!r} needs bytes up to {t.offset + t.n_bytes}, "
                    f"file has {len(mm)}"
                )
            self.tensors[name] = t

    def _tensor(self, name: str, dims: list[int], qt: int, off: int, data_start: int) -> GGUFTensor:
        """One tensor-table entry checked as llama.cpp's gguf reader checks it (name, type, shape, size)."""
        path = self.path
        if len(name.encode()) > MAX_TENSOR_NAME:
            raise ModelLoadError(f"{path}: corrupt GGUF (tensor name {name[:80]!r} is longer than {MAX_TENSOR_NAME} bytes)")
        if name in self.tensors:
            raise ModelLoadError(f"{path}: corrupt GGUF (duplicate tensor {name!r})")
        try:
            qtype = GGMLQuantizationType(qt)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelLoadError(f"{path}: tensor {name!r} has unknown ggml type {qt}") from None
        n_el = 1
        for d in dims:
            if d > _INT64_MAX or (d and n_el > _INT64_MAX // d):
                raise ModelLoadError(f"{path}: corrupt GGUF (tensor {name!r} has dims {dims}: too many elements)")
            n_el *= d
        if dims and dims[0] % block:
            raise ModelLoadError(f"{path}: corrupt GGUF (tensor {name!r} of type {qtype.name} has a row of {dims[0]} "
                                 f"values, not a multiple of its block size {block})")
        n_bytes = n_el // block * type_size
        return GGUFTensor(name, tuple(int(d) for d in reversed(dims)), qtype, data_start + off, n_bytes)

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 numpy in numpy order, dequantised if needed."""
        from gguf.quants import dequantize  # numpy-heavy quant tables, only needed to load weights

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

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
