"""Engine behaviour on the toy backend: chunk invariance, preemption, aborts, errors, streaming text."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.daemon.engine import Engine, EngineConfig, PromptTooLong, SamplingParams
from toy_runner import EOS, ToyRunner

GREEDY = dict(temperature=0, num_predict=12)


def run_scenario(engine: Engine, arrivals: list[tuple[int, list[int], SamplingParams]]) -> list[tuple[list[int], str, str]]:
    """Submit each prompt at its step; drive the engine in this thread; return (tokens, text, reason) per request."""
    arrivals = sorted(enumerate(arrivals), key=lambda a: a[1][0])
    streams: dict[int, object] = {}
    step = 0
    while True:
        while arrivals and arrivals[0][1][0] <= step:
            i, (_, prompt, params) = arrivals.pop(0)
            streams[i] = engine.submit(prompt, params, loop=None)
        more = engine.run_once()
        step += 1
        if not arrivals and not more:
            break
        assert step < 20000
    out = []
    for i in sorted(streams):
        toks, text, reason = [], "", None
        for d in streams[i]:
            toks += d.token_ids
            text += d.text
            reason = d.done_reason
        out.append((toks, text, reason))
    return out


def prompts(seed: int, n: int, lo: int = 1, hi: int = 70) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), gaps=st.lists(st.integers(0, 8), min_size=6, max_size=6))
def test_chunk_invariance(seed, n, gaps):
    """Greedy outputs are identical for monolithic prefill and chunk sizes 1, 7, 16, 64 with concurrent decodes."""
    ps = prompts(seed, n)
    steps = [sum(gaps[: i + 1]) for i in range(n)]
    results = []
    for mode, chunk in [("monolithic", None), ("chunked", 1), ("chunked", 7), ("chunked", 16), ("chunked", 64)]:
        eng = Engine(ToyRunner(num_kv_blocks=512), EngineConfig(prefill_mode=mode, max_num_batched_tokens=70,
                                                                max_prefill_chunk=chunk))
        results.append(run_scenario(eng, [(s, p, SamplingParams(**GREEDY)) for s, p in zip(steps, ps)]))
        assert eng.blocks.num_free == eng.blocks.num_blocks
    assert all(r == results[0] for r in results[1:])


def test_preempted_sequences_recompute_to_the_same_output():
    ps = prompts(1, 8, 20, 40)
    arrivals = [(0, p, SamplingParams(temperature=0, num_predict=30)) for p in ps]
    roomy = Engine(ToyRunner(num_kv_blocks=400, max_num_seqs=8), EngineConfig(max_num_batched_tokens=32))
    tight = Engine(ToyRunner(num_kv_blocks=40, max_num_seqs=8), EngineConfig(max_num_batched_tokens=32))
    preemptions = []
    tight.subscribe(lambda e: preemptions.append(e.get("preempted", 0)) if e["type"] == "step" else None)
    assert run_scenario(roomy, arrivals) == run_scenario(tight, arrivals)
    assert sum(preemptions) > 0, "the tight KV pool should have forced preemptions"
    assert tight.blocks.num_free == tight.blocks.num_blocks


def test_seeded_sampling_is_independent_of_batch_mates():
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=1234, num_predict=20)
    alone = run_scenario(Engine(ToyRunner()), [(0, [1, 2, 3], p)])[0]
    mates = [(i, q, SamplingParams(temperature=0.7, seed=i, num_predict=15)) for i, q in enumerate(prompts(3, 3))]
    crowded = run_scenario(Engine(ToyRunner()), mates + [(2, [1, 2, 3], p)])[-1]
    assert alone == crowded
    other_seed = run_scenario(Engine(ToyRunner()), [(0, [1, 2, 3], SamplingParams(temperature=1.0, top_k=0, seed=99, num_predict=20))])[0]
    assert other_seed[0] != alone[0]


def test_abort_frees_kv_and_slot():
    runner = ToyRunner(num_kv_blocks=64)
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=16))
    s1 = eng.submit(list(range(40)), SamplingParams(temperature=0, num_predict=-1), loop=None)
    s2 = eng.submit(list(range(10)), SamplingParams(temperature=0, num_predict=5), loop=None)
    for _ in range(6):
        eng.run_once()
    assert eng.blocks.num_used > 0
    eng.abort(s1.seq_id)
    while eng.run_once():
        pass
    assert [d.done_reason for d in s1][-1] == "abort"
    assert [d.done_reason for d in s2][-1] in ("length", "stop")
    assert eng.blocks.num_free == eng.blocks.num_blocks
    assert len(runner.freed) == 2  # the runner was told to forget both slots


def test_shutdown_from_two_threads_at_once():
    # The daemon's drain (abort_all after the grace period) and its lifespan shutdown (freeing the models) both shut
    # an engine down, each in a worker thread: one used to find the loop thread gone between its join and its check
    # (AttributeError in the shutdown log, CI). Both must return once the engine is down, with nothing left running.
    import threading
    import time

    class SlowStep(ToyRunner):
        def step(self, batch):
            time.sleep(0.01)  # a step takes a while: the two shutdowns overlap
            return super().step(batch)

    eng = Engine(SlowStep(eos_bias=-100), EngineConfig())
    eng.start()
    stream = eng.submit(list(range(1, 20)), SamplingParams(temperature=0, num_predict=100000), loop=None)
    first = next(iter(stream))  # decoding
    assert first.done_reason is None
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def stop() -> None:
        go.wait()
        try:
            eng.shutdown()
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=stop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert [d.done_reason for d in stream][-1] == "abort"
    assert eng.stats().running == 0 and eng.stats().kv_blocks_used == 0


def test_stats_from_other_threads_never_show_a_half_released_sequence():
    # llama.cpp's free (llama_memory_seq_rm) releases the GIL: a live read of the scheduler from an HTTP thread
    # could see the KV already freed but the sequence still running. stats() must be one consistent picture.
    import threading
    import time

    class SlowFree(ToyRunner):
        def free(self, slot: int) -> None:
            time.sleep(0.05)
            super().free(slot)

    eng = Engine(SlowFree(eos_bias=-100), EngineConfig())
    eng.start()
    torn: list = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            s = eng.stats()
            if s.running and not s.kv_blocks_used:
                torn.append(s)

    t = threading.Thread(target=poll)
    t.start()
    try:
        for _ in range(5):
            s = eng.submit(list(range(1, 20)), SamplingParams(temperature=0, num_predict=3), loop=None)
            assert [d.done_reason for d in s][-1] == "length"
    finally:
        done.set()
        t.join()
        eng.shutdown()
    assert not torn
    assert eng.stats().running == 0 and eng.stats().kv_blocks_used == 0


def test_failing_step_fails_only_its_sequences(caplog):
    runner = ToyRunner(fail_on_token=255)
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=64))
    good = eng.submit([1, 2, 3], SamplingParams(temperature=0, num_predict=8), loop=None)
    while eng.run_once():  # finish the good one alone first
        pass
    bad = eng.submit([255, 4], SamplingParams(temperature=0, num_predict=8), loop=None)
    while eng.run_once():
        pass
    bad_final = list(bad)[-1]
    assert bad_final.done_reason == "error" and "forward pass failed" in bad_final.error
    # the cause is in the log at WARNING, with the request's id (the client only sees "generation failed")
    assert any(r.levelname == "WARNING" and f"request {bad.seq_id} " in r.getMessage()
               and "forward pass failed" in r.getMessage() for r in caplog.records)
    assert list(good)[-1].done_reason in ("length", "stop")
    again = eng.submit([1, 2, 3], SamplingParams(temperature=0, num_predict=8), loop=None)
    while eng.run_once():
        pass
    assert list(again)[-1].done_reason in ("length", "stop")
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_prompt_too_long_and_bad_tokens_are_rejected():
    eng = Engine(ToyRunner(context_length=32), EngineConfig())
    with pytest.raises(PromptTooLong, match="context window is 32"):
        eng.submit(list(range(32)), SamplingParams(), loop=None)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.submit([1, 9999], SamplingParams(), loop=None)
    with pytest.raises(ValueError, match="empty"):
        eng.submit([], SamplingParams(), loop=None)


def test_context_full_ends_with_length():
    eng = Engine(ToyRunner(context_length=24, eos_bias=-100), EngineConfig())
    toks, _, reason = run_scenario(eng, [(0, list(range(20)), SamplingParams(temperature=0, num_predict=-1))])[0]
    assert reason == "length" and len(toks) == 4


def test_eos_ends_with_stop_and_is_not_emitted():
    eng = Engine(ToyRunner(eos_bias=+100), EngineConfig())
    toks, text, reason = run_scenario(eng, [(0, [1, 2], SamplingParams(temperature=0))])[0]
    assert reason == "stop" and toks == [] and text == "" and EOS not in toks


def test_threaded_engine_streams_async():
    import asyncio

    eng = Engine(ToyRunner(eos_bias=-100), EngineConfig())
    eng.start()
    try:
        async def go():
            streams = [eng.submit(p, SamplingParams(temperature=0, num_predict=10)) for p in prompts(5, 4)]
            outs = []
            for s in streams:
                toks = []
                async for d in s:
                    toks += d.token_ids
                    final = d
                outs.append(toks)
                assert final.done and final.metrics.eval_count == 10 and final.metrics.ttft_ns > 0
                assert len(final.metrics.itl_ns) == 9
            return outs

        outs = asyncio.run(go())
        assert all(len(o) == 10 for o in outs)
        assert eng.idle
    finally:
        eng.shutdown()


@pytest.mark.parametrize("shared", [False, True])
def test_step_events_carry_the_tokens_a_shared_cache_holds(shared):
    """/api/events steps report `held` (what every query attends on llama.cpp's unified cache) for shared-KV runners
    only: before each step, the running sequences' computed tokens plus cached prefixes nobody runs."""
    runner = ToyRunner()
    runner.shared_kv = shared
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=16))
    steps: list[dict] = []
    eng.subscribe(lambda e: steps.append(e) if e["type"] == "step" else None)
    list(run_scenario(eng, [(0, list(range(1, 41)), SamplingParams(temperature=0, num_predict=5))]))
    held = [s["held"] for s in steps]
    if not shared:
        assert held == [None] * len(steps)
        return
    # a 40-token prompt in 16-token chunks, then decodes: each step holds what the steps before computed
    computed = [s["prefill_tokens"] + s["decodes"] for s in steps]
    assert held[:4] == [0, 16, 32, 40] and computed[:3] == [16, 16, 8]
    assert all(held[i + 1] == held[i] + computed[i] for i in range(len(steps) - 2))
