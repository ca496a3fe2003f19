"""A tokenizer family: the special tokens, pre-tokenizer and chat template shared by the architectures of one model
family (tokenizer.py has the Llama-shaped ones, arch_families.py those of the GGUF-only architectures)."""
from __future__ import annotations

from dataclasses import dataclass

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Family:
    """Special tokens, pre-tokenizer and chat template shared by the architectures of one model family."""

    specials: tuple[str, ...]  # control tokens
    user_defined: tuple[str, ...]  # added non-special tokens (always parsed, rendered in output)
    specials_first: bool  # Mistral puts specials at ids 0..; Llama 3 / Qwen append them after the BPE vocab
    bos: str | None
    eos: str
    eot: str | None
    pad: str | None
    unk: str | None
    stop: tuple[str, ...]  # every end-of-generation token
    add_bos: bool
    pre: str  # tokenizer.ggml.pre
    pattern: str
    ignore_merges: bool  # llama.cpp's llama-bpe takes a whole word that is in the vocab as one token
    chat_template: str
