"""Structured outputs and the prompt's BOS on every real vocabulary of the shared fixtures, on every backend.

The tiny random-weight model is made with each vocab: SentencePiece (llama-spm, phi-3: `▁` for spaces, `<0xNN>`
byte-fallback tokens, a space the tokenizer prepends) and byte-level BPE (llama-bpe, qwen2, gpt-2). Its free
output is gibberish, so JSON that conforms proves the grammar worked with that tokenizer.
"""
from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Iterator

import jsonschema
import ollama
import pytest

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.grammar import grammar_for_format

from api_harness import BACKENDS as HTTP_BACKENDS
from api_harness import Daemon, start_daemon, upload_model

VOCABS = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2"]
BACKENDS = [
    pytest.param("torch", id="torch"),
    pytest.param("llamacpp", id="llamacpp",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="no llama-cpp-python")),
    pytest.param("mlx", id="mlx", marks=pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="no mlx")),
]
SETTINGS = RunnerSettings(max_num_seqs=4, block_size=16, num_kv_blocks=64, context_length=512,
                          max_num_batched_tokens=256, dtype="float32", flash_attention="off")
# Bounded: every value has a finite spelling, so each sequence must end by the grammar, before num_predict.
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "n": {"type": "integer", "minimum": -5, "maximum": 99},
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["kind", "n", "name", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def vocab_model(fixtures_dir, synthetic_model):
    """vocab name -> the tiny model's GGUF with that vocab (tied embeddings: a 152k vocab stays small)."""
    def path(vocab: str) -> Path:
        return synthetic_model("tiny", "llama", formats=("gguf",), tie_word_embeddings=True,
                               vocab=str(fixtures_dir / "vocab" / f"ggml-vocab-{vocab}.gguf"))["gguf"]
    return path


def run(engine: Engine, jobs: list[tuple[list[int], SamplingParams, object]]) -> list[tuple[str, str, str | None, int]]:
    """Submit every (prompt, params, format) at once; (text, done_reason, error, tokens) per job."""
    streams = [engine.submit(p, params, loop=None, constraint=engine.grammars.compile(grammar_for_format(fmt)))
               for p, params, fmt in jobs]
    while engine.run_once():
        pass
    out = []
    for s in streams:
        ds = list(s)
        out.append(("".join(d.text for d in ds), ds[-1].done_reason, ds[-1].error, sum(len(d.token_ids) for d in ds)))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", VOCABS)
def test_structured_outputs_on_every_vocab(vocab_model, vocab: str, backend: str) -> None:
    runner = load_runner(backend, str(vocab_model(vocab)), SETTINGS)
    try:
        engine = Engine(runner, EngineConfig())
        prompt = runner.tokenizer.encode("Answer in JSON, please: who is it?")
        greedy, sampled = SamplingParams(temperature=0, num_predict=150), SamplingParams(temperature=1.0, seed=11,
                                                                                         num_predict=150)
        schema_runs = run(engine, [(prompt, greedy, SCHEMA), (prompt, sampled, SCHEMA)])
        for text, reason, error, _ in schema_runs:
            assert (reason, error) == ("stop", None), text
            jsonschema.validate(json.loads(text), SCHEMA)
        short = 40
        json_runs = run(engine, [(prompt, SamplingParams(temperature=0, num_predict=short), "json"),
                                 (prompt, SamplingParams(temperature=1.0, seed=11, num_predict=short), "json")])
        for text, reason, error, tokens in json_runs:
            assert error is None and text.startswith("{"), (reason, error, text)
            if reason == "stop":
                assert isinstance(json.loads(text), dict)
            else:  # an unbounded string key may still be open when num_predict ends it
                assert (reason, tokens) == ("length", short)
    finally:
        runner.close()


# ---- through HTTP, with the official client, on one daemon serving a model per vocab

@pytest.fixture(scope="module")
def daemon(tmp_path_factory, vocab_model) -> Iterator[Daemon]:
    backend = "llamacpp" if "llamacpp" in HTTP_BACKENDS else HTTP_BACKENDS[0]
    d = start_daemon(tmp_path_factory.mktemp("vocab-api"), backend=backend, context_length="512")
    for vocab in VOCABS:
        upload_model(d.url, vocab_model(vocab), vocab)
    d.backend = backend  # type: ignore[attr-defined]
    yield d
    d.stop()


@pytest.mark.parametrize("vocab", VOCABS)
def test_format_over_http_on_every_vocab(daemon: Daemon, vocab: str) -> None:
    client = ollama.Client(host=daemon.url)
    r = client.chat(vocab, messages=[{"role": "user", "content": "Describe a pet as JSON."}], format=SCHEMA,
                    options={"temperature": 0, "num_predict": 150})
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.message.content), SCHEMA)
    g = client.generate(vocab, "A JSON object:", format="json", options={"temperature": 0, "num_predict": 40})
    assert g.response.startswith("{") and g.done_reason in ("stop", "length")
    if g.done_reason == "stop":
        assert isinstance(json.loads(g.response), dict)


BOS_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
NO_BOS_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.mark.parametrize("vocab", VOCABS)
def test_one_bos_whether_or_not_the_template_writes_it(daemon: Daemon, vocab: str, caplog) -> None:
    """The prompt ids start with exactly one BOS where the model adds one (the template's own is dropped before
    tokenizing, as llama-server does), and the template's where it does not; llama.cpp never warns of two."""
    caplog.set_level(logging.DEBUG, logger="evenflow.backends.llamacpp.native")  # llama.cpp's own log lines
    client = ollama.Client(host=daemon.url)
    contexts = [list(client.generate(vocab, "Hello there", template=template,
                                     options={"temperature": 0, "num_predict": 1}).context)
                for template in (BOS_TEMPLATE, NO_BOS_TEMPLATE)]
    tok = daemon.ctx.manager.models[f"{vocab}:latest"].runner.tokenizer
    assert tok.bos_id is not None
    for ids, wrote in zip(contexts, (True, False)):
        leading = next((i for i, t in enumerate(ids) if t != tok.bos_id), len(ids))
        assert leading == (1 if tok.add_bos or wrote else 0), (wrote, ids[:4])
    assert not [m for m in caplog.messages if "2 BOS" in m]
