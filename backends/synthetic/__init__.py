"""Synthetic model factory: random-weight models of a given shape as HF directories and GGUF files, same weights.

No weights can be downloaded in tests, so every backend loads models made here. The tokenizer is a real
byte-level BPE trained on Python stdlib sources; llama.cpp tokenises our GGUF exactly as HF does the HF dir.
Scripted models (scripted.py: ScriptedSpec, Reply, cached_scripted) are GGUFs in a real family's vocabulary and
chat template whose greedy reply to a given prompt is a given text, for testing each family's output formats.
"""
from .factory import FORMATS, cached_model, gguf_filename, make_model
from .gguf_writer import GGUF_DTYPES, gguf_name, gguf_tensors, write_gguf
from .hf import write_hf
from .spec import ARCHITECTURES, LLAMA3_ROPE_SCALING, PRESETS, ModelSpec, make_spec, spec_hash
from .tokenizer import Vocab, cache_dir, family_for, vocab_for
from .random_weights import build_weights, llama3_rope_factors, permute_qk, tensor_shapes, unpermute_qk

__all__ = [
    "ARCHITECTURES", "FORMATS", "GGUF_DTYPES", "LLAMA3_ROPE_SCALING", "PRESETS", "ModelSpec", "Vocab",
    "build_weights", "cache_dir", "cached_model", "family_for", "gguf_filename", "gguf_name", "gguf_tensors",
    "llama3_rope_factors", "make_model", "make_spec", "permute_qk", "spec_hash", "tensor_shapes", "unpermute_qk",
    "vocab_for", "write_gguf", "write_hf",
]
