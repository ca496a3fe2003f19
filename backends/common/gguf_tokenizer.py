"""Build an `HFTokenizer` from a GGUF file's `tokenizer.ggml.*` vocabulary, matching llama.cpp's tokenizers."""
from __future__ import annotations

import logging
from typing import Any

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, normalizers, pre_tokenizers

from ..base import ModelLoadError
from .hf_tokenizer import HFTokenizer

log = logging.getLogger(__name__)

# llama.cpp token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_RE = None  # the ByteLevel pre-tokenizer's built-in GPT-2 regex
# tokenizer.ggml.pre -> (split regex, ignore_merges, default add_bos), after llama.cpp's llama-vocab.cpp.
PRE_TOKENIZERS: dict[str, tuple[str | None, bool, bool]] = {
    "llama-bpe": (_LLAMA3_RE, True, True),
    "llama3": (_LLAMA3_RE, True, True),
    "llama-v3": (_LLAMA3_RE, True, True),
    "smaug-bpe": (_LLAMA3_RE, False, False),
    "qwen2": (_QWEN2_RE, False, False),
    "deepseek-r1-qwen": (_QWEN2_RE, False, True),
    "gpt-2": (_GPT2_RE, False, False),
    "gpt2": (_GPT2_RE, False, False),
    "default": (_GPT2_RE, False, False),
}
SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")


def _added_tokens(tokens: list[str], types: list[int]) -> list[AddedToken]:
    """Control tokens become special added tokens (parse_special gated); user-defined ones always match."""
    out = []
    for tok, kind in zip(tokens, types):
        if kind == CONTROL:
            out.append(AddedToken(tok, special=True, normalized=False))
        elif kind == USER_DEFINED:
            out.append(AddedToken(tok, special=False, normalized=False))
    return out


def _byte_level_bpe(md: dict[str, Any], tokens: list[str], source: str) -> tuple[HFTok, bool]:
    pre = str(md.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        # llama.cpp does the same: an unknown pre-tokenizer falls back to the default regex.
        log.warning("%s: unknown tokenizer.ggml.pre %r, using the GPT-2 regex; known: %s",
                    source, pre, ", ".join(PRE_TOKENIZERS))
        pre = "default"
    regex, ignore_merges, default_bos = PRE_TOKENIZERS[pre]
    merges_raw = md.get("tokenizer.ggml.merges")
    if merges_raw is None:
        raise ModelLoadError(f"{source}: byte-level BPE vocabulary without tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in merges_raw]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = HFTok(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    return tok, default_bos


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece/llama.cpp's best-score bigram merging."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, UNUSED)}
    ranked: list[tuple[float, int, int, tuple[str, str]]] = []
    for piece, pid in vocab.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-scores[pid], vocab[left], vocab[right], (left, right)))
    ranked.sort()
    return [m for *_, m in ranked]


def _spm_bpe(md: dict[str, Any], tokens: list[str], types: list[int], source: str) -> HFTok:
    scores = md.get("tokenizer.ggml.scores")
    if scores is None:
        raise ModelLoadError(f"{source}: SentencePiece vocabulary without tokenizer.ggml.scores")
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=_spm_merges(tokens, list(scores), types),
                     unk_token=tokens[int(unk_id)] if unk_id is not None else None,
                     byte_fallback=True, fuse_unk=True)
    tok = HFTok(bpe)
    norm = [normalizers.Replace(" ", "\u2581")]
    strip = []
    if md.get("tokenizer.ggml.add_space_prefix", True):
        norm.insert(0, normalizers.Prepend("\u2581"))
        strip = [decoders.Strip(" ", 1, 0)]
    tok.normalizer = normalizers.Sequence(norm)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    return tok


def tokenizer_from_gguf(md: dict[str, Any], source: str) -> HFTokenizer:
    """A tokenizer equivalent to llama.cpp's for the GGUF's `tokenizer.ggml.model` (gpt2 or llama)."""
    kind = md.get("tokenizer.ggml.model")
    tokens = md.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise ModelLoadError(f"{source}: no tokenizer in the GGUF (tokenizer.ggml.model / tokens missing)")
    tokens = list(tokens)
    types = list(md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if kind == "gpt2":
        tok, default_bos = _byte_level_bpe(md, tokens, source)
        scheme = "byte_level"
    elif kind == "llama":
        tok, default_bos, scheme = _spm_bpe(md, tokens, types, source), True, "spm"
    else:
        raise ModelLoadError(
            f"{source}: tokenizer model {kind!r} is not supported; supported: {', '.join(SUPPORTED_TOKENIZER_MODELS)}"
        )
    added = _added_tokens(tokens, types)
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])
    bos_id = md.get("tokenizer.ggml.bos_token_id")
    eos_id = md.get("tokenizer.ggml.eos_token_id")
    eos_ids = {int(md[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                    "tokenizer.ggml.eom_token_id") if md.get(k) is not None}
    control = [i for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)]
    return HFTokenizer(
        tok,
        bos_id=int(bos_id) if bos_id is not None else None,
        eos_ids=eos_ids,
        add_bos=bool(md.get("tokenizer.ggml.add_bos_token", default_bos)),
        add_eos=bool(md.get("tokenizer.ggml.add_eos_token", False)),
        eos_id=int(eos_id) if eos_id is not None else None,
        byte_scheme=scheme,
        control_ids=control,
    )
