"""The shared GGUF parser's lazy mode: same values as a full read, indexed reads, bounds checks, speed."""
from __future__ import annotations

import time

import pytest
from gguf import GGUFReader

from evenflow.backends.base import ModelLoadError
from evenflow.backends.common.gguf_file import GGUFArray, GGUFFile
from evenflow.backends.llamacpp.gguf_info import read_header
from evenflow.daemon.store.weight_info import WeightsError, read_gguf


def test_lazy_arrays_read_the_same_values_as_a_full_read(synthetic_model):
    path = str(synthetic_model("tiny", "llama", formats=("gguf",))["gguf"])
    full = GGUFFile(path)
    with GGUFFile(path, lazy_arrays_over=5) as lazy:
        assert full.metadata.keys() == lazy.metadata.keys() and full.tensors == lazy.tensors
        toks = lazy.metadata["tokenizer.ggml.tokens"]
        assert isinstance(toks, GGUFArray) and len(toks) == len(full.metadata["tokenizer.ggml.tokens"])
        for key, value in lazy.metadata.items():
            if isinstance(value, GGUFArray):
                assert value.tolist() == full.metadata[key] and list(value) == full.metadata[key]
                assert value[-1] == full.metadata[key][-1] and value[len(value) // 2] == full.metadata[key][len(value) // 2]
            else:
                assert value == full.metadata[key]
        with pytest.raises(IndexError, match=f"out of range for {len(toks)}"):
            toks[len(toks)]
    with pytest.raises(ValueError, match="closed"):
        toks[0]
    full.close()
    # the token strings agree with gguf's own reader
    reader = GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    assert [str(bytes(field.parts[i]), "utf-8") for i in field.data[:20]] == full.metadata["tokenizer.ggml.tokens"][:20]


def test_cut_inside_a_lazy_array_names_the_file_in_every_reader(synthetic_model, tmp_path):
    src = synthetic_model("tiny", "llama", formats=("gguf",))["gguf"]
    data = src.read_bytes()
    with GGUFFile(str(src), lazy_arrays_over=5) as gf:
        toks = gf.metadata["tokenizer.ggml.tokens"]
        cut_at = toks.start + 40  # a few strings into the token list
    bad = tmp_path / "cut-vocab.gguf"
    bad.write_bytes(data[:cut_at])
    with pytest.raises(ModelLoadError, match="cut-vocab.gguf: truncated GGUF.*tokenizer.ggml.tokens"):
        GGUFFile(str(bad), lazy_arrays_over=5)
    with pytest.raises(ModelLoadError, match="cut-vocab.gguf: truncated"):
        read_header(str(bad))
    with pytest.raises(WeightsError, match="cut-vocab.gguf: truncated"):
        read_gguf(bad)


def test_lazy_header_of_a_150k_vocab_is_fast(fixtures_dir):
    path = str(fixtures_dir / "vocab" / "ggml-vocab-qwen2.gguf")
    if not (fixtures_dir / "vocab" / "ggml-vocab-qwen2.gguf").exists():
        pytest.skip("qwen2 vocab fixture missing")
    t0 = time.perf_counter()
    with GGUFFile(path, lazy_arrays_over=1024) as gf:
        elapsed = time.perf_counter() - t0
        toks = gf.metadata["tokenizer.ggml.tokens"]
        assert len(toks) > 150_000 and toks[gf.metadata["tokenizer.ggml.eos_token_id"]] == "<|endoftext|>"
    assert elapsed < 0.5, f"lazy header read took {elapsed:.3f}s"  # ~0.03 s here; loose for slow CI machines
    info = read_gguf(path)
    assert info.eos_token == "<|endoftext|>" and info.metadata["tokenizer.ggml.tokens"] == []
