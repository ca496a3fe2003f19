"""llama.cpp's tokenizer is shared by the engine thread (detokenizing each sampled token) and the request threads
(a reply format's structure tokens, grammars, prompt sizes): a token's text must be its own whoever else asks at the
same time. It once was not: `token_bytes` had llama.cpp write every piece into one buffer per tokenizer, so a request
thread's piece could land between the engine's call and its read, and the wrong text was cached for that id for the
model's life (CI: qwen3's `<think>` came out as `</tool_`, 7 bytes of `</tool_call>`; gpt-oss's harmony markers
swapped, so the reply parser saw no channels)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from evenflow.backends.llamacpp import tokenizer as tokenizer_mod  # noqa: E402
from evenflow.backends.llamacpp.tokenizer import open_vocab  # noqa: E402
from evenflow.backends.synthetic import cached_model, make_spec  # noqa: E402


# the synthetic model's vocabulary and every real one in the shared fixtures (SentencePiece and byte-level BPE)
VOCABS = ["synthetic", "llama-spm", "llama-bpe", "qwen2", "gpt-2", "phi-3"]


@pytest.fixture(scope="module", params=VOCABS)
def vocab_path(request) -> Path:
    if request.param == "synthetic":
        return cached_model(make_spec("tiny", architecture="llama"), formats=("gguf",), gguf_dtype="f32")["gguf"]
    path = request.getfixturevalue("fixtures_dir") / "vocab" / f"ggml-vocab-{request.param}.gguf"
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="module")
def pieces(vocab_path: Path) -> dict[int, bytes]:
    """Every token's text, read one at a time on one thread."""
    tok = open_vocab(str(vocab_path))
    try:
        return {t: tok.token_bytes(t) for t in range(tok.vocab_size)}
    finally:
        tok.close()


def _pair(pieces: dict[int, bytes]) -> tuple[int, int]:
    """Two tokens whose texts differ in their first bytes, the second no shorter: a read of the first that got the
    second's bytes would show."""
    long = sorted((t for t, p in pieces.items() if len(p) >= 4), key=lambda t: len(pieces[t]))
    a = long[0]
    b = next(t for t in reversed(long) if pieces[t][: len(pieces[a])] != pieces[a])
    return a, b


def test_a_token_text_is_its_own_when_another_read_cuts_in(vocab_path: Path, pieces: dict[int, bytes],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic: another thread's read runs between llama.cpp writing token a's text and our reading it."""
    a, b = _pair(pieces)
    tok = open_vocab(str(vocab_path))
    real = tokenizer_mod.L.llama_token_to_piece
    cut_in = {"done": False}

    def piece_then_another(vocab, token, buf, size, lstrip, special):  # type: ignore[no-untyped-def]
        n = real(vocab, token, buf, size, lstrip, special)
        if token == a and not cut_in["done"]:
            cut_in["done"] = True
            assert tok.token_bytes(b) == pieces[b]  # "the other thread", between the write and the read
        return n

    monkeypatch.setattr(tokenizer_mod.L, "llama_token_to_piece", piece_then_another)
    try:
        assert tok.token_bytes(a) == pieces[a]
        assert cut_in["done"]
        assert tok.token_bytes(a) == pieces[a]  # and what was cached for a is a's text
    finally:
        tok.close()


def test_token_texts_read_by_many_threads_at_once(vocab_path: Path, pieces: dict[int, bytes]) -> None:
    """Threads reading the whole vocabulary at once from one fresh tokenizer (nothing cached) each get every
    token's own text, and the cache keeps it."""
    tok = open_vocab(str(vocab_path))
    ids = sorted(pieces)
    wrong: list[tuple[int, bytes]] = []
    start = threading.Barrier(4)

    def read(offset: int) -> None:
        start.wait()
        for t in ids[offset:] + ids[:offset]:  # each thread starts elsewhere: most reads are cache misses
            if (p := tok.token_bytes(t)) != pieces[t]:
                wrong.append((t, p))

    try:
        threads = [threading.Thread(target=read, args=(k * len(ids) // 4,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not wrong, f"{len(wrong)} token texts read wrong, e.g. {wrong[:3]}, " \
                          f"not {[pieces[t] for t, _ in wrong[:3]]}"
        assert all(tok.token_bytes(t) == pieces[t] for t in ids)
    finally:
        tok.close()
