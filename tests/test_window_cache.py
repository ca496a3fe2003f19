"""Sliding-window models on llama.cpp (backends/llamacpp/window.py), on the factory's tiny Gemma 3 (a 16-token window on
every other layer): a prefix hit after an answer longer than the window, a prefix read back from disk after a restart,
requests sharing a document at once with aborts among them, and a hit whose window cells llama.cpp no longer holds
all give the cold run's greedy tokens, and the hits are real (served from the cache, counted as such)."""
from __future__ import annotations

import random

import pytest

L = pytest.importorskip("llama_cpp.llama_cpp")

from evenflow.backends.base import RunnerSettings, load_runner  # noqa: E402
from evenflow.backends.llamacpp.window import MAX_NEAR, MAX_SPREAD, window_points  # noqa: E402
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from evenflow.daemon.engine.disk_prefixes import prompt_keys  # noqa: E402
from evenflow.daemon.engine.kv_disk import DiskKVCache  # noqa: E402

BS = 4
WINDOW = 16  # the factory's gemma3 default (arch_options sliding_window)


def settings(layout: str) -> RunnerSettings:
    # f32 KV, flash attention off: logits do not depend on how a pass is batched
    return RunnerSettings(max_num_seqs=3, block_size=BS, context_length=192, max_num_batched_tokens=64,
                          num_kv_blocks=None if layout == "streams" else 160, dtype="float32",
                          flash_attention="off", kv_layout=layout, num_threads=2)


@pytest.fixture(scope="module", params=["streams", "unified"])
def runners(request, synthetic_model):
    path = str(synthetic_model("tiny", "gemma3", formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"])
    warm, solo = load_runner("llamacpp", path, settings(request.param)), load_runner("llamacpp", path,
                                                                                     settings(request.param))
    assert warm._window is not None and warm._window.n_swa == WINDOW
    yield warm, solo
    warm.close()
    solo.close()


def run(engine: Engine, prompts: list[list[int]], n: int | list[int] = 6, abort: set[int] = frozenset()) -> list:
    """Submit every prompt at once (greedy); abort those at the given indexes after the first step."""
    ns = n if isinstance(n, list) else [n] * len(prompts)
    streams = [engine.submit(p, SamplingParams(temperature=0, num_predict=k, ignore_eos=True), loop=None)
               for p, k in zip(prompts, ns)]
    engine.run_once()
    for i in abort:
        engine.abort(streams[i].seq_id)
    while engine.run_once():
        pass
    out = []
    for s in streams:
        deltas = list(s)
        out.append(None if deltas[-1].done_reason == "abort" else [t for d in deltas for t in d.token_ids])
    return out


def solo(runner, prompt: list[int], n: int) -> list[int]:
    return run(Engine(runner, EngineConfig(max_num_batched_tokens=24, prefix_caching=False)), [prompt], n)[0]


def words(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 1800) for _ in range(n)]


def test_window_points_sit_at_and_just_before_each_prompt_end_and_along_the_prefix():
    assert window_points([], 30, 4, 16) == [24, 18, 12, 6]  # spread: every 6 blocks (a window is 4)
    assert window_points([], 30, 4, 64) == [16]  # ... but never closer than a window (16 blocks)
    assert window_points([64], 30, 4, 64) == [16, 15, 14, 12, 8]  # a prompt end at block 16 of a 30-block chain
    assert window_points([64], 16, 4, 64) == [15, 14, 12, 8]  # the chain's own end is its state, not a point
    points = window_points([40, 200], 60, 4, 16)
    assert points[:2] == [50, 49] and points == sorted(points, reverse=True) and len(points) <= MAX_NEAR + MAX_SPREAD
    assert 10 in points and {12, 24, 36, 48} <= set(points)  # the older prompt end: its own block (MAX_NEAR)


def test_a_hit_after_an_answer_longer_than_the_window_is_the_cold_run(runners):
    warm, solo_runner = runners
    rng = random.Random(1)
    doc = words(rng, 70)
    first, second = doc + words(rng, 3), doc + words(rng, 5)
    engine = Engine(warm, EngineConfig(max_num_batched_tokens=24))
    run(engine, [first], 3 * WINDOW)  # the answer pushes the window far past the document
    before = engine.cache_hit_tokens
    assert run(engine, [second], 8) == [solo(solo_runner, second, 8)]
    assert engine.cache_hit_tokens - before == len(doc) // BS * BS  # the document came from the cache
    assert engine.blocks.rewind_tokens == 0


def test_a_hit_whose_window_cells_are_gone_is_cut_back_and_recomputed(runners):
    """What llama.cpp leaves when it reused a sequence's old window cells: the full-attention cells, and the window
    layers' cells of the last window only. A hit further back resumes from nothing and equals the cold run."""
    warm, solo_runner = runners
    rng = random.Random(2)
    doc = words(rng, 60)
    first, second = doc + words(rng, 30), doc + words(rng, 4)
    engine = Engine(warm, EngineConfig(max_num_batched_tokens=24))
    run(engine, [first], 2)
    seq = warm._cells.holder([engine.blocks.cached_block(k) for k in prompt_keys(doc + [0], BS)])
    assert seq is not None
    whole = warm._window.save(seq, 0)  # its full-attention cells and its last window
    L.llama_memory_seq_rm(warm._mem, seq, -1, -1)
    assert warm._window.load(seq, whole, 0)
    assert L.llama_memory_seq_pos_min(warm._mem, seq) > len(doc) - WINDOW
    assert run(engine, [second], 8) == [solo(solo_runner, second, 8)]
    assert engine.blocks.rewind_tokens == len(doc) // BS * BS  # counted as recomputed, not as lost
    assert engine.blocks.fallback_tokens == 0


def test_concurrent_requests_sharing_a_document_with_aborts_equal_their_solo_runs(runners):
    warm, solo_runner = runners
    rng = random.Random(3)
    doc = words(rng, 50)
    prompts = [doc[: k] + words(rng, rng.randrange(1, 6)) for k in (50, 50, 33, 50, 12, 47)]
    ns = [2 * WINDOW, 5, 9, 3 * WINDOW, 4, 7]
    engine = Engine(warm, EngineConfig(max_num_batched_tokens=24))
    run(engine, [doc + [5, 6]], 2 * WINDOW)  # cached first, its window long gone past the document
    got = run(engine, prompts, ns, abort={2})
    for i, (p, k) in enumerate(zip(prompts, ns)):
        assert got[i] == (None if i == 2 else solo(solo_runner, p, k)), i
    assert engine.cache_hit_tokens > 0
    assert engine.blocks.num_free == engine.blocks.num_blocks and not engine.scheduler.running


def test_a_document_read_back_after_a_restart_is_the_cold_run_and_a_real_hit(runners, tmp_path):
    warm, solo_runner = runners
    rng = random.Random(4)
    doc = words(rng, 80)
    asks = [doc + words(rng, 3), doc + words(rng, 6), doc[:41] + words(rng, 2)]
    disk = DiskKVCache(tmp_path, 1 << 30, min_tokens=32)
    first = Engine(warm, EngineConfig(max_num_batched_tokens=24), kv_disk=disk, model_id="m")
    run(first, [asks[0]], 3 * WINDOW)  # a long answer: the state at the chain's end holds its last window only
    first.shutdown()
    assert disk.flush(30)
    for ask in asks:
        again = Engine(warm, EngineConfig(max_num_batched_tokens=24), kv_disk=disk, model_id="m")  # memory is empty
        again.warm_disk_cache()
        assert run(again, [ask], 8) == [solo(solo_runner, ask, 8)]
        assert again.disk.restored_tokens > 0 and again.disk.failed == 0
        shared = len(ask) - 1 if ask[: len(doc)] == doc else 41
        hit = again.cache_hit_tokens
        if ask is asks[2]:  # parts from the document far before the saved prompt's end: resumes from a point before
            assert 0 < hit <= shared // BS * BS and again.blocks.rewind_tokens > 0
        else:  # the next question: resumes at the block where it parts from the saved one, nothing recomputed
            assert hit == len(doc) // BS * BS and again.blocks.rewind_tokens == 0
        again.shutdown()


def test_a_payload_that_is_not_a_window_prefix_is_refused(runners, tmp_path):
    warm, solo_runner = runners
    doc = words(random.Random(5), 40)
    disk = DiskKVCache(tmp_path, 1 << 30, min_tokens=16)
    first = Engine(warm, EngineConfig(max_num_batched_tokens=24), kv_disk=disk, model_id="m")
    run(first, [doc + [7]], 4)
    first.shutdown()
    assert disk.flush(30)
    # a payload that is not ours (an older evenflow's, say) behind a valid file header and checksum
    assert warm.import_prefix(list(range(8)), b"\0" * 64, 8) is False
    again = Engine(warm, EngineConfig(max_num_batched_tokens=24), kv_disk=disk, model_id="m")
    again.warm_disk_cache()
    assert run(again, [doc + [9, 9]], 5) == [solo(solo_runner, doc + [9, 9], 5)]


def test_a_restore_keeps_its_windows_as_the_budget_counts_them_and_each_serves_a_cold_equal_hit(runners, tmp_path):
    """Copying a restored payload's windows cost a restart's next question on Gemma 3 more than the rest of the
    restore: they stay views into the one payload read from disk (counted once) where they are most of it, else copies
    (checkpoints.kept), and later hits resuming from them give the cold run."""
    warm, solo_runner = runners
    rng = random.Random(6)
    doc = words(rng, 48)
    disk = DiskKVCache(tmp_path, 1 << 30, min_tokens=32)
    first = Engine(warm, EngineConfig(max_num_batched_tokens=24), kv_disk=disk, model_id="m")
    # an answer past the window: the saved state's own window does not reach back to the document's end
    run(first, [doc + words(rng, 3)], WINDOW + 8)
    first.shutdown()
    assert disk.flush(30)
    again = Engine(warm, EngineConfig(max_num_batched_tokens=24), kv_disk=disk, model_id="m")
    again.warm_disk_cache()
    ask = doc + words(rng, 5)
    entry, _ = disk.lookup(again.disk.ns, prompt_keys(ask, BS))
    assert run(again, [ask], 8) == [solo(solo_runner, ask, 8)]
    # landed where the question parts from the saved prompt: the document's last block, from disk, nothing rewound
    assert again.disk.restored_tokens == len(doc) // BS * BS == again.cache_hit_tokens
    assert again.blocks.rewind_tokens == 0 and again.disk.failed == 0
    points = warm._window._points
    held = [points.get(b) for b in list(points._data)]
    if 2 * sum(len(w) for w in held) >= entry.payload_len:  # views of the one payload, counted once
        assert all(isinstance(w, memoryview) for w in held) and len({id(w.obj) for w in held}) == 1
        assert points.bytes == entry.payload_len
    else:  # copies: a view would keep the rest of the payload (the attention state llama.cpp took) alive
        assert held and all(isinstance(w, bytes) for w in held) and points.bytes == sum(len(w) for w in held)
    loaded = warm._window.loaded
    for part in (41, 30, 23):  # questions parting from the document earlier: each resumes from a restored window
        # (a stream layout may read the file again: the stream that held the restore went to the question before)
        ask = doc[:part] + words(rng, 3)
        hit0 = again.cache_hit_tokens
        assert run(again, [ask], 6) == [solo(solo_runner, ask, 6)]
        assert 0 < again.cache_hit_tokens - hit0 <= part // BS * BS
    assert warm._window.loaded > loaded
    assert again.blocks.num_free == again.blocks.num_blocks
    again.shutdown()
