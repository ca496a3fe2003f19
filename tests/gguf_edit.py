"""Rewrite a GGUF file's metadata at the byte level, keeping its tensor table and data as they are.

Hostile-input tests need files the gguf writer refuses to make (a block count of 0, arrays nested 20,000
deep, a tensor offset past the end), so this writes the key/value section itself: each value is given as
raw bytes (type + payload) or as a Python value encoded here, and the tensor infos and tensor data are
copied verbatim after it (tensor offsets are relative to the aligned data start, so they stay valid).
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from evenflow.backends.common.gguf_file import GGUFFile

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}


def string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def typed(vtype: int, value: Any) -> bytes:
    """A value's bytes as stored after its key: the u32 type, then the payload."""
    if vtype == STRING:
        return struct.pack("<I", STRING) + string(value)
    return struct.pack("<I", vtype) + struct.pack(_FMT[vtype], value)


def nested_arrays(depth: int) -> bytes:
    """An array of arrays `depth` deep, the innermost an empty u32 array (typed value bytes)."""
    inner = struct.pack("<IQ", U32, 0)
    body = inner
    for _ in range(depth - 1):
        body = struct.pack("<IQ", ARRAY, 1) + body
    return struct.pack("<I", ARRAY) + body


def _sections(path: Path) -> tuple[int, list[tuple[str, bytes]], bytes, bytes, int]:
    """(version, [(key, typed value bytes)], tensor-info bytes, tensor data bytes, n_tensors) of a GGUF file."""
    data = path.read_bytes()
    with GGUFFile(str(path)) as gf:  # a valid source file: our parser finds where each part ends
        keys = list(gf.metadata)
        align = gf.metadata.get("general.alignment", 32)
        n_tensors = len(gf.tensors)
        data_start = min((t.offset for t in gf.tensors.values()), default=len(data))
        version = gf.version
    pos, kvs = 24, []
    for key in keys:
        (n,) = struct.unpack_from("<Q", data, pos)
        start = pos + 8 + n
        end = _skip_value(data, start)
        kvs.append((key, data[start:end]))
        pos = end
    info_start = pos
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        (dims,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * dims + 4 + 8
    infos = data[info_start:pos]
    aligned = (pos + align - 1) // align * align
    assert aligned <= data_start, (aligned, data_start)
    return version, kvs, infos, data[aligned:], n_tensors


def _skip_value(data: bytes, pos: int) -> int:
    (vtype,) = struct.unpack_from("<I", data, pos)
    return _skip_payload(data, pos + 4, vtype)


def _skip_payload(data: bytes, pos: int, vtype: int) -> int:
    if vtype in _FMT:
        return pos + struct.calcsize(_FMT[vtype])
    if vtype == STRING:
        return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
    itype, n = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if itype in _FMT:
        return pos + n * struct.calcsize(_FMT[itype])
    for _ in range(n):
        pos = _skip_payload(data, pos, itype)
    return pos


def edit_gguf(src: Path, dst: Path, set_: dict[str, bytes] | None = None, drop: tuple[str, ...] = (),
              tensor_infos: bytes | None = None, n_tensors: int | None = None, cut_data: int | None = None) -> Path:
    """Copy `src` to `dst` with keys set (typed value bytes, see `typed`) or dropped; optionally replace the raw
    tensor-info section (and its count) or cut the tensor data to `cut_data` bytes."""
    version, kvs, infos, tdata, count = _sections(src)
    kv = dict(kvs)
    for k in drop:
        kv.pop(k, None)
    kv.update(set_ or {})
    align = 32  # the source's own alignment key is copied too; every synthetic file uses the default
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, count if n_tensors is None else n_tensors, len(kv)))
    for k, v in kv.items():
        out += string(k) + v
    out += infos if tensor_infos is None else tensor_infos
    out += b"\0" * (-len(out) % align)
    out += tdata if cut_data is None else tdata[:cut_data]
    dst.write_bytes(bytes(out))
    return dst


def tensor_infos(src: Path) -> list[tuple[str, list[int], int, int]]:
    """[(name, GGUF dims, ggml type, relative offset)] of `src`, for building a changed tensor table."""
    _, _, raw, _, n = _sections(src)
    out, pos = [], 0
    for _ in range(n):
        (ln,) = struct.unpack_from("<Q", raw, pos)
        name = raw[pos + 8 : pos + 8 + ln].decode()
        pos += 8 + ln
        (nd,) = struct.unpack_from("<I", raw, pos)
        dims = list(struct.unpack_from(f"<{nd}Q", raw, pos + 4))
        pos += 4 + 8 * nd
        qt, off = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        out.append((name, dims, qt, off))
    return out


def pack_infos(infos: list[tuple[str, list[int], int, int]]) -> bytes:
    return b"".join(string(n) + struct.pack("<I", len(d)) + struct.pack(f"<{len(d)}Q", *d) + struct.pack("<IQ", q, o)
                    for n, d, q, o in infos)
