"""KV pool and slot planning (backends/common/memory.plan_kv) and the runners that use it."""
from __future__ import annotations

import importlib.util
import logging

import pytest

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.backends.common.kv_plan import AUTO_MAX_SEQS, AUTO_MIN_SEQS, plan_kv

BS, CTX, BB = 16, 1024, 1000  # block size, context window, bytes per block
WINDOW = CTX // BS  # blocks per full window


def plan(**kw):
    args = dict(requested_blocks=None, max_num_seqs=None, context_length=CTX, block_size=BS, block_bytes=BB,
                budget_bytes=10**12, dedicated_pool=False)
    return plan_kv(**{**args, **kw})


def test_explicit_slots_get_full_windows_capped_by_memory(caplog):
    assert plan(max_num_seqs=3) == (3 * WINDOW, 3)
    with caplog.at_level(logging.WARNING):
        assert plan(max_num_seqs=3, budget_bytes=100 * BB) == (100, 3)
    assert "capped by memory" in caplog.text


def test_auto_slots_in_host_memory_are_eight_windows():
    # host RAM and unified memory are shared with the desktop: the pool stays 8 windows however much is free
    assert plan() == (AUTO_MIN_SEQS * WINDOW, AUTO_MIN_SEQS) == (8 * WINDOW, 8)


def test_auto_slots_fill_a_dedicated_pool():
    assert plan(dedicated_pool=True, budget_bytes=20 * WINDOW * BB) == (20 * WINDOW, 20)
    assert plan(dedicated_pool=True, budget_bytes=20 * WINDOW * BB + 7 * BB) == (20 * WINDOW + 7, 20)
    assert plan(dedicated_pool=True) == (AUTO_MAX_SEQS * WINDOW, AUTO_MAX_SEQS)  # huge GPU: at most 256 windows


def test_auto_slots_are_at_least_eight_when_memory_is_short():
    # paged KV admits by blocks, so 8 short chats still run side by side in a pool of 3 windows
    assert plan(dedicated_pool=True, budget_bytes=3 * WINDOW * BB) == (3 * WINDOW, 8)
    assert plan(budget_bytes=3 * WINDOW * BB) == (3 * WINDOW, 8)


def test_requested_blocks_decide_the_auto_slots():
    assert plan(requested_blocks=40 * WINDOW) == (40 * WINDOW, 40)
    assert plan(requested_blocks=40 * WINDOW, max_num_seqs=5) == (40 * WINDOW, 5)
    assert plan(requested_blocks=2) == (2, 8)


@pytest.mark.parametrize("kw", [dict(requested_blocks=0), dict(max_num_seqs=0), dict(max_num_seqs=-2)])
def test_bad_values_are_rejected(kw):
    with pytest.raises(ValueError, match="must be a positive int"):
        plan(**kw)


RUNNERS = [
    pytest.param(("torch", "hf"), id="torch"),
    pytest.param(("llamacpp", "gguf"), id="llamacpp",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="llama-cpp-python not installed")),
    pytest.param(("mlx", "hf"), id="mlx",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")),
]


@pytest.mark.parametrize("backend", RUNNERS)
def test_runners_resolve_auto_slots(backend, synthetic_model):
    name, fmt = backend
    path = str(synthetic_model("tiny", formats=(fmt,))[fmt])
    cases = [(RunnerSettings(context_length=256), 8 * 256 // 16, 8),  # auto on a CPU: 8 full windows
             (RunnerSettings(context_length=256, num_kv_blocks=12 * 16), 12 * 16, 12),  # a pool of 12 windows
             (RunnerSettings(context_length=256, max_num_seqs=3), 3 * 256 // 16, 3)]
    for settings, blocks, seqs in cases:
        r = load_runner(name, path, settings)
        try:
            assert (r.num_kv_blocks, r.max_num_seqs) == (blocks, seqs)
        finally:
            r.close()
