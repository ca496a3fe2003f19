"""What the torch and MLX weight loaders share: the names they skip and the errors that name a bad checkpoint."""
from __future__ import annotations

from typing import Iterable

from ..base import ModelLoadError

# HF checkpoints sometimes carry these; they are recomputed, not loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def check_shape(source: str, name: str, got: Iterable[int], want: Iterable[int]) -> None:
    if tuple(got) != tuple(want):
        raise ModelLoadError(f"{source}: weight {name!r} has shape {tuple(got)}, expected {tuple(want)}")


def check_complete(source: str, expected: Iterable[str], loaded: Iterable[str]) -> None:
    """ModelLoadError naming the first few expected weights that were not loaded."""
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise ModelLoadError(f"{source}: missing weights {', '.join(missing[:6])}"
                             + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
