"""The GGUF's own vocabulary through llama.cpp: `llama_tokenize` / `llama_token_to_piece`."""
from __future__ import annotations

import ctypes
import logging
from typing import Callable

from .lib import L

from ..base import GrammarVocab, special_piece

log = logging.getLogger(__name__)


class LlamaCppTokenizer:
    """Tokenizer over a loaded model's `llama_vocab` (valid while the model is loaded)."""

    def __init__(self, vocab: ctypes.c_void_p, owned_model: ctypes.c_void_p | None = None):
        self._vocab = vocab
        self._owned_model = owned_model  # set by open_vocab: a vocab-only model this tokenizer frees
        self.vocab_size: int = L.llama_vocab_n_tokens(vocab)
        bos = L.llama_vocab_bos(vocab)
        self.bos_id: int | None = bos if bos >= 0 else None
        eos = L.llama_vocab_eos(vocab)
        self.eos_id: int | None = eos if eos >= 0 else None
        self.add_bos: bool = bool(L.llama_vocab_get_add_bos(vocab)) and self.bos_id is not None
        # every end-of-generation token (EOS, EOT, <|im_end|>, ...): one pass over the vocab at load
        self.eos_ids: set[int] = {t for t in range(self.vocab_size) if L.llama_vocab_is_eog(vocab, t)}
        self._pieces: dict[int, bytes] = {}

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to ids; BOS per the vocab's add-BOS rule when `add_special`."""
        data = text.encode("utf-8")
        cap = len(data) + 8  # a token covers at least one byte, plus BOS/EOS
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # too small after all (cannot happen for byte-level vocabs, but be exact)
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed ({n}) on a text of {len(data)} bytes")
        return list(buf[:n])

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (b"" for control tokens); cached per id. Thread-safe: the engine thread and
        request threads (structure tokens, grammars) read pieces at once."""
        piece = self._pieces.get(token_id)
        if piece is None:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} out of range [0, {self.vocab_size})")
            # a buffer per call: llama.cpp writes the piece with the GIL released, so a buffer shared by the
            # tokenizer's callers can hold another thread's piece by the time this one reads it (and caches it)
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, False)
            if n < 0:  # piece longer than the buffer
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._pieces[token_id] = piece
        return piece

    def decode(self, token_ids: list[int]) -> str:
        """Ids to text: the concatenated pieces (what streaming produces), invalid UTF-8 replaced."""
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")

    def id_to_piece(self, token_id: int) -> str | None:
        """The token's text in the vocabulary (llama_vocab_get_text: a control token's spelling too)."""
        if not 0 <= token_id < self.vocab_size:
            return None
        text = L.llama_vocab_get_text(self._vocab, token_id)
        return text.decode("utf-8", errors="replace") if text else None

    def grammar_vocab(self) -> GrammarVocab:
        """Pieces from llama.cpp; control tokens (and `<...>` user-defined ones) marked special by their text."""
        tokens: list[bytes] = []
        special: list[int] = []
        buf = ctypes.create_string_buffer(1024)
        for t in range(self.vocab_size):
            attr = L.llama_vocab_get_attr(self._vocab, t)
            piece = self.token_bytes(t)
            ctl = attr & L.LLAMA_TOKEN_ATTR_CONTROL
            if ctl or (attr & L.LLAMA_TOKEN_ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
                n = L.llama_token_to_piece(self._vocab, t, buf, len(buf), 0, True)
                piece = special_piece(buf.raw[:max(n, 0)] or f"<control_{t}>".encode())
                special.append(t)
            tokens.append(piece)
        return GrammarVocab(tokens, special, sorted(self.eos_ids), self.bos_id, self._spelling_encoder(tokens))

    def _spelling_encoder(self, tokens: list[bytes]) -> Callable[[str], list[int]]:
        """Text to ids that spell exactly that text, as a grammar needs. llama_tokenize puts a space in front of
        the text for SentencePiece vocabs (add_space_prefix), with no flag to turn it off: there, tokenize a
        sentinel byte + the text and drop the sentinel's tokens. The sentinel is a control byte that is a token
        of its own and begins no other token (nor does " " + it), so no merge crosses it."""
        def plain(text: str) -> list[int]:
            return self.encode(text, add_special=False, parse_special=False)

        if b"".join(tokens[i] for i in plain("a")) == b"a":
            return plain
        singles = {tok for tok in tokens if len(tok) == 1}
        longer = [tok for tok in tokens if len(tok) > 1]
        firsts, pairs = {tok[:1] for tok in longer}, {tok[:2] for tok in longer}
        for b in range(1, 32):
            mark = bytes([b])
            if mark in singles and mark not in firsts and b" " + mark not in pairs:
                head = plain(chr(b))
                if b"".join(tokens[i] for i in head).endswith(mark):
                    break
        else:
            log.warning("no sentinel byte in this vocabulary: grammar tokenization falls back to longest match")
            return plain

        def spelled(text: str) -> list[int]:
            if not text:
                return []
            ids = plain(chr(b) + text)
            return ids[len(head):] if ids[:len(head)] == head else ids

        return spelled

    def close(self) -> None:
        """Free the vocab-only model of `open_vocab` (a runner's tokenizer dies with the runner)."""
        if self._owned_model:
            L.llama_model_free(self._owned_model)
            self._owned_model = None


def open_vocab(path: str) -> LlamaCppTokenizer:
    """A standalone tokenizer from a GGUF's vocabulary only (no weights loaded); call close() when done."""
    from ..base import ModelLoadError
    from .gguf_info import read_header
    from .native import ensure_backend, take_recent_errors

    read_header(path)
    ensure_backend()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise ModelLoadError(f"{path}: llama.cpp could not load its vocabulary: {take_recent_errors()}")
    return LlamaCppTokenizer(L.llama_model_get_vocab(model), owned_model=model)
