"""Embeddings: a prepared input's vector from the engine, pooled as the model declares, and the vector as the
replies give it (cut to `dimensions`, L2-normalised)."""
from __future__ import annotations

import asyncio

import numpy as np

from ...manager import Lease
from ...model_types import LoadedModel
from ..http.errors import APIError

POOL_NONE, POOL_MEAN, POOL_CLS, POOL_LAST = 0, 1, 2, 3


def pooling_type(model: LoadedModel) -> int:
    """The GGUF `<arch>.pooling_type` when the model declares one; mean pooling for decoder LLMs otherwise."""
    meta = model.runner.info.metadata or {}
    arch = model.runner.info.architecture
    v = meta.get(f"{arch}.pooling_type")
    try:
        v = int(v) if v is not None else POOL_MEAN
    except (TypeError, ValueError):
        v = POOL_MEAN
    return v if v in (POOL_MEAN, POOL_CLS, POOL_LAST) else POOL_MEAN


async def embed_ids(lease: Lease, ids: list[int]) -> np.ndarray:
    """Prepared ids -> pooled float32 vector (unnormalised), computed on the engine thread."""
    model = lease.model
    try:
        hidden = await asyncio.wrap_future(model.engine.embed(ids))
    except NotImplementedError as e:
        raise APIError(400, f"model '{model.name}' does not support embeddings: {e}") from None
    h = np.asarray(hidden, dtype=np.float32)
    if not np.isfinite(h).all():  # JSON cannot carry NaN or infinity; only broken weights produce them
        raise APIError(400, f"model '{model.name}' produced non-finite values (NaN or infinity) for this input: "
                            f"its weights are broken")
    kind = pooling_type(model)
    vec = h[-1] if kind == POOL_LAST else h[0] if kind == POOL_CLS else h.mean(axis=0)
    return vec.astype(np.float32)


def normalise(vec: np.ndarray, dimensions: int | None = None) -> list[float]:
    if dimensions is not None:
        vec = vec[:dimensions]
    n = float(np.linalg.norm(vec))
    return (vec / n if n > 0 else vec).astype(np.float32).tolist()
