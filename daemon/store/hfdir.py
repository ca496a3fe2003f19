"""Materialised HF model folders: symlinks (hard links or copies where symlinks fail) to blobs, built atomically."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .store_errors import InvalidModel
from .layout import TMP_PREFIX, fsync_dir

HF_DIR = "evenflow-hf"  # under our store root: evenflow-hf/<manifest sha256>/<filename>


def materialize_dir(final: Path, files: dict[str, Path]) -> Path:
    """Build `final` with one link per {relative filename: blob path}; reuse it if it already exists."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=final.parent))
    try:
        for name, blob in files.items():
            target = tmp / safe_relpath(name)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                _link(blob, target)
            except OSError as e:  # a model stored before names were checked: an error naming it, not a 500
                raise InvalidModel(f"cannot lay out the model's file {name[:60]!r}: {e.strerror or e}") from None
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():  # another thread won the race: theirs is as good as ours
                raise
        fsync_dir(final.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


MAX_NAME_BYTES = 255  # one path component (NAME_MAX on Linux and macOS)
MAX_PATH_BYTES = 1024  # a whole relative name: HF repos nest a folder or two, not hundreds of bytes


def safe_relpath(name: str) -> Path:
    """A layer filename as a relative path that stays inside its folder and that the file system can hold;
    raises InvalidModel otherwise."""
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") or "\x00" in p or ":" in p for p in parts):
        raise InvalidModel(f"invalid file name {name[:100]!r}: must be a relative path without '..'")
    too_long = next((p for p in parts if len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES), None)
    if too_long is not None or len(name.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidModel(f"invalid file name {name[:60]!r}...: each part of a file name may have at most "
                           f"{MAX_NAME_BYTES} bytes, the whole name {MAX_PATH_BYTES}")
    return Path(*parts)


def _link(src: Path, dst: Path) -> None:
    try:
        os.symlink(src.resolve(), dst)
        return
    except (OSError, NotImplementedError):
        pass
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
