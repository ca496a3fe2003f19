"""A family's vocabulary for a scripted model: a real vocab GGUF's `tokenizer.*` fields, with the family's special
tokens added (as control or user-defined tokens) and its end-of-generation token, tokenized through llama.cpp."""
from __future__ import annotations

import functools
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tokenizer import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED

TOKEN_TYPES = {"control": TOKEN_CONTROL, "user_defined": TOKEN_USER_DEFINED, "normal": TOKEN_NORMAL}
# Placeholder slots real vocabularies reserve for later special tokens: a new special token takes the first free one
# (as the families did: Qwen's <tool_call> sits where Qwen2's [PAD151657] was), else it is appended.
_RESERVED = re.compile(r"\[PAD\d+\]|<\|reserved_special_token_\d+\|>|<\|placeholder\d+\|>")
_ID_KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
            "eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id"}


@functools.lru_cache(maxsize=4)
def _read_fields(path: str, mtime_ns: int) -> dict[str, Any]:
    from ..common.gguf_file import GGUFFile  # ours: gguf.GGUFReader takes a minute on a 150k-token vocab

    with GGUFFile(path) as gf:
        return {k: v for k, v in gf.metadata.items() if k.startswith("tokenizer.")}


def vocab_fields(path: str | Path) -> dict[str, Any]:
    """Every `tokenizer.*` field of a GGUF as Python values (read once per file version)."""
    return dict(_read_fields(str(Path(path).resolve()), os.stat(path).st_mtime_ns))


@dataclass
class FamilyVocab:
    """The edited `tokenizer.*` fields and the token list they hold."""

    fields: dict[str, Any]
    tokens: list[str]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def token_id(self, text: str) -> int:
        try:
            return self.tokens.index(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a token of this vocabulary; add it with special_tokens") from None

    def id_of(self, role: str) -> int | None:
        """The id the vocab names for `role` (bos, eos, eot, eom), or None."""
        value = self.fields.get(_ID_KEYS[role])
        return int(value) if value is not None else None


def family_vocab(vocab_path: str | Path, special_tokens: dict[str, str], ids: dict[str, str],
                 add_bos: bool | None, chat_template: str | None) -> FamilyVocab:
    """`vocab_path`'s tokenizer with `special_tokens` (text -> control | user_defined) present, `ids` (bos, eos, eot,
    eom -> token text) pointing at those tokens and the chat template replaced."""
    fields = vocab_fields(vocab_path)
    if not fields.get("tokenizer.ggml.tokens"):
        raise ValueError(f"{vocab_path}: no tokenizer.ggml.tokens; expected a vocab GGUF")
    tokens = list(fields["tokenizer.ggml.tokens"])
    types = list(fields.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    scores = list(fields["tokenizer.ggml.scores"]) if "tokenizer.ggml.scores" in fields else None
    index = {t: i for i, t in enumerate(tokens)}
    free = (i for i, t in enumerate(tokens) if _RESERVED.fullmatch(t))
    for text, kind in special_tokens.items():
        if kind not in TOKEN_TYPES:
            raise ValueError(f"special token {text!r}: type {kind!r} unknown; allowed: {', '.join(TOKEN_TYPES)}")
        i = index.get(text)
        if i is None:
            i = next(free, None)
            if i is None:
                i = len(tokens)
                tokens.append(text)
                types.append(0)
                if scores is not None:
                    scores.append(0.0)
            else:
                del index[tokens[i]]
                tokens[i] = text
            index[text] = i
        types[i] = TOKEN_TYPES[kind]
    fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"] = tokens, types
    if scores is not None:
        fields["tokenizer.ggml.scores"] = scores
    for role, text in ids.items():
        if role not in _ID_KEYS:
            raise ValueError(f"token role {role!r} unknown; allowed: {', '.join(_ID_KEYS)}")
        if text not in index:
            raise ValueError(f"{role} token {text!r} is not in the vocabulary; add it with special_tokens")
        fields[_ID_KEYS[role]] = index[text]
    if add_bos is not None:
        fields["tokenizer.ggml.add_bos_token"] = add_bos
    if chat_template is not None:
        fields["tokenizer.chat_template"] = chat_template
    return FamilyVocab(fields, tokens)


def _gguf_type(key: str, value: Any) -> Any:
    """The GGUF type llama.cpp's converter gives a tokenizer field holding `value`."""
    from gguf import GGUFValueType as T

    if isinstance(value, bool):
        return T.BOOL
    if isinstance(value, int):
        return T.UINT32  # token ids
    if isinstance(value, float):
        return T.FLOAT32
    if isinstance(value, str):
        return T.STRING
    if isinstance(value, list) and value:
        return _gguf_type(key, value[0]) if not isinstance(value[0], int) or isinstance(value[0], bool) else T.INT32
    raise ValueError(f"tokenizer field {key!r}: cannot write {type(value).__name__} {value!r:.40}")


def gguf_writer(path: str, architecture: str) -> Any:
    """A GGUFWriter that packs big arrays in one go (gguf-py packs a 150k-token list item by item: seconds)."""
    import struct

    import numpy as np
    from gguf import GGUFValueType as T
    from gguf import GGUFWriter

    class Writer(GGUFWriter):
        def _pack_val(self, val: Any, vtype: Any, add_vtype: bool, sub_type: Any = None) -> bytes:
            if vtype != T.ARRAY or sub_type not in (T.STRING, T.INT32, T.UINT32, T.FLOAT32) or not val:
                return super()._pack_val(val, vtype, add_vtype, sub_type)
            head = struct.pack("<I", vtype) if add_vtype else b""
            head += struct.pack("<IQ", sub_type, len(val))
            if sub_type == T.STRING:
                encoded = [v.encode("utf-8") for v in val]
                return head + b"".join(struct.pack("<Q", len(e)) + e for e in encoded)
            dtype = {T.INT32: "<i4", T.UINT32: "<u4", T.FLOAT32: "<f4"}[sub_type]
            return head + np.asarray(val, dtype=dtype).tobytes()

    return Writer(path, architecture)


def add_vocab_fields(writer: Any, vocab: FamilyVocab) -> None:
    """Every tokenizer field into a GGUFWriter."""
    from gguf import GGUFValueType

    for key, value in vocab.fields.items():
        if isinstance(value, list):
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=_gguf_type(key, value))
        else:
            writer.add_key_value(key, value, _gguf_type(key, value))


class VocabTokenizer:
    """llama.cpp's tokenizer over a FamilyVocab (read from a vocab-only GGUF in a temporary file, deleted once read);
    valid until close()."""

    def __init__(self, vocab: FamilyVocab, architecture: str = "gpt2") -> None:
        from ..llamacpp.tokenizer import open_vocab  # llama.cpp's own tokenizer: what the daemon will run

        fd, path = tempfile.mkstemp(prefix="evenflow-vocab-", suffix=".gguf")
        os.close(fd)
        try:
            writer = gguf_writer(path, architecture)
            add_vocab_fields(writer, vocab)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            self._tok = open_vocab(path)  # a vocab-only load reads the file whole
        finally:
            Path(path).unlink(missing_ok=True)

    def encode(self, text: str) -> list[int]:
        """Text as the daemon tokenizes a rendered prompt's middle: special tokens parsed, no BOS added."""
        return self._tok.encode(text, add_special=False, parse_special=True)

    def prompt(self, text: str) -> list[int]:
        """A whole rendered prompt, as the daemon tokenizes it (BOS per the vocab's rule)."""
        return self._tok.encode(text, add_special=True, parse_special=True)

    def text(self, ids: list[int]) -> str:
        return b"".join(self._tok.token_bytes(t) for t in ids).decode("utf-8", "replace")

    @property
    def eog_ids(self) -> set[int]:
        return set(self._tok.eos_ids)

    def close(self) -> None:
        self._tok.close()


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int, special: tuple[tuple[str, str], ...], ids: tuple[tuple[str, str], ...],
               add_bos: bool | None) -> tuple[FamilyVocab, VocabTokenizer]:
    vocab = family_vocab(path, dict(special), dict(ids), add_bos, None)
    return vocab, VocabTokenizer(vocab)


def family_tokenizer(vocab_path: str | Path, special_tokens: dict[str, str], ids: dict[str, str],
                     add_bos: bool | None) -> tuple[FamilyVocab, VocabTokenizer]:
    """family_vocab's vocabulary (without a template) and llama.cpp's tokenizer for it, kept for the next call (loading
    a 150k-token vocabulary takes seconds)."""
    path = str(Path(vocab_path).resolve())
    return _tokenizer(path, os.stat(path).st_mtime_ns, tuple(special_tokens.items()),  # in order: it picks the slots
                      tuple(sorted(ids.items())), add_bos)
