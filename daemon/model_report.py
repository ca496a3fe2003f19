"""What /api/ps and `evenflow ps` say about a loaded model's memory: its GPU share and its KV pool."""
from __future__ import annotations

from .model_types import LoadedModel


def kv_pool(model: LoadedModel) -> dict[str, int]:
    """The model's KV pool as /api/ps reports it (evenflow's own field): its tokens, those running sequences hold,
    those cached prefixes keep (evicted before anyone waits), the largest num_ctx served without a reload, and the
    largest context a new request gets now without waiting for a slot or KV (0 when every slot is taken)."""
    st, bs, slots = model.engine.stats(), model.engine.block_size, model.engine.scheduler.slots.size
    free = (st.kv_blocks_total - st.kv_blocks_used) * bs
    return {"tokens": st.kv_blocks_total * bs, "held": st.kv_blocks_used * bs,
            "cached": st.kv_blocks_cached_free * bs, "slots": slots, "running": st.running,
            "max_context": model.max_context,
            "available": min(model.max_context, free) if st.running < slots else 0}


def vram_size(model: LoadedModel) -> int:
    """Bytes of the model in GPU memory (/api/ps size_vram): the runner's own count where it keeps one (llama.cpp:
    offloaded weights + their KV), else all of it on a CUDA or Metal device, else 0."""
    vram = model.runner.vram_bytes
    if vram is None:
        return model.size if str(model.runner.device).startswith(("cuda", "mps", "gpu")) else 0
    return min(int(vram), model.size)
