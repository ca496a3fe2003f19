"""Engine + real backends on a tiny synthetic model: chunk invariance with concurrent decodes
(hypothesis over arrival orders and prompt lengths), and preemption recompute, per backend."""
from __future__ import annotations

import importlib.util
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams

BACKENDS = [
    pytest.param(("torch", "hf"), id="torch"),
    pytest.param(("llamacpp", "gguf"), id="llamacpp",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="llama-cpp-python not installed")),
    pytest.param(("mlx", "hf"), id="mlx",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")),
]
MODES = [("monolithic", None), ("chunked", 1), ("chunked", 7), ("chunked", 16), ("chunked", 64)]


@pytest.fixture(scope="module", params=BACKENDS)
def runner(request, synthetic_model):
    # flash attention off: llama.cpp's CPU kernel rounds Q.K through f16, which makes logits depend on how
    # many queries share a pass (~1e-3) and can flip a near-tie argmax; the property tested here is ours.
    backend, fmt = request.param
    path = synthetic_model("tiny", "llama", formats=(fmt,), gguf_dtype="f32", qk_std=0.3)[fmt]
    r = load_runner(backend, str(path), RunnerSettings(max_num_seqs=4, block_size=16, num_kv_blocks=64,
                                                        context_length=512, max_num_batched_tokens=256,
                                                        dtype="float32", flash_attention="off"))
    yield r
    r.close()


def drive(engine: Engine, arrivals: list[tuple[int, list[int]]], num_predict: int) -> list[list[int]]:
    pending = sorted(enumerate(arrivals), key=lambda a: a[1][0])
    streams = {}
    step = 0
    while True:
        while pending and pending[0][1][0] <= step:
            i, (_, prompt) = pending.pop(0)
            streams[i] = engine.submit(prompt, SamplingParams(temperature=0, num_predict=num_predict), loop=None)
        more = engine.run_once()
        step += 1
        if not pending and not more:
            break
    return [[t for d in streams[i] for t in d.token_ids] for i in sorted(streams)]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), lens=st.lists(st.integers(1, 90), min_size=2, max_size=4),
       gaps=st.lists(st.integers(0, 6), min_size=4, max_size=4))
def test_greedy_outputs_identical_across_chunk_sizes(runner, seed, lens, gaps):
    rng = random.Random(seed)
    vocab = runner.info.vocab_size
    arrivals = [(sum(gaps[: i + 1]), [rng.randrange(10, vocab - 64) for _ in range(n)]) for i, n in enumerate(lens)]
    outs = []
    for mode, chunk in MODES:
        eng = Engine(runner, EngineConfig(prefill_mode=mode, max_num_batched_tokens=80, max_prefill_chunk=chunk))
        outs.append(drive(eng, arrivals, num_predict=8))
        assert eng.blocks.num_free == eng.blocks.num_blocks
    assert all(len(o) == 8 or len(o) < 8 for out in outs for o in out)
    for (mode, chunk), out in zip(MODES[1:], outs[1:]):
        assert out == outs[0], f"{mode} chunk={chunk} differs from monolithic"


def test_preemption_recompute_matches_undisturbed(runner):
    rng = random.Random(7)
    vocab = runner.info.vocab_size
    prompts = [(0, [rng.randrange(10, vocab - 64) for _ in range(40)]) for _ in range(4)]
    roomy = drive(Engine(runner, EngineConfig(max_num_batched_tokens=64)), prompts, num_predict=24)
    tight = Engine(runner, EngineConfig(max_num_batched_tokens=64))
    # only 12 blocks of 16 tokens for 4 sequences growing to 64 tokens each: forces preemptions
    from evenflow.daemon.engine.blocks import BlockManager

    tight.blocks = tight.scheduler.blocks = BlockManager(12, runner.block_size)
    preempted = []
    tight.subscribe(lambda e: preempted.append(e["preempted"]) if e["type"] == "step" else None)
    assert drive(tight, prompts, num_predict=24) == roomy
    assert sum(preempted) > 0


def ask(engine: Engine, prompt: list[int], num_predict: int) -> tuple[list[int], int]:
    """Greedy tokens and the prompt tokens served from the prefix cache."""
    stream = engine.submit(prompt, SamplingParams(temperature=0, num_predict=num_predict), loop=None)
    while engine.run_once():
        pass
    deltas = list(stream)
    return [t for d in deltas for t in d.token_ids], deltas[-1].metrics.cached_tokens


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), shared=st.sampled_from([15, 16, 17, 31, 32, 33, 48, 70]),
       tail=st.integers(1, 20), chunk=st.sampled_from([None, 16, 7]))
def test_greedy_output_identical_with_and_without_a_prefix_hit(runner, seed, shared, tail, chunk):
    """Same document, new question: the hit is every full 16-token block of the shared part, output unchanged."""
    rng = random.Random(seed)
    vocab = runner.info.vocab_size
    doc = [rng.randrange(10, vocab - 64) for _ in range(shared)]
    first = doc + [rng.randrange(10, vocab - 64) for _ in range(5)]
    second = doc + [rng.randrange(10, vocab - 64) for _ in range(tail)]
    cfg = dict(max_num_batched_tokens=64, max_prefill_chunk=chunk)
    warm = Engine(runner, EngineConfig(**cfg))
    ask(warm, first, 4)
    warm_out, hit = ask(warm, second, 8)
    assert hit == (shared // 16) * 16 and warm.stats().cache_hit_tokens == hit
    cold_out, cold_hit = ask(Engine(runner, EngineConfig(prefix_caching=False, **cfg)), second, 8)
    assert cold_hit == 0 and warm_out == cold_out


def test_next_chat_turn_reuses_prompt_and_answer(runner):
    """A chat resends prompt + answer + a follow-up: both the prompt and the answer's full blocks are hits."""
    rng = random.Random(3)
    vocab = runner.info.vocab_size
    prompt = [rng.randrange(10, vocab - 64) for _ in range(40)]
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=64))
    answer, _ = ask(eng, prompt, 30)
    turn = prompt + answer + [rng.randrange(10, vocab - 64) for _ in range(6)]
    out, hit = ask(eng, turn, 6)
    assert hit == ((len(prompt) + len(answer) - 1) // 16) * 16 > len(prompt)
    assert out == ask(Engine(runner, EngineConfig(prefix_caching=False, max_num_batched_tokens=64)), turn, 6)[0]
