"""A `Tokenizer` (see base.py) over the `tokenizers` package, for HF tokenizer.json and GGUF vocabs."""
from __future__ import annotations

import json
import logging
import re
from functools import lru_cache
from typing import Iterable

from tokenizers import Tokenizer as HFTok

from ..base import GrammarVocab, special_piece

log = logging.getLogger(__name__)

# Tokens that end a generation, besides the declared EOS: llama.cpp's list (llama-vocab.cpp marks these EOG by
# their text), so a model stops at the same token on every backend (phi-3's <|end|>, Gemma's <end_of_turn>).
END_OF_GENERATION = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>",
                     "<|endoftext|>", "<EOT>", "_<EOT>", "<end_of_utterance>", "</s>")
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-unicode -> byte map (inverse of bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _byte_level_bytes(piece: str) -> bytes:
    table = byte_level_decoder()
    try:
        return bytes(table[c] for c in piece)
    except KeyError:  # not a byte-level piece after all (e.g. a plain-text added token)
        return piece.encode("utf-8")


def _spm_bytes(piece: str) -> bytes:
    m = _BYTE_TOKEN.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


class HFTokenizer:
    """Token ids <-> text with raw per-token bytes for streaming detokenisation."""

    def __init__(
        self,
        tok: HFTok,
        *,
        bos_id: int | None,
        eos_ids: Iterable[int],
        add_bos: bool,
        byte_scheme: str,  # "byte_level" (GPT-2 style BPE) | "spm" (▁ for space, <0xNN> byte fallback)
        control_ids: Iterable[int] = (),
        add_eos: bool = False,
        eos_id: int | None = None,
    ) -> None:
        if byte_scheme not in ("byte_level", "spm"):
            raise ValueError(f"byte_scheme {byte_scheme!r}; allowed: byte_level, spm")
        self._tok = tok
        # A twin that leaves special-token text alone, for parse_special=False (the flag is per object).
        self._tok_plain = HFTok.from_str(tok.to_str())
        self._tok_plain.encode_special_tokens = True
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.bos_id = bos_id
        self.add_bos = bool(add_bos and bos_id is not None)
        self.add_eos = bool(add_eos and eos_id is not None)
        self.eos_id = eos_id
        self.byte_scheme = byte_scheme
        added = tok.get_added_tokens_decoder()
        self.control_ids = set(control_ids) | {i for i, t in added.items() if t.special}
        eos = {int(i) for i in eos_ids if i is not None}
        for name in END_OF_GENERATION:
            tid = tok.token_to_id(name)
            if tid is not None:
                eos.add(tid)
        if tok.token_to_id("<|return|>") is not None and tok.token_to_id("<|call|>") is not None:
            # gpt-oss (harmony): <|end|> closes one message of a reply, <|return|>/<|call|> end it (as llama.cpp)
            eos.discard(tok.token_to_id("<|end|>"))
        self.eos_ids = eos
        self._bytes = self._token_bytes_table(added)

    def _token_bytes_table(self, added: dict) -> list[bytes]:
        """Raw bytes of every id, computed once: streaming detokenisation looks them up per token."""
        to_bytes = _byte_level_bytes if self.byte_scheme == "byte_level" else _spm_bytes
        table: list[bytes] = []
        for i in range(self.vocab_size):
            if i in self.control_ids:
                table.append(b"")
                continue
            if i in added:  # added tokens keep their literal text
                table.append(added[i].content.encode("utf-8"))
                continue
            piece = self._tok.id_to_token(i)
            table.append(to_bytes(piece) if piece is not None else b"")
        return table

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to ids; BOS (and EOS where the model asks for it) only when `add_special`."""
        tok = self._tok if parse_special else self._tok_plain
        # encode_batch releases the GIL while it works (encode does not): a long prompt tokenized in the
        # daemon's worker pool then leaves the event loop and the engine thread running
        ids = tok.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special:
            if self.add_bos:
                ids = [self.bos_id, *ids]  # type: ignore[list-item]
            if self.add_eos:
                ids.append(self.eos_id)  # type: ignore[arg-type]
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        if 0 <= token_id < len(self._bytes):
            return self._bytes[token_id]
        raise IndexError(f"token id {token_id} out of range [0, {len(self._bytes)})")

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=True)

    def grammar_vocab(self) -> GrammarVocab:
        """Byte tokens and BPE pieces as their raw bytes; control tokens, end-of-generation tokens and `<...>`
        user-defined ones marked special by their text (as llguidance marks them for llama.cpp)."""
        added = self._tok.get_added_tokens_decoder()
        tokens = list(self._bytes)
        looks_special = {i for i, t in added.items() if t.content.startswith("<") and t.content.endswith(">")}
        special = sorted((self.control_ids | self.eos_ids | looks_special) & set(range(len(tokens))))
        for i in special:
            text = added[i].content if i in added else (self._tok.id_to_token(i) or f"<control_{i}>")
            tokens[i] = special_piece(text.encode("utf-8"))
        exact = _spelling_twin(self._tok, set(special))
        return GrammarVocab(tokens, special, sorted(self.eos_ids), self.bos_id,
                            lambda text: exact.encode(text, add_special_tokens=False).ids)

    def id_to_piece(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)


def _spelling_twin(tok: HFTok, special: set[int]) -> HFTok:
    """A copy that spells text exactly, as a grammar needs: the text of a token the grammar holds special stays
    text (an added token, such as phi-3's user-defined "</s>", would otherwise match), and a SentencePiece
    tokenizer does not prepend `▁` to the first word (a `Prepend` normalizer, Metaspace's prepend_scheme)."""
    data = json.loads(tok.to_str())
    for added in data.get("added_tokens") or []:
        if added.get("id") in special:
            added["special"] = True  # with encode_special_tokens, left as text
    data["normalizer"] = _without_prepend(data.get("normalizer"))
    data["pre_tokenizer"] = _metaspace_never_prepends(data.get("pre_tokenizer"))
    twin = HFTok.from_str(json.dumps(data))
    twin.encode_special_tokens = True
    return twin


def _without_prepend(norm: dict | None) -> dict | None:
    if norm is None or norm.get("type") == "Prepend":
        return None
    if norm.get("type") == "Sequence":
        kept = [n for n in map(_without_prepend, norm.get("normalizers", [])) if n is not None]
        return {**norm, "normalizers": kept} if kept else None
    return norm


def _metaspace_never_prepends(pre: dict | None) -> dict | None:
    if pre is None:
        return None
    if pre.get("type") == "Metaspace":
        pre = {**pre, "prepend_scheme": "never"}
        pre.pop("add_prefix_space", None)  # the pre-0.14 spelling of the same switch
        return pre
    if pre.get("type") == "Sequence":
        return {**pre, "pretokenizers": [_metaspace_never_prepends(p) for p in pre.get("pretokenizers", [])]}
    return pre
