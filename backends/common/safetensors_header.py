"""The JSON header of a .safetensors file, checked entry by entry (the store at create, the loaders at load).

An uploaded file is untrusted: a shape of strings, offsets past the end or a size that disagrees with the
shape would otherwise surface as a numpy or TypeError deep in a load. Errors are `ModelLoadError`s naming the
file (as the caller calls it) and the tensor.
"""
from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

from ..base import ModelLoadError

MAX_HEADER = 100_000_000  # bytes; the safetensors library's own limit
MAX_DIMS = 8
ITEM_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
              "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def read_header(f: BinaryIO, size: int, source: str) -> tuple[dict[str, dict[str, Any]], int]:
    """({tensor name: {dtype, shape, data_offsets}}, data start) of the open file `f` of `size` bytes."""
    raw = f.read(8)
    if len(raw) != 8:
        raise ModelLoadError(f"{source}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER or 8 + n > size:
        raise ModelLoadError(f"{source}: not a safetensors file (header length {n}, file size {size})")
    return parse_header(f.read(n), size - 8 - n, source), 8 + n


def parse_header(raw: bytes, data_size: int, source: str) -> dict[str, dict[str, Any]]:
    """Decode and check header bytes; `data_size` is what follows the header in the file."""
    try:
        header = json.loads(raw)
    except RecursionError:
        raise ModelLoadError(f"{source}: safetensors header is nested too deeply") from None
    except ValueError as e:
        raise ModelLoadError(f"{source}: safetensors header is not JSON: {str(e)[:200]}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{source}: safetensors header is not a JSON object")
    out: dict[str, dict[str, Any]] = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        out[name] = _check_entry(name, t, data_size, source)
    return out


def _check_entry(name: str, t: Any, data_size: int, source: str) -> dict[str, Any]:
    where = f"{source}: tensor {name[:80]!r}"
    if not isinstance(t, dict):
        raise ModelLoadError(f"{where} is not an object with dtype, shape and data_offsets")
    dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEM_SIZES:
        raise ModelLoadError(f"{where} has dtype {str(dtype)[:40]!r}; known: {', '.join(ITEM_SIZES)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_count(d) for d in shape):
        raise ModelLoadError(f"{where} has shape {str(shape)[:80]}; expected at most {MAX_DIMS} integers >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1] <= data_size):
        raise ModelLoadError(f"{where} has data_offsets {str(offsets)[:80]}; expected [begin, end] within the "
                             f"{data_size} data bytes")
    n = ITEM_SIZES[dtype]
    for d in shape:
        n *= d
    if n != offsets[1] - offsets[0]:
        raise ModelLoadError(f"{where}: shape {shape} of {dtype} takes {n} bytes but data_offsets span "
                             f"{offsets[1] - offsets[0]}")
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62
