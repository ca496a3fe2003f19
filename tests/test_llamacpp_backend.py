"""llama.cpp backend: one llama_decode per mixed batch (decodes + prompt chunks), slots, tokenizer, errors."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from evenflow.backends.base import Batch, ModelLoadError, Runner, RunnerSettings, Tokenizer  # noqa: E402
from evenflow.backends.llamacpp import amx  # noqa: E402
from evenflow.backends.llamacpp.runner import LlamaCppRunner, load  # noqa: E402
from evenflow.backends.llamacpp.tokenizer import open_vocab  # noqa: E402
from evenflow.backends.synthetic import cached_model, make_spec  # noqa: E402

BS = 16
PROMPTS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\nclass Config:\n    \"\"\"Settings.\"\"\"\n",
    "for i in range(10):\n    print(i * i)\n" * 6,  # the long one: ~100 tokens, chunked
    "try:\n    x = open(path)\nexcept OSError:\n    pass\n",
]


@pytest.fixture(scope="module")
def tiny_gguf() -> Path:
    return cached_model(make_spec("tiny", architecture="llama"), formats=("gguf",), gguf_dtype="f32")["gguf"]


def make_runner(path: Path, seqs: int = 4, blocks: int = 128, batch_tokens: int = 256,
                dtype: str = "auto", context_length: int | None = None) -> LlamaCppRunner:
    return load(str(path), RunnerSettings(max_num_seqs=seqs, block_size=BS, num_kv_blocks=blocks,
                                          max_num_batched_tokens=batch_tokens, num_threads=2, dtype=dtype,
                                          context_length=context_length))


@pytest.fixture(scope="module", params=["unified", "streams"])
def runner(tiny_gguf, request):
    with pytest.MonkeyPatch.context() as mp:  # streams: 4 windows of 512 in the 2048-token pool
        mp.setenv("EVENFLOW_LLAMACPP_KV", request.param)
        r = make_runner(tiny_gguf, context_length=512 if request.param == "streams" else None)
    assert r.kv_layout == request.param and r.shared_kv == (request.param == "unified")
    yield r
    r.close()


def alone_logits(r: LlamaCppRunner, slot: int, chunks: list[list[int]]) -> np.ndarray:
    """Logits of the last token when the sequence runs by itself, in the given chunks (one step each)."""
    pos, out = 0, None
    for toks in chunks:
        out = r.step(Batch.from_spans([(slot, toks, pos, [], True)], BS))
        pos += len(toks)
    r.free(slot)
    return out[0]


def test_mixed_batch_logits_equal_each_sequence_alone(runner):
    tok = runner.tokenizer
    seqs = [tok.encode(p) for p in PROMPTS]
    long_seq = seqs[2][:48]  # 16 cached + a 32-token chunk this step
    # three sequences with cached prompts, then one step: 3 decodes + a 32-token chunk of the 4th
    for slot in range(3):
        runner.step(Batch.from_spans([(slot, seqs[slot], 0, [], False)], BS))
    runner.step(Batch.from_spans([(3, long_seq[:16], 0, [], False)], BS))
    nxt = [101, 202, 303]
    mixed = runner.step(Batch.from_spans(
        [(s, [nxt[s]], len(seqs[s]), [], True) for s in range(3)] + [(3, long_seq[16:48], 16, [], True)], BS))
    assert mixed.shape == (4, runner.vocab_size) and mixed.dtype == np.float32
    for s in range(4):
        runner.free(s)
    # each sequence alone, same steps of its own: whatever shares the batch must not change its logits
    alone = [alone_logits(runner, s, [seqs[s], [nxt[s]]]) for s in range(3)]
    alone.append(alone_logits(runner, 3, [long_seq[:16], long_seq[16:48]]))
    for s in range(4):
        assert np.max(np.abs(mixed[s] - alone[s])) <= 1e-4, f"sequence {s} differs from running alone"
    assert not np.allclose(alone[0], alone[1])  # the rows really are different sequences
    # and against one monolithic pass: llama.cpp's flash-attention kernel for many queries rounds
    # through f16 differently from the single-query one, hence the looser bound
    mono = [alone_logits(runner, s, [seqs[s] + [nxt[s]]]) for s in range(3)] + [alone_logits(runner, 3, [long_seq])]
    for s in range(4):
        assert np.max(np.abs(mixed[s] - mono[s])) <= 2e-3, f"sequence {s} differs from a monolithic pass"


def run_local_loop(r: LlamaCppRunner, prompts: list[list[int]], n_new: int, chunk: int | None,
                   starts: list[int]) -> list[list[int]]:
    """A tiny scheduler: sequence i arrives at step starts[i]; decodes ride along with prompt chunks."""
    state = [dict(slot=i, computed=0, out=[]) for i in range(len(prompts))]
    step, done = 0, set()
    while len(done) < len(prompts):
        spans, owners = [], []
        for i, st in enumerate(state):
            if i in done or starts[i] > step:
                continue
            p = prompts[i]
            if st["computed"] < len(p):
                n = len(p) - st["computed"] if chunk is None else min(chunk, len(p) - st["computed"])
                toks, start = p[st["computed"]:st["computed"] + n], st["computed"]
                st["computed"] += n
                need = st["computed"] == len(p)
            else:
                toks, start, need = [st["out"][-1]], len(p) + len(st["out"]) - 1, True
            spans.append((st["slot"], toks, start, [], need))
            owners.append(i if need else None)
        if spans:
            logits = r.step(Batch.from_spans(spans, BS))
            for row, i in enumerate([o for o in owners if o is not None]):
                state[i]["out"].append(int(np.argmax(logits[row])))
                if len(state[i]["out"]) == n_new:
                    done.add(i)
                    r.free(state[i]["slot"])
        step += 1
    return [st["out"] for st in state]


def test_greedy_same_for_every_chunk_size_and_high_level_llama(runner, tiny_gguf, monkeypatch):
    prompts = [runner.tokenizer.encode(p) for p in PROMPTS]
    assert len(prompts[2]) > 64  # chunk 64 really splits it
    starts = [0, 1, 2, 3]
    n_new = 10
    results = {c: run_local_loop(runner, prompts, n_new, c, starts) for c in (None, 1, 16, 64)}
    for c in (1, 16, 64):
        assert results[c] == results[None], f"chunk size {c} changed the greedy output"
    assert all(runner.cached_tokens(s) == 0 for s in range(runner.max_num_seqs))

    import llama_cpp
    import llama_cpp.llama_cpp as L

    default_params = L.llama_model_default_params

    def params_like_runner():  # Llama() has no use_extra_bufts argument: give it the runner's setting
        p = default_params()
        p.use_extra_bufts = runner.extra_bufts
        return p

    monkeypatch.setattr(L, "llama_model_default_params", params_like_runner)
    llm = llama_cpp.Llama(model_path=str(tiny_gguf), n_ctx=512, n_batch=256, n_threads=2, n_threads_batch=2,
                          flash_attn=True, verbose=False)
    try:
        for i, p in enumerate(prompts):
            gen = llm.generate(p, top_k=1, temp=0.0, reset=True)
            ref = [next(gen) for _ in range(n_new)]
            gen.close()
            assert results[None][i] == ref, f"prompt {i}: ours {results[None][i]} vs Llama {ref}"
    finally:
        llm.close()


def fixtures_dir() -> Path:
    env = os.environ.get("EVENFLOW_FIXTURES")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"


def test_tokenizer_contract_spells_bos_and_eos_for_every_vocab():
    """Tokenizer.eos_id and id_to_piece (a template's bos_token/eos_token text): in every fixture vocab the piece of
    BOS and EOS is their spelling, which tokenizes back to that one id; out-of-range ids have no piece."""
    vocabs = sorted((fixtures_dir() / "vocab").glob("ggml-vocab-*.gguf"))
    if not vocabs:
        pytest.skip(f"tokenizer fixtures not found under {fixtures_dir()} (set EVENFLOW_FIXTURES)")
    spelled = 0
    for path in vocabs:
        tok = open_vocab(str(path))
        try:
            assert isinstance(tok, Tokenizer), path.name
            assert tok.id_to_piece(-1) is None and tok.id_to_piece(tok.vocab_size) is None
            if tok.eos_id is not None:
                assert tok.eos_id in tok.eos_ids, path.name  # EOS ends generation
            for tid in (tok.bos_id, tok.eos_id):
                if tid is None:
                    continue
                piece = tok.id_to_piece(tid)
                assert piece, (path.name, tid)
                assert tok.encode(piece, add_special=False, parse_special=True) == [tid], (path.name, piece)
                spelled += 1
        finally:
            tok.close()
    assert spelled >= len(vocabs)  # every vocab spelt one of them at least


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe", "qwen2"])
def test_tokenizer_reproduces_llama_cpp_vectors(name):
    vocab = fixtures_dir() / "vocab" / f"ggml-vocab-{name}.gguf"
    if not vocab.is_file():
        pytest.skip(f"tokenizer fixtures not found at {vocab} (set EVENFLOW_FIXTURES to the shared fixtures dir)")
    texts = vocab.with_name(vocab.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = vocab.with_name(vocab.name + ".out").read_text(encoding="utf-8").split("\n")
    tok = open_vocab(str(vocab))
    try:
        assert len(texts) >= 40
        for text, line in zip(texts, expected):
            # the .out vectors are test-tokenizer's output: no BOS, special text not parsed
            assert tok.encode(text, add_special=False, parse_special=False) == [int(x) for x in line.split()], text
            if name != "llama-spm":  # byte-level BPE round-trips exactly; SPM adds a leading space
                assert tok.decode(tok.encode(text, add_special=False)) == text
        with_bos = tok.encode("Hello", add_special=True)
        assert (with_bos[0] == tok.bos_id) == tok.add_bos
        if name == "qwen2":
            assert {151643, 151645} <= tok.eos_ids  # <|endoftext|> and <|im_end|>
            assert tok.encode("<|im_end|>") == [151645] and tok.token_bytes(151645) == b""
    finally:
        tok.close()


def test_200_sequences_through_8_slots_leave_kv_empty(tiny_gguf):
    r = make_runner(tiny_gguf, seqs=8, blocks=16, batch_tokens=256)
    try:
        assert r.num_kv_blocks * BS == r.n_ctx <= 512
        rng = np.random.default_rng(1)
        base = r.tokenizer.encode("x = 1\ny = 2\nz = x + y\nprint(z)\n" * 4)
        # varied lengths fragment the cache; admission by block accounting like the scheduler's
        prompts = [base[: int(rng.integers(8, 40))] for _ in range(200)]
        n_new = [int(rng.integers(2, 10)) for _ in range(200)]
        blocks = [-(-(len(p) + n) // BS) for p, n in zip(prompts, n_new)]
        waiting, running, finished, peak = list(range(200)), {}, 0, 0
        while waiting or running:
            while waiting and len(running) < 8 and sum(blocks[i] for i in running) + blocks[waiting[0]] <= r.num_kv_blocks:
                slot = next(s for s in range(8) if s not in {v["slot"] for v in running.values()})
                running[waiting.pop(0)] = dict(slot=slot, out=[])
            peak = max(peak, sum(len(prompts[i]) + n_new[i] for i in running))
            spans = []
            for i, st in running.items():
                if not st["out"]:
                    spans.append((st["slot"], prompts[i], 0, [], True))
                else:
                    spans.append((st["slot"], [st["out"][-1]], len(prompts[i]) + len(st["out"]) - 1, [], True))
            logits = r.step(Batch.from_spans(spans, BS))
            for row, i in enumerate(list(running)):
                running[i]["out"].append(int(np.argmax(logits[row])))
                if len(running[i]["out"]) == n_new[i]:
                    r.free(running.pop(i)["slot"])
                    finished += 1
        assert finished == 200 and peak > r.n_ctx // 2  # the cache was really reused, not just big
        assert [r.cached_tokens(s) for s in range(8)] == [0] * 8
    finally:
        r.close()


def test_streams_layout_chosen_when_every_slot_has_a_window_and_refused_when_not(tiny_gguf, monkeypatch):
    r = make_runner(tiny_gguf, seqs=4, blocks=128, context_length=512)  # auto: 4 x 512 fits the pool
    try:
        assert r.kv_layout == "streams" and not r.shared_kv and r.n_ctx == 2048
    finally:
        r.close()
    r = make_runner(tiny_gguf, seqs=4, blocks=128, context_length=1024)  # auto: it does not -> unified
    try:
        assert r.kv_layout == "unified" and r.shared_kv
    finally:
        r.close()
    monkeypatch.setenv("EVENFLOW_LLAMACPP_KV", "streams")
    with pytest.raises(ValueError, match="less than the 1024-token window"):
        make_runner(tiny_gguf, seqs=4, blocks=128, context_length=1024)
    monkeypatch.setenv("EVENFLOW_LLAMACPP_KV", "sideways")
    with pytest.raises(ValueError, match="EVENFLOW_LLAMACPP_KV='sideways' is not one of auto, streams, unified"):
        make_runner(tiny_gguf)


def test_a_full_stream_raises_clear_error_and_the_others_go_on(tiny_gguf, monkeypatch):
    monkeypatch.setenv("EVENFLOW_LLAMACPP_KV", "streams")
    r = make_runner(tiny_gguf, seqs=2, blocks=32, context_length=256)
    try:
        toks = list(range(100, 100 + 250))
        r.step(Batch.from_spans([(0, toks, 0, [], True)], BS))
        with pytest.raises(RuntimeError, match="no KV slot"):
            r.step(Batch.from_spans([(0, toks[:10], 250, [], True)], BS))  # past the slot's own window
        r.free(0)
        assert r.step(Batch.from_spans([(1, toks, 0, [], True)], BS)).shape == (1, r.vocab_size)
    finally:
        r.close()


def test_full_kv_cache_raises_clear_error(tiny_gguf):
    r = make_runner(tiny_gguf, seqs=2, blocks=16, batch_tokens=256)
    try:
        toks = list(range(100, 100 + r.n_ctx - 40))
        r.step(Batch.from_spans([(0, toks, 0, [], True)], BS))
        with pytest.raises(RuntimeError, match="no KV slot"):
            r.step(Batch.from_spans([(1, toks[:64], 0, [], True)], BS))
        r.free(0)  # the runner is still usable afterwards
        assert r.step(Batch.from_spans([(1, toks[:64], 0, [], True)], BS)).shape == (1, r.vocab_size)
    finally:
        r.close()


def test_embed_is_causal_and_leaves_generation_kv_alone(runner):
    ids = runner.tokenizer.encode(PROMPTS[1])
    runner.step(Batch.from_spans([(0, ids, 0, [], False)], BS))
    full, prefix = runner.embed(ids), runner.embed(ids[:5])
    assert full.shape == (len(ids), runner.info.embedding_length) and full.dtype == np.float32
    np.testing.assert_allclose(full[:5], prefix, atol=1e-4)
    assert runner.cached_tokens(0) == len(ids)
    runner.free(0)


def test_model_info_and_metadata(runner):
    assert isinstance(runner, Runner) and isinstance(runner.tokenizer, Tokenizer)
    assert runner.backend == "llamacpp" and runner.num_kv_blocks * BS == runner.n_ctx
    info = runner.info
    assert (info.architecture, info.file_type, info.embedding_length, info.block_count) == ("llama", "F32", 64, 2)
    assert (info.head_count, info.head_count_kv, info.vocab_size) == (4, 2, 2048)
    assert info.metadata["general.architecture"] == "llama" and "tokenizer.ggml.tokens" in info.metadata
    assert info.parameter_count == info.metadata["evenflow.parameter_count"]


def test_corrupt_and_truncated_gguf_raise_model_load_error(tiny_gguf, tmp_path):
    bad = tmp_path / "bad-magic.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ModelLoadError, match="bad-magic.gguf.*magic"):
        make_runner(bad)
    cut = tmp_path / "truncated.gguf"
    data = Path(tiny_gguf).read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated.gguf.*truncated"):
        make_runner(cut)
    header_cut = tmp_path / "header-cut.gguf"
    header_cut.write_bytes(data[:300])
    with pytest.raises(ModelLoadError, match="header-cut.gguf"):
        make_runner(header_cut)
    with pytest.raises(ModelLoadError, match="missing.gguf"):
        make_runner(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError, match="directory"):
        make_runner(tmp_path)
    # a well-formed GGUF that llama.cpp itself rejects: its reason reaches the message
    from gguf import GGUFWriter

    alien = tmp_path / "alien.gguf"
    w = GGUFWriter(str(alien), "no-such-arch")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ModelLoadError, match="alien.gguf.*no-such-arch"):
        make_runner(alien)


def test_extra_bufts_env_override_and_cached_verdict(monkeypatch, tmp_path):
    monkeypatch.setenv(amx.ENV_VAR, "off")
    assert amx.extra_bufts_enabled() is False
    monkeypatch.setenv(amx.ENV_VAR, "on")
    assert amx.extra_bufts_enabled() is True
    monkeypatch.setenv(amx.ENV_VAR, "sometimes")
    with pytest.raises(ValueError, match="sometimes"):
        amx.extra_bufts_enabled()
    # auto: no AMX, no repacking (it slowed prompts down on an AVX2 EPYC); with AMX, the probe's verdict
    monkeypatch.setenv(amx.ENV_VAR, "auto")
    monkeypatch.setattr(amx, "_decided", None)
    monkeypatch.setattr(amx, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(amx, "_cached_or_probe", lambda: pytest.fail("no probe without AMX"))
    assert amx.extra_bufts_enabled() is False
    monkeypatch.setattr(amx, "_decided", None)
    monkeypatch.setattr(amx, "cpu_model", lambda: "Intel(R) Xeon(R) Platinum amx_bf16 amx_int8 amx_tile")
    monkeypatch.setattr(amx, "_cached_or_probe", lambda: True)
    assert amx.extra_bufts_enabled() is True
    monkeypatch.undo()
    monkeypatch.setattr(amx, "_decided", None)
    # the verdict is cached per CPU model: a cached entry is used as is, without a new probe
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = amx._cache_file()
    assert str(cache).startswith(str(tmp_path))
    verdict = amx._cached_or_probe()  # runs the subprocess probe once; the daemon survives a crash in it
    stored = json.loads(cache.read_text())
    assert [v["safe"] for v in stored.values()] == [verdict] and amx.cpu_model() in str(stored)
    stored[amx._cache_key()]["safe"] = not verdict
    cache.write_text(json.dumps(stored))
    assert amx._cached_or_probe() is (not verdict)
    shutil.rmtree(cache.parent)


def test_spans_listed_out_of_flattened_order_get_their_own_rows(runner):
    a, b = runner.tokenizer.encode(PROMPTS[0]), runner.tokenizer.encode(PROMPTS[3])
    ordered = Batch.from_spans([(0, a, 0, [], True), (1, b, 0, [], True)], BS)
    first = runner.step(ordered)
    runner.free(0), runner.free(1)
    swapped = Batch(ordered.token_ids, ordered.positions, list(reversed(ordered.spans)), BS)
    assert swapped.logits_rows == [len(a) + len(b) - 1, len(a) - 1]
    second = runner.step(swapped)
    runner.free(0), runner.free(1)
    np.testing.assert_allclose(second, first[::-1], atol=1e-5)


def test_llama_cpp_errors_reach_messages_and_its_info_lines_do_not():
    import llama_cpp.llama_cpp as L

    from evenflow.backends.llamacpp.native import ensure_backend, take_recent_errors

    ensure_backend()
    take_recent_errors()
    assert not L.llama_model_load_from_file(b"/nonexistent/evenflow-missing.gguf", L.llama_model_default_params())
    assert "evenflow-missing.gguf" in take_recent_errors()  # llama.cpp's ERROR line, quoted in ModelLoadError
    model = L.llama_model_load_from_file(str(cached_model(make_spec("tiny", architecture="llama"), formats=("gguf",),
                                                          gguf_dtype="f32")["gguf"]).encode(),
                                         L.llama_model_default_params())
    assert model
    L.llama_model_free(model)
    assert "print_info" not in take_recent_errors()  # a load's INFO chatter is not an error


def test_quantized_kv_cache_follows_ollamas_rule_and_stays_close_to_f16(tiny_gguf, monkeypatch):
    # heads of 32 values (q8_0/q4_0 blocks are 32 wide) and sharp attention, so K's precision shows in the logits
    spec = make_spec("tiny", architecture="llama", hidden_size=128, qk_std=0.5)
    path = cached_model(spec, formats=("gguf",), gguf_dtype="f32")["gguf"]
    prompt = list(range(40, 140))

    def last_logits(kv: str, fa: str) -> tuple[tuple[str, str], np.ndarray]:
        r = load(str(path), RunnerSettings(max_num_seqs=2, block_size=BS, num_kv_blocks=32, num_threads=2,
                                           max_num_batched_tokens=128, kv_cache_type=kv, flash_attention=fa))
        try:
            return r.kv_types, r.step(Batch.from_spans([(0, prompt, 0, [], True)], BS))[0]
        finally:
            r.close()

    types_f16, f16 = last_logits("f16", "off")
    types_k, q8k = last_logits("q8_0", "off")
    types_kv, q8kv = last_logits("q8_0", "on")
    types_auto, auto = last_logits("auto", "off")
    assert (types_f16, types_k, types_kv) == (("f16", "f16"), ("q8_0", "f16"), ("q8_0", "q8_0"))
    import llama_cpp.llama_cpp as L

    if not L.llama_supports_gpu_offload():  # the default on a CPU-only build: a q8_0 K (a GPU build keeps f16)
        assert types_auto == ("q8_0", "f16")
        np.testing.assert_array_equal(auto, q8k)
    spread = float(f16.max() - f16.min())
    for got in (q8k, q8kv):
        diff = float(np.max(np.abs(got - f16)))
        assert 0 < diff < 0.05 * spread  # quantized for real, and still the same model
    with pytest.raises(ModelLoadError, match="multiple of 32"):  # 16-value heads: refused, never mangled
        load(str(tiny_gguf), RunnerSettings(max_num_seqs=2, block_size=BS, num_kv_blocks=32, kv_cache_type="q4_0"))
    # ... while auto keeps the unquantized type there, and where a dtype was asked for
    for model, dtype, want in ((tiny_gguf, "auto", ("f16", "f16")), (path, "float32", ("f32", "f32"))):
        r = load(str(model), RunnerSettings(max_num_seqs=2, block_size=BS, num_kv_blocks=32, dtype=dtype))
        r.close()
        assert r.kv_types == want

    # RAM holds 2048 f16 tokens of this model (512 bytes each): a q8_0 K (34 bytes per 32 values) fits ~30% more
    from evenflow.backends.llamacpp import runner as runner_mod

    monkeypatch.setattr(runner_mod, "host_kv_budget", lambda: 2048 * 512)

    def planned(kv: str) -> int:
        r = load(str(path), RunnerSettings(max_num_seqs=8, block_size=BS, context_length=1024, num_threads=2,
                                           kv_cache_type=kv))
        r.close()
        return r.num_kv_blocks * BS

    assert planned("f16") == 2048
    assert planned("q8_0") >= 2600
