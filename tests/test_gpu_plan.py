"""GPU memory planning as pure logic: layers that fit, the KV budget, the default window by VRAM, and the
llama.cpp placement built from a real GGUF's tensor table with made-up devices."""
from __future__ import annotations

import pytest

from evenflow.backends.base import RunnerSettings
from evenflow.backends.common.gpu_plan import (
    GiB, MiB, ModelFootprint, compute_buffer_bytes, default_context_length, plan_offload,
)

# an 8B-shaped Q4_K_M: 32 blocks of ~140 MiB, a ~400 MiB head; f16 KV of 8 KV heads x 128: 4 KiB/token/block
FP = ModelFootprint(tuple([140 * MiB] * 32), 400 * MiB, 4096.0)
WEIGHTS = 32 * 140 * MiB + 400 * MiB


def plan(free, layers=None, ctx=4096, host=8 * GiB):
    return plan_offload(FP, free_bytes=free, requested_layers=layers, min_kv_tokens=ctx, compute_bytes=300 * MiB,
                        host_kv_bytes=host, reserve_bytes=512 * MiB)


def test_default_context_by_total_vram_as_ollama_documents():
    assert default_context_length(None) == default_context_length(0) == 4096
    assert default_context_length(8 * GiB) == default_context_length(24 * GiB - 1) == 4096
    assert default_context_length(24 * GiB) == default_context_length(48 * GiB - 1) == 32768
    assert default_context_length(48 * GiB) == default_context_length(80 * GiB) == 262144


def test_footprint_counts_the_head_first_then_blocks_from_the_last():
    fp = ModelFootprint((1, 10, 100), 1000, 2.0)
    assert fp.all_layers == 4
    assert [fp.weights_on_device(k) for k in range(6)] == [0, 1000, 1100, 1110, 1111, 1111]
    assert [fp.blocks_on_device(k) for k in range(5)] == [0, 0, 1, 2, 3]


def test_a_model_that_fits_goes_whole_and_the_kv_takes_what_is_left():
    p = plan(24 * GiB)  # a 4090
    assert p.gpu_layers == 33 and p.dedicated_pool and p.warning is None
    room = (24 * GiB - 512 * MiB - 300 * MiB - WEIGHTS) * 0.9
    assert p.kv_budget_bytes == int(room / (4096 * 32) * 4096 * 32)
    assert p.weights_vram == WEIGHTS and p.vram_bytes(1000) == WEIGHTS + 1000 * 4096 * 32


def test_a_model_too_big_is_partly_offloaded_with_a_warning():
    p = plan(4 * GiB)
    assert 0 < p.gpu_layers < 33 and not p.dedicated_pool
    assert "layers offloaded" in p.warning and f"{p.gpu_layers} of 33" in p.warning
    usable = 4 * GiB - 512 * MiB - 300 * MiB
    need = lambda k: FP.weights_on_device(k) + 4096 * FP.blocks_on_device(k) * 4096  # noqa: E731
    assert need(p.gpu_layers) <= usable < need(p.gpu_layers + 1)  # the most that fit, not fewer
    # the pool is bounded by the device's room for its blocks and by host RAM for the others
    blocks_dev = FP.blocks_on_device(p.gpu_layers)
    tokens = p.kv_budget_bytes / (4096 * 32)
    assert tokens * 4096 * blocks_dev <= (usable - FP.weights_on_device(p.gpu_layers)) * 0.9 + 4096 * 32
    assert tokens * 4096 * (32 - blocks_dev) <= 8 * GiB + 4096 * 32


def test_a_longer_window_leaves_room_for_fewer_layers():
    assert plan(8 * GiB, ctx=65536).gpu_layers < plan(8 * GiB, ctx=4096).gpu_layers


def test_nothing_fits_means_the_cpu():
    p = plan(512 * MiB)
    assert p.gpu_layers == 0 and p.vram_bytes(4096) == 0 and p.weights_vram == 0
    assert p.kv_budget_bytes == int(8 * GiB / (4096 * 32) * 4096 * 32)


def test_num_gpu_as_in_ollama():
    assert plan(24 * GiB, layers=0).gpu_layers == 0
    assert plan(24 * GiB, layers=10).gpu_layers == 10 and plan(24 * GiB, layers=10).warning is None
    assert plan(24 * GiB, layers=999).gpu_layers == 33  # more than the model has: all of them
    assert plan(24 * GiB, layers=-1).gpu_layers == 33
    cut = plan(4 * GiB, layers=33)
    assert cut.gpu_layers < 33 and "num_gpu asked 33" in cut.warning  # never more than fit


def test_compute_buffer_without_flash_attention_holds_the_scores():
    kw = dict(n_ubatch=512, n_embd=4096, n_vocab=128256, n_ff=14336, n_head=32)
    fa = compute_buffer_bytes(attn_ctx=32768, flash_attention=True, **kw)
    no_fa = compute_buffer_bytes(attn_ctx=32768, flash_attention=False, **kw)
    assert fa == 4 * 512 * (4096 + 128256) + 64 * MiB
    assert no_fa - 64 * MiB == 4 * 512 * (4 * 4096 + 2 * 14336 + 32 * 32768) > fa


# ---- the llama.cpp placement from a real GGUF (no GPU needed: the devices are described, not opened) ----
llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def header(synthetic_model):
    from evenflow.backends.llamacpp.gguf_info import read_header

    return read_header(str(synthetic_model("tiny", "llama", formats=("gguf",))["gguf"]))


def test_footprint_from_the_tensor_table(header):
    from evenflow.backends.llamacpp.offload import footprint

    fp = footprint(header, kv_bytes_per_token=1000.0)
    blocks = {t.name: t.n_bytes for t in header.tensors}
    assert fp.n_layers == header.metadata["llama.block_count"]
    assert fp.layer_bytes[0] == sum(n for name, n in blocks.items() if name.startswith("blk.0."))
    head = blocks.get("output.weight", blocks["token_embd.weight"]) + blocks["output_norm.weight"]
    assert fp.output_bytes == head
    assert sum(fp.layer_bytes) + fp.output_bytes + blocks["token_embd.weight"] - (
        blocks["token_embd.weight"] if "output.weight" not in blocks else 0) == sum(blocks.values())
    assert fp.kv_bytes_per_token_layer == 1000.0 / fp.n_layers


def gpu(free, index=1, name="CUDA0"):
    from evenflow.backends.llamacpp.devices import Device

    return Device(index, name, "test GPU", "gpu", free, free, 0)


def test_placement_on_described_devices(header, monkeypatch):
    from evenflow.backends.llamacpp import offload

    monkeypatch.setattr(offload, "supports_gpu_offload", lambda: True)
    s = RunnerSettings(context_length=512, max_num_batched_tokens=64)
    p = offload.place(header, s, 2048.0, host_kv_bytes=GiB, devices=[gpu(8 * GiB)])
    assert p.gpu_layers == header.metadata["llama.block_count"] + 1 and p.dedicated_pool
    assert p.vram_bytes(100) == p.footprint.weights_on_device(p.gpu_layers) + 2048 * 100
    assert offload.place(header, RunnerSettings(num_gpu=0), 2048.0, GiB, devices=[gpu(8 * GiB)]).gpu_layers == 0
    assert offload.place(header, RunnerSettings(device="cpu"), 2048.0, GiB, devices=[gpu(8 * GiB)]).gpu_layers == 0
    assert offload.place(header, RunnerSettings(num_gpu=1), 2048.0, GiB, devices=[gpu(8 * GiB)]).gpu_layers == 1
    two = [gpu(8 * GiB), gpu(8 * GiB, 2, "CUDA1")]
    p = offload.place(header, RunnerSettings(main_gpu=1), 2048.0, GiB, devices=two)
    assert [d.name for d in p.devices] == ["CUDA1"]
    with pytest.raises(ValueError, match=r"main_gpu=2 but llama.cpp sees 2 GPU\(s\): 0=CUDA0, 1=CUDA1"):
        offload.place(header, RunnerSettings(main_gpu=2), 2048.0, GiB, devices=two)
    tiny = offload.place(header, s, 2048.0, GiB, devices=[gpu(1 << 20)])  # nothing fits: the CPU, said so
    assert tiny.gpu_layers == 0 and tiny.devices == [] and "0 of" in tiny.warning


def test_a_cpu_only_build_places_nothing(header):
    from evenflow.backends.llamacpp import offload
    from evenflow.backends.llamacpp.devices import supports_gpu_offload

    if supports_gpu_offload():
        pytest.skip("this llama.cpp build offloads")
    p = offload.place(header, RunnerSettings(num_gpu=99), 2048.0, GiB)
    assert p.gpu_layers == 0 and p.budget_bytes is None and p.vram_bytes(4096) == 0


def test_smaller_plans_after_an_allocation_failure(header, monkeypatch):
    from evenflow.backends.llamacpp import offload

    monkeypatch.setattr(offload, "supports_gpu_offload", lambda: True)
    p = offload.place(header, RunnerSettings(context_length=512), 2048.0, GiB, devices=[gpu(64 * GiB)])
    assert offload.out_of_memory("llama_model_load: unable to allocate CUDA0 buffer")
    assert not offload.out_of_memory("unknown model architecture: 'foo'")
    steps = []
    while p is not None:
        steps.append((p.gpu_layers, p.budget_bytes))
        p = offload.smaller(p, "m.gguf")
    layers = [s[0] for s in steps]
    assert layers == sorted(layers, reverse=True) and layers[-1] == 0 and len(steps) < 40
    kv = [b for n, b in steps if n == layers[0]]
    assert all(a > b for a, b in zip(kv, kv[1:]))  # first the KV pool shrinks, then the layers
