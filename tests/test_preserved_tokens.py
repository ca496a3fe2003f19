"""Special tokens that carry a reply's structure (harmony's <|channel|>) reach the reply parser as text, while
every other special token (EOS, BOS) stays hidden: the engine emits a preserved token's text, and only the
format's own markers are preserved."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.backends.base import ModelInfo
from evenflow.daemon.api.prompting import structure_tokens
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.prompt.formats import HARMONY
from evenflow.daemon.prompt.reply import ReplyParser
from toy_runner import EOS, ToyRunner

SPECIALS = {"<|channel|>": 258, "<|message|>": 259, "<|end|>": 260, "<|start|>": 261, "<|return|>": EOS}


class ScriptTokenizer:
    """Bytes 0-255, EOS 256 (spelled <|return|>, as gpt-oss's end of reply), BOS 257, and hidden specials."""

    vocab_size = 262
    bos_id = 257
    eos_ids = {EOS}
    add_bos = False

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids: list[int] = []
        while text:
            hit = next((s for s in SPECIALS if parse_special and text.startswith(s)), None)
            ids += [SPECIALS[hit]] if hit else list(text[0].encode())
            text = text[len(hit):] if hit else text[1:]
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")


class ScriptRunner(ToyRunner):
    """Greedy output after a prompt of `prompt_len` tokens is `script`, token by token."""

    def __init__(self, script: list[int], prompt_len: int) -> None:
        super().__init__(num_kv_blocks=64)
        self.script, self.prompt_len = script, prompt_len
        self.tokenizer = ScriptTokenizer()
        self.info = ModelInfo("gpt-oss", 262, 256, 16, 1, 1, 1)

    def step(self, batch):  # type: ignore[no-untyped-def]
        rows = []
        for span in batch.spans:
            if span.need_logits:
                row = np.full(262, -1e9, dtype=np.float32)
                row[self.script[span.context_len - self.prompt_len]] = 0.0
                rows.append(row)
        return np.array(rows, dtype=np.float32).reshape(len(rows), 262)


REPLY = ("<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
         "<|return|>")


def _generate(preserved: dict[int, bytes]) -> str:
    tok = ScriptTokenizer()
    prompt = tok.encode("<|start|>user<|message|>hi<|end|><|start|>assistant")
    engine = Engine(ScriptRunner(tok.encode(REPLY), len(prompt)), EngineConfig(max_num_batched_tokens=16))
    params = SamplingParams(temperature=0, num_predict=200)
    params.preserved_tokens = preserved
    stream = engine.submit(prompt, params, loop=None)
    while engine.run_once():
        pass
    deltas = list(stream)
    assert deltas[-1].done_reason == "stop"
    return "".join(d.text for d in deltas)


def test_structure_tokens_reach_the_parser_and_eos_stays_hidden() -> None:
    preserved = structure_tokens(ScriptTokenizer(), HARMONY.markers())
    assert preserved == {258: b"<|channel|>", 259: b"<|message|>", 260: b"<|end|>", 261: b"<|start|>"}
    text = _generate(preserved)
    assert text == REPLY.removesuffix("<|return|>")  # the end-of-generation token is not output text
    parser = ReplyParser("<|channel|><|message|>", "<|start|>assistant", True, None)
    assert parser.parse_all(text) == ("Greet back.", "Hello!", [])


def test_without_preserved_tokens_the_structure_is_lost() -> None:
    """What happened before: hidden markers leave fused words, which the parser can only pass on as content."""
    text = _generate({})
    assert text == "analysisGreet back.assistantfinalHello!"
    assert ReplyParser("<|channel|><|message|>", "<|start|>assistant", True, None).parse_all(text) == ("", text, [])


def test_structure_tokens_from_a_real_vocabulary(fixtures_dir) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp's detokenizer hides control tokens: a format's control-token markers are preserved, its
    end-of-generation token and what the vocabulary spells as text are not."""
    pytest.importorskip("llama_cpp")
    from evenflow.backends.llamacpp.tokenizer import open_vocab

    tok = open_vocab(str(fixtures_dir / "vocab" / "ggml-vocab-llama-bpe.gguf"))
    try:
        header = tok.encode("<|start_header_id|>", add_special=False, parse_special=True)
        assert len(header) == 1 and tok.token_bytes(header[0]) == b""
        found = structure_tokens(tok, ("<|start_header_id|>", "<|eot_id|>", "plain words", "<think>"))
        assert found == {header[0]: b"<|start_header_id|>"}
    finally:
        tok.close()
    qwen = open_vocab(str(fixtures_dir / "vocab" / "ggml-vocab-qwen2.gguf"))
    try:
        found = structure_tokens(qwen, ("<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"))
        start = qwen.encode("<|im_start|>", add_special=False, parse_special=True)[0]
        assert found == {start: b"<|im_start|>"}  # <tool_call> is spelled in text; <|im_end|> ends the reply
    finally:
        qwen.close()


def test_hf_tokenizer_keeps_harmony_going_after_end() -> None:
    """gpt-oss on torch/MLX: `<|end|>` closes a message (the analysis) and the reply goes on to its final channel;
    `<|return|>` and `<|call|>` end it, as llama.cpp decides for this vocabulary. Its markers are hidden control
    tokens, so the reply format preserves them."""
    from tokenizers import Tokenizer, models

    from evenflow.backends.common.hf_tokenizer import HFTokenizer

    specials = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
    vocab = {ch: i for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz")}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    hf.add_special_tokens(specials)
    ids = {s: hf.token_to_id(s) for s in specials}
    # generation_config.json lists <|return|> and <|call|>; <|end|> is on the generic end-of-turn list
    tok = HFTokenizer(hf, bos_id=None, eos_ids=[ids["<|return|>"], ids["<|call|>"]], add_bos=False,
                      byte_scheme="byte_level")
    assert ids["<|return|>"] in tok.eos_ids and ids["<|call|>"] in tok.eos_ids and ids["<|end|>"] not in tok.eos_ids
    assert structure_tokens(tok, HARMONY.markers()) == {ids[s]: s.encode() for s in specials[:5]}
    plain = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    plain.add_special_tokens(["<|end|>"])  # Phi-3's end of turn: still the end
    assert plain.token_to_id("<|end|>") in HFTokenizer(plain, bos_id=None, eos_ids=[], add_bos=False,
                                                       byte_scheme="byte_level").eos_ids
