"""Constrained decoding (daemon/engine/grammar.py) on the real backends with random-weight models: their
unconstrained output is gibberish, so valid, schema-conforming JSON proves the constraint."""
from __future__ import annotations

import importlib.util
import json
import random

import jsonschema
import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from evenflow.backends.base import GrammarVocab, RunnerSettings, load_runner
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.grammar import GrammarCompiler, GrammarError, grammar_for_format, mask_rows

from toy_runner import EOS, ToyRunner

needs_llama = pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="llama-cpp-python not installed")
needs_mlx = pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")
BACKENDS = [
    pytest.param(("torch", "hf"), id="torch"),
    pytest.param(("llamacpp", "gguf"), id="llamacpp", marks=needs_llama),
    pytest.param(("mlx", "hf"), id="mlx", marks=needs_mlx),
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number", "minimum": -10, "maximum": 10},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "minItems": 1, "maxItems": 3},
        "pos": {"type": "object", "properties": {"x": {"type": "integer"}, "label": {"type": "string", "maxLength": 5}},
                "required": ["x", "label"], "additionalProperties": False},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "score", "tags", "pos", "kind"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=BACKENDS)
def runner(request, synthetic_model):
    backend, fmt = request.param
    path = synthetic_model("tiny", "llama", formats=(fmt,), gguf_dtype="f32", qk_std=0.3)[fmt]
    r = load_runner(backend, str(path), RunnerSettings(max_num_seqs=4, block_size=16, num_kv_blocks=96,
                                                        context_length=512, max_num_batched_tokens=256,
                                                        dtype="float32", flash_attention="off"))
    yield r
    r.close()


def prompts(vocab: int, n: int, length: int = 20, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 64) for _ in range(length)] for _ in range(n)]


def run(engine: Engine, jobs: list[tuple[list[int], SamplingParams, object]]) -> list[tuple[str, str]]:
    """Submit every (prompt, params, format-or-None) at once; (text, done_reason) per job."""
    streams = []
    for prompt, params, fmt in jobs:
        c = engine.grammars.compile(grammar_for_format(fmt)) if fmt is not None else None
        streams.append(engine.submit(prompt, params, loop=None, constraint=c))
    while engine.run_once():
        pass
    out = []
    for s in streams:
        ds = list(s)
        out.append(("".join(d.text for d in ds), ds[-1].done_reason))
    return out


def test_format_json_gives_an_object(runner):
    eng = Engine(runner, EngineConfig())
    # greedy and sampled; each must end by the grammar (EOS only once the object is closed)
    jobs = [(p, SamplingParams(temperature=t, seed=3, num_predict=120), "json")
            for p, t in zip(prompts(runner.info.vocab_size, 3, seed=1), (0.0, 0.8, 1.0))]
    for text, reason in run(eng, jobs):
        assert reason == "stop", text
        assert isinstance(json.loads(text), dict)


def test_schema_output_validates(runner):
    eng = Engine(runner, EngineConfig())
    jobs = [(p, SamplingParams(temperature=0 if i < 2 else 0.8, seed=i, num_predict=200), SCHEMA)
            for i, p in enumerate(prompts(runner.info.vocab_size, 3))]
    for text, reason in run(eng, jobs):
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_unconstrained_output_is_not_json(runner):
    """The control: the same model without a grammar does not produce JSON, so the tests above prove it."""
    eng = Engine(runner, EngineConfig())
    for text, _ in run(eng, [(p, SamplingParams(temperature=0, num_predict=40), None)
                             for p in prompts(runner.info.vocab_size, 4)]):
        with pytest.raises(ValueError):
            json.loads(text)


SMALL = {"type": "object", "properties": {"k": {"enum": ["a", "bb"]}, "n": {"type": "integer", "minimum": 0,
                                                                          "maximum": 99},
                                         "s": {"type": "string", "maxLength": 4}},
         "required": ["k", "n", "s"], "additionalProperties": False}


@pytest.fixture(scope="module")
def alone(runner):
    """Each invariance job run alone, monolithically: the reference outputs."""
    jobs = invariance_jobs(runner)
    return [run(Engine(runner, EngineConfig(prefill_mode="monolithic")), [j])[0] for j in jobs]


def invariance_jobs(runner) -> list[tuple[list[int], SamplingParams, object]]:
    ps = prompts(runner.info.vocab_size, 4, length=40, seed=5)
    params = SamplingParams(temperature=0, num_predict=40)
    return [(p, params, f) for p, f in zip(ps, [SMALL, None, "json", None])]


@pytest.mark.parametrize("chunk", [3, 16])
def test_chunk_invariance_with_constrained_rows(runner, alone, chunk):
    """Constrained and free rows share chunked steps; every output equals the one it gets alone."""
    eng = Engine(runner, EngineConfig(prefill_mode="chunked", max_num_batched_tokens=24, max_prefill_chunk=chunk))
    together = run(eng, invariance_jobs(runner))
    assert together == alone
    assert eng.blocks.num_free == eng.blocks.num_blocks
    assert together[0][1] == together[2][1] == "stop"
    jsonschema.validate(json.loads(together[0][0]), SMALL)
    assert isinstance(json.loads(together[2][0]), dict)


def test_eos_only_where_the_grammar_accepts(runner):
    gc = GrammarCompiler(runner.tokenizer, runner.info.vocab_size)
    c = gc.compile(grammar_for_format("json"))
    eos = sorted(runner.tokenizer.eos_ids)
    logits = np.zeros((1, runner.info.vocab_size), dtype=np.float32)
    mask_rows(gc.executor, logits, [(0, c)])
    assert np.all(np.isneginf(logits[0, eos]))  # an empty output is not an object
    for tok in runner.tokenizer.grammar_vocab().encode("{}"):
        assert c.consume(tok)
    logits[:] = 0
    mask_rows(gc.executor, logits, [(0, c)])
    allowed = set(np.flatnonzero(np.isfinite(logits[0])).tolist())
    assert allowed and allowed <= set(eos)  # the object is closed: only end-of-generation tokens remain
    assert c.finished


def test_grammar_vocab_marks_special_tokens(runner):
    gv = runner.tokenizer.grammar_vocab()
    assert len(gv.tokens) == runner.tokenizer.vocab_size
    assert set(gv.eos_ids) == set(runner.tokenizer.eos_ids)
    for i in gv.special_ids:
        assert gv.tokens[i].startswith(b"\xff") and len(gv.tokens[i]) > 1
    for i in set(range(len(gv.tokens))) - set(gv.special_ids):
        assert gv.tokens[i] == runner.tokenizer.token_bytes(i)
    assert set(gv.eos_ids) <= set(gv.special_ids)
    assert b"".join(gv.tokens[t] for t in gv.encode('{"a": 1}')) == b'{"a": 1}'


VOCABS = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2"]


def _hf_vocab(fixtures_dir, name: str):
    from evenflow.backends.common.gguf_file import GGUFFile
    from evenflow.backends.common.gguf_tokenizer import tokenizer_from_gguf

    path = str(fixtures_dir / "vocab" / f"ggml-vocab-{name}.gguf")
    with GGUFFile(path) as f:
        return tokenizer_from_gguf(f.metadata, path)


@pytest.mark.parametrize("name", VOCABS)
def test_bridge_on_real_vocabs(fixtures_dir, name):
    """Byte-fallback <0xNN> tokens become their byte, BPE byte-level pieces their bytes, on both bridges; both
    spell any text exactly (a SentencePiece tokenizer's prepended space included) and agree on the ids."""
    hf = _hf_vocab(fixtures_dir, name).grammar_vocab()
    if name == "llama-spm":
        assert sum(t == b"A" for t in hf.tokens) >= 2  # the piece "A" and the byte token <0x41>
    path = fixtures_dir / "vocab" / f"ggml-vocab-{name}.gguf"
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    texts += ['{"k": "', " leading", "</s> <s> <|endoftext|>", "\x01"]
    bridges = [hf]
    lt = None
    if importlib.util.find_spec("llama_cpp"):
        from evenflow.backends.llamacpp.tokenizer import open_vocab

        lt = open_vocab(str(path))  # its encode calls into this vocab: closed at the end
    try:
        if lt is not None:
            ll = lt.grammar_vocab()
            # the two bridges agree on every non-special token's bytes, on what ends a generation, on the ids
            diff = [i for i in range(len(ll.tokens)) if i not in ll.special_ids and i not in hf.special_ids
                    and ll.tokens[i] != hf.tokens[i]]
            assert len(diff) <= len(ll.tokens) // 1000, diff[:10]
            assert set(ll.eos_ids) == set(hf.eos_ids)
            assert [ll.encode(t) for t in texts] == [hf.encode(t) for t in texts]
            bridges.append(ll)
        for gv in bridges:
            _check_bridge(gv, texts)
    finally:
        if lt is not None:
            lt.close()


def _check_bridge(gv: GrammarVocab, texts: list[str]) -> None:
    assert set(gv.eos_ids) <= set(gv.special_ids)
    for text in texts:
        assert b"".join(gv.tokens[i] for i in gv.encode(text)) == text.encode("utf-8"), repr(text)
    # spelled byte by byte, through the vocab's single-byte tokens (<0xNN> byte fallback on SPM)
    byte_ids = {gv.tokens[i]: i for i in reversed(range(len(gv.tokens))) if len(gv.tokens[i]) == 1}
    c = GrammarCompiler(_Plain(gv), len(gv.tokens)).compile(grammar_for_format(
        {"type": "object", "properties": {"k": {"enum": ["é✓"]}}, "required": ["k"]}))
    for b in '{"k": "é✓"}'.encode("utf-8"):
        assert c.consume(byte_ids[bytes([b])]), c.error
    assert c.finished


def _allowed(gc: GrammarCompiler, c, width: int) -> set[int]:
    logits = np.zeros((1, width), dtype=np.float32)
    mask_rows(gc.executor, logits, [(0, c)])
    return set(np.flatnonzero(np.isfinite(logits[0])).tolist())


def test_a_tokenizer_that_prepends_a_space_cannot_break_the_mask(fixtures_dir):
    """The failure SentencePiece vocabs had: llguidance's tokenizer callback spelled "{" as " {" and its mask
    computation failed, leaving only end-of-generation tokens (an empty reply that said done_reason stop)."""
    gv = _hf_vocab(fixtures_dir, "llama-spm").grammar_vocab()
    spaced = GrammarVocab(gv.tokens, gv.special_ids, gv.eos_ids, gv.bos_id, lambda text: gv.encode(" " + text))
    gc = GrammarCompiler(_Plain(spaced), len(gv.tokens))
    c = gc.compile(grammar_for_format({"type": "object", "properties": {"k": {"enum": ["a"]}}, "required": ["k"]}))
    allowed = _allowed(gc, c, len(gv.tokens))
    assert not c.matcher.is_error(), c.error
    assert allowed and not allowed & set(gv.eos_ids) and all(gv.tokens[t].startswith(b"{") for t in allowed)


def test_a_failed_matcher_refuses_every_token_even_eos(runner):
    gc = GrammarCompiler(runner.tokenizer, runner.info.vocab_size)
    c = gc.compile(grammar_for_format("json"))
    close = runner.tokenizer.grammar_vocab().encode("}")[0]
    assert not c.consume(close)  # "}" cannot start an object: the matcher is now in error
    eos = min(runner.tokenizer.eos_ids)
    assert not c.consume(eos) and not c.finished  # an error, never a normal stop
    assert c.error and "\n" not in c.error


@pytest.mark.parametrize("name", ["phi-3", "qwen2"])
def test_end_of_generation_tokens_never_stand_for_text(fixtures_dir, name):
    """phi-3's "</s>" is user-defined and Qwen2's a normal token, yet both end a generation: a grammar must not
    pick one inside a string, where the engine would end the reply mid-JSON. Held by grammar.py even when a
    vocabulary hands them over as plain text."""
    gv = _hf_vocab(fixtures_dir, name).grammar_vocab()
    text_eos = GrammarVocab([b"</s>" if i in gv.eos_ids else t for i, t in enumerate(gv.tokens)],
                            [i for i in gv.special_ids if i not in gv.eos_ids], gv.eos_ids, gv.bos_id, gv.encode)
    gc = GrammarCompiler(_Plain(text_eos), len(gv.tokens))
    c = gc.compile(grammar_for_format({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}))
    for tok in gv.encode('{"s": "'):
        assert c.consume(tok), c.error
    allowed = _allowed(gc, c, len(gv.tokens))
    assert allowed and not allowed & set(gv.eos_ids)


class _Plain:
    """A tokenizer that only hands out a prepared GrammarVocab."""

    def __init__(self, gv: GrammarVocab) -> None:
        self._gv = gv

    def grammar_vocab(self) -> GrammarVocab:
        return self._gv


def test_bad_formats_are_refused():
    with pytest.raises(GrammarError, match='invalid format: "xml"; expected "json" or a valid JSON Schema object'):
        grammar_for_format("xml")
    with pytest.raises(GrammarError, match="Invalid type: foo"):
        grammar_for_format({"type": "foo"})
    with pytest.raises(GrammarError, match="unclosed group"):
        grammar_for_format({"type": "string", "pattern": "(("})
    assert grammar_for_format(None) is None and grammar_for_format("") is None


class _ScriptedRunner(ToyRunner):
    """The toy model, but its first outputs are forced to `script` (thinking text the grammar must not see)."""

    def __init__(self, script: bytes) -> None:
        super().__init__(max_num_seqs=2)
        self.script = list(script)

    def step(self, batch):
        logits = super().step(batch)
        row = 0
        for span in batch.spans:  # a row per token of an all_logits span (draft tokens verified), else the last
            for n in range(span.context_len - span.num_logits + 1, span.context_len + 1):
                k = n - self.prompt_len
                if 0 <= k < len(self.script):
                    logits[row, self.script[k]] = 100.0
                row += 1
        return logits


def test_thinking_stays_unconstrained_then_the_answer_is():
    r = _ScriptedRunner(b"<think>not json {</think>")
    prompt = list(b"hello")
    r.prompt_len = len(prompt)
    eng = Engine(r, EngineConfig())
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["n"], "additionalProperties": False}
    c = eng.grammars.compile(grammar_for_format(schema), start_after="</think>")
    stream = eng.submit(prompt, SamplingParams(temperature=0, num_predict=80), loop=None, constraint=c)
    while eng.run_once():
        pass
    ds = list(stream)
    text = "".join(d.text for d in ds)
    assert text.startswith("<think>not json {</think>")
    answer = json.loads(text[len("<think>not json {</think>"):])
    assert isinstance(answer["n"], int) and ds[-1].done_reason == "stop"


class _Count(BaseModel):
    model_config = ConfigDict(extra="forbid")  # the validator refuses extra keys; the schema says nothing of them
    n: int


def test_a_model_that_would_go_on_forever_is_closed_as_ollama_closes_it():
    """A model that always prefers another digit, or a comma for another key: the schema read literally (as
    llguidance reads it) lets it go on until num_predict; read as Ollama's grammar, the integer ends at 16 digits
    and the object has no key beyond its properties, so the reply ends by the grammar."""
    r = _ScriptedRunner(b"")
    r.prompt_len = 1
    r.bias[list(b"9,")] = 50.0
    eng = Engine(r, EngineConfig())
    c = eng.grammars.compile(grammar_for_format(_Count.model_json_schema()))
    stream = eng.submit(list(b"x"), SamplingParams(temperature=0, num_predict=120), loop=None, constraint=c)
    while eng.run_once():
        pass
    ds = list(stream)
    text = "".join(d.text for d in ds)
    assert ds[-1].done_reason == "stop", text
    assert 10**14 <= _Count.model_validate_json(text).n < 10**16  # nines as long as the grammar allowed
