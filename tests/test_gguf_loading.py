"""GGUF loading: same logits as safetensors, quantised files, the GGUF-vocab tokenizer, corrupt files."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

from evenflow.backends.base import Batch, ModelLoadError, RunnerSettings, UnsupportedArchitecture
from evenflow.backends.common import open_model
from evenflow.backends.common.gguf_file import GGUFFile
from evenflow.backends.common.gguf_tokenizer import tokenizer_from_gguf
from evenflow.backends.torch.runner import load

BS = 16
TEXTS = [
    "Hello world", " Hello World!", "def f(x):\n    return x ** 2  # square\n", "\t\tindented\n\n\nlines   ",
    "Ünïcödé, 日本語 and emoji 🦙🚀", "numbers 1234567 3.14159 0x1F", "it's we'll they're I'D", "",
    "   leading and trailing   ", "<|im_end|> looks special", "a" * 50,
]


def logits(path, ids: list[int]) -> np.ndarray:
    runner = load(str(path), RunnerSettings(device="cpu", num_kv_blocks=16, block_size=BS))
    return runner.step(Batch.from_spans([(0, ids, 0, list(range(16)), True)], BS))[0]


def prompt(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.RandomState(seed).randint(0, 2048, n)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_f32_equals_safetensors(synthetic_model, arch):
    paths = synthetic_model("tiny", arch)
    g, h = open_model(str(paths["gguf"])), open_model(str(paths["hf"]))
    # Weight by weight: llama's Q/K rows come back un-permuted, everything else bit-identical.
    hf_weights = dict(h.iter_tensors())
    for name, w in g.iter_tensors():
        np.testing.assert_array_equal(w, hf_weights[name], err_msg=name)
    ids = prompt(48)
    diff = float(np.abs(logits(paths["gguf"], ids) - logits(paths["hf"], ids)).max())
    assert diff <= 1e-4, f"{arch}: gguf vs safetensors logits differ by {diff}"


@pytest.mark.parametrize("dtype,file_type,max_diff,min_corr", [("f16", "F16", 2e-3, 0.99999), ("q8_0", "Q8_0", 3e-2, 0.999)])
def test_quantized_gguf_stays_close(synthetic_model, dtype, file_type, max_diff, min_corr):
    ref_path = synthetic_model("tiny", "llama", formats=("gguf",))["gguf"]
    q_path = synthetic_model("tiny", "llama", formats=("gguf",), gguf_dtype=dtype)["gguf"]
    runner = load(str(q_path), RunnerSettings(device="cpu", num_kv_blocks=4))
    assert runner.info.file_type == file_type
    ids = prompt(40, 1)
    ref, got = logits(ref_path, ids), logits(q_path, ids)
    diff = float(np.abs(got - ref).max())
    assert 0 < diff <= max_diff, f"{dtype}: {diff}"  # > 0: the weights really were quantised
    assert np.corrcoef(got, ref)[0, 1] >= min_corr


def _requantize(src, dst, qtype: GGMLQuantizationType) -> None:
    """Copy a GGUF with every 2-D weight re-encoded as `qtype` (what llama-quantize does)."""
    reader = GGUFReader(str(src))
    writer = GGUFWriter(str(dst), arch=reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        data = np.array(t.data).reshape([int(d) for d in reversed(t.shape)])
        if data.ndim == 2 and "norm" not in t.name:
            writer.add_tensor(t.name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_q4_0_gguf_loads(synthetic_model, tmp_path):
    ref_path = synthetic_model("tiny", "llama", formats=("gguf",))["gguf"]
    q4 = tmp_path / "tiny-q4_0.gguf"
    _requantize(ref_path, q4, GGMLQuantizationType.Q4_0)
    ids = prompt(40, 2)
    ref, got = logits(ref_path, ids), logits(q4, ids)
    assert 0 < float(np.abs(got - ref).max()) < 0.2
    assert np.corrcoef(got, ref)[0, 1] > 0.98


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.BF16])
def test_k_quant_dequantisation_matches_gguf_reader(tmp_path, qtype):
    # gguf-py cannot quantise K-quants, so random blocks test our reader against its dequantizer.
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = 6, 512
    raw = np.random.RandomState(0).randint(0, 256, (rows, cols // block * size)).astype(np.uint8)
    path = tmp_path / "k.gguf"
    writer = GGUFWriter(str(path), arch="llama")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = GGUFFile(str(path)).array("blk.0.ffn_up.weight")
    ref_t = GGUFReader(str(path)).tensors[0]
    expected = dequantize(ref_t.data, qtype).reshape(rows, cols)
    assert ours.shape == (rows, cols) and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, expected)
    assert np.isfinite(ours).mean() > 0.5


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_vocab_tokenizer_equals_hf(synthetic_model, arch):
    paths = synthetic_model("tiny", arch)
    g, h = open_model(str(paths["gguf"])).tokenizer, open_model(str(paths["hf"])).tokenizer
    assert (g.vocab_size, g.bos_id, g.eos_ids, g.add_bos) == (h.vocab_size, h.bos_id, h.eos_ids, h.add_bos)
    for text in TEXTS:
        for add_special in (True, False):
            for parse_special in (True, False):
                a = g.encode(text, add_special=add_special, parse_special=parse_special)
                assert a == h.encode(text, add_special=add_special, parse_special=parse_special), text
        ids = g.encode(text, add_special=False, parse_special=False)
        assert g.decode(ids) == h.decode(ids) == text
        assert b"".join(g.token_bytes(i) for i in ids) == text.encode("utf-8")
    special = g.encode("<|im_end|>", add_special=False, parse_special=True)
    if len(special) == 1:  # the family has it: a control token, parsed only on request, no bytes
        assert special[0] in g.eos_ids and g.token_bytes(special[0]) == b""
        assert len(g.encode("<|im_end|>", add_special=False, parse_special=False)) > 1


VOCABS = ["llama-spm", "llama-bpe", "qwen2", "gpt-2", "phi-3"]


@pytest.mark.parametrize("name", VOCABS)
def test_gguf_vocab_reproduces_llama_cpp_vectors(fixtures_dir, name):
    path = fixtures_dir / "vocab" / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} not present")
    tok = tokenizer_from_gguf(GGUFFile(str(path)).metadata, str(path))
    inputs = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(inputs) > 40
    for text, line in zip(inputs, expected):
        assert tok.encode(text, add_special=False, parse_special=False) == [int(x) for x in line.split()], repr(text)


def test_spm_token_bytes_and_eos(fixtures_dir):
    path = fixtures_dir / "vocab" / "ggml-vocab-llama-spm.gguf"
    tok = tokenizer_from_gguf(GGUFFile(str(path)).metadata, str(path))
    ids = tok.encode("Hello 🦙", add_special=True)
    assert ids[0] == tok.bos_id == 1 and tok.add_bos and 2 in tok.eos_ids
    assert tok.token_bytes(1) == b"" and tok.token_bytes(2) == b""
    assert b"".join(tok.token_bytes(i) for i in ids) == " Hello 🦙".encode()  # ▁ -> space, <0xF0>.. bytes
    assert tok.decode(ids) == "Hello 🦙"


def test_truncated_or_corrupt_gguf_raises_naming_the_file(synthetic_model, tmp_path):
    src = synthetic_model("tiny", "llama", formats=("gguf",))["gguf"]
    data = src.read_bytes()
    for cut in (2, 20, 3000, len(data) // 2, len(data) - 10):
        bad = tmp_path / f"cut-{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match=f"cut-{cut}.gguf"):
            load(str(bad), RunnerSettings(device="cpu", num_kv_blocks=4))
    wrong_version = tmp_path / "v9.gguf"
    wrong_version.write_bytes(data[:4] + (9).to_bytes(4, "little") + data[8:])
    with pytest.raises(ModelLoadError, match="v9.gguf.*version 9"):
        load(str(wrong_version), RunnerSettings(device="cpu"))


def test_unsupported_gguf_architecture(tmp_path):
    path = tmp_path / "falcon.gguf"
    writer = GGUFWriter(str(path), arch="falcon")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitecture, match="falcon.gguf.*'falcon'.*llama, mistral, qwen2, qwen3"):
        load(str(path), RunnerSettings(device="cpu"))


def test_gguf_model_info_metadata(synthetic_model):
    path = synthetic_model("tiny", "qwen2", formats=("gguf",), gguf_dtype="q8_0")["gguf"]
    runner = load(str(path), RunnerSettings(device="cpu", num_kv_blocks=4))
    md = runner.info.metadata
    assert runner.info.file_type == "Q8_0" and runner.info.architecture == "qwen2"
    assert md["general.architecture"] == "qwen2" and md["qwen2.context_length"] == 2048
    assert md["qwen2.block_count"] == 2 and md["general.parameter_count"] == runner.info.parameter_count
    assert not any(isinstance(v, list) for v in md.values())  # vocab arrays stay out of /api/show
