"""The torch runner against transformers (the oracle), mixed-batch and chunking invariance, KV and errors."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from evenflow.backends.base import Batch, ModelLoadError, RunnerSettings, UnsupportedArchitecture
from evenflow.backends.synthetic import LLAMA3_ROPE_SCALING
from evenflow.backends.torch.runner import load

BS = 16
TOL = 1e-4


class Blocks:
    """A tiny stand-in for the engine's block manager: grows each slot's block table on demand."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks))
        self.tables: dict[int, list[int]] = {}

    def table(self, slot: int, upto: int) -> list[int]:
        t = self.tables.setdefault(slot, [])
        while len(t) * BS < upto:
            t.append(self.free.pop(0))
        return list(t)


def run_chunks(runner, blocks: Blocks, slot: int, tokens: list[int], chunks: list[int], start_pos: int = 0) -> np.ndarray:
    """Feed `tokens` in chunks of the given sizes (cycled); return the last token's logits."""
    pos, i, out = start_pos, 0, None
    while pos < start_pos + len(tokens):
        n = min(chunks[i % len(chunks)], start_pos + len(tokens) - pos)
        toks = tokens[pos - start_pos : pos - start_pos + n]
        last = pos + n == start_pos + len(tokens)
        out = runner.step(Batch.from_spans([(slot, toks, pos, blocks.table(slot, pos + n), last)], BS))
        pos, i = pos + n, i + 1
    assert out is not None and out.shape[0] == 1
    return out[0]


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.RandomState(seed).randint(0, vocab, n)]


@pytest.fixture(scope="module")
def tiny_llama(synthetic_model):
    return synthetic_model("tiny", "llama")


def new_runner(path, **kw):
    kw.setdefault("num_kv_blocks", 96)
    return load(str(path), RunnerSettings(device="cpu", dtype="float32", block_size=BS, **kw))


ORACLE_CASES = [
    ("llama", {}, 40),
    ("llama", {"rope_scaling": LLAMA3_ROPE_SCALING}, 300),  # long enough for the scaled frequencies to matter
    ("qwen2", {}, 40),
    ("qwen3", {}, 40),
]


@pytest.mark.parametrize("arch,overrides,n_prompt", ORACLE_CASES, ids=["llama", "llama3-rope", "qwen2", "qwen3"])
def test_logits_match_transformers(synthetic_model, arch, overrides, n_prompt):
    transformers = pytest.importorskip("transformers")
    paths = synthetic_model("tiny", arch, formats=("hf",), **overrides)
    runner = new_runner(paths["hf"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(paths["hf"]), torch_dtype=torch.float32).eval()
    blocks = Blocks(runner.num_kv_blocks)
    ids = prompt_ids(n_prompt, runner.info.vocab_size, seed=1)
    ours = runner.step(Batch.from_spans([(0, ids, 0, blocks.table(0, len(ids)), True)], BS))[0]
    worst = 0.0
    for _ in range(16):
        with torch.no_grad():
            theirs = ref(torch.tensor([ids])).logits[0, -1].numpy()
        worst = max(worst, float(np.abs(ours - theirs).max()))
        nxt = int(ours.argmax())  # greedy, fed back
        ids.append(nxt)
        ours = runner.step(Batch.from_spans([(0, [nxt], len(ids) - 1, blocks.table(0, len(ids)), True)], BS))[0]
    assert worst <= TOL, f"{arch}: max |ours - transformers| = {worst}"
    if overrides.get("rope_scaling"):
        # The check above must be able to see the scaling: unscaled RoPE gives visibly different logits.
        plain = new_runner(synthetic_model("tiny", arch, formats=("hf",))["hf"])
        p_blocks = Blocks(plain.num_kv_blocks)
        first = ids[:n_prompt]
        scaled = runner.step(Batch.from_spans([(1, first, 0, blocks.table(1, n_prompt), True)], BS))[0]
        unscaled = plain.step(Batch.from_spans([(0, first, 0, p_blocks.table(0, n_prompt), True)], BS))[0]
        assert float(np.abs(scaled - unscaled).max()) > 20 * max(worst, 1e-6)


def test_mixed_batch_equals_each_sequence_alone(tiny_llama):
    runner = new_runner(tiny_llama["hf"])
    vocab = runner.info.vocab_size
    blocks = Blocks(runner.num_kv_blocks)
    prompts = [prompt_ids(n, vocab, seed=s) for s, n in ((10, 17), (11, 33), (12, 5), (13, 52))]
    # Slots 0-2 are decoding; slot 3 has 20 prompt tokens cached and sends a 32-token chunk.
    for slot in range(3):
        run_chunks(runner, blocks, slot, prompts[slot], [64])
    run_chunks(runner, blocks, 3, prompts[3][:20], [64])
    nexts = [7, 99, 1234]
    spans = [(s, [nexts[s]], len(prompts[s]), blocks.table(s, len(prompts[s]) + 1), True) for s in range(3)]
    spans.insert(1, (3, prompts[3][20:52], 20, blocks.table(3, 52), True))  # the chunk sits between decodes
    mixed = runner.step(Batch.from_spans(spans, BS))
    assert mixed.shape == (4, vocab) and mixed.dtype == np.float32
    for row, (slot, *_rest) in enumerate(spans):
        alone_runner = new_runner(tiny_llama["hf"])
        alone_blocks = Blocks(alone_runner.num_kv_blocks)
        seq = prompts[slot] + [nexts[slot]] if slot < 3 else prompts[3]
        alone = run_chunks(alone_runner, alone_blocks, 0, seq, [len(seq)])
        diff = float(np.abs(mixed[row] - alone).max())
        assert diff <= TOL, f"slot {slot}: mixed vs alone differ by {diff}"


def test_chunked_prefill_matches_one_shot(tiny_llama):
    runner = new_runner(tiny_llama["gguf"])
    ids = prompt_ids(75, runner.info.vocab_size, seed=3)
    blocks = Blocks(runner.num_kv_blocks)
    one_shot = run_chunks(runner, blocks, 0, ids, [len(ids)])
    for slot, chunks in enumerate(([1], [7], [16], [1, 7, 16]), start=1):
        got = run_chunks(runner, blocks, slot, ids, chunks)
        assert float(np.abs(got - one_shot).max()) <= TOL, f"chunks {chunks}"


def test_rows_without_logits_and_span_order(tiny_llama):
    runner = new_runner(tiny_llama["hf"])
    blocks = Blocks(runner.num_kv_blocks)
    a, b = prompt_ids(9, runner.info.vocab_size, 4), prompt_ids(12, runner.info.vocab_size, 5)
    out = runner.step(Batch.from_spans([(0, a, 0, blocks.table(0, 9), False), (1, b, 0, blocks.table(1, 12), True)], BS))
    assert out.shape == (1, runner.info.vocab_size)
    alone = run_chunks(new_runner(tiny_llama["hf"]), Blocks(96), 0, b, [12])
    assert float(np.abs(out[0] - alone).max()) <= TOL
    empty = runner.step(Batch([], [], [], BS))
    assert empty.shape == (0, runner.info.vocab_size)


def test_embed_matches_transformers_and_leaves_kv_alone(tiny_llama):
    transformers = pytest.importorskip("transformers")
    runner = new_runner(tiny_llama["hf"], num_kv_blocks=8)
    before = [k.clone() for k in runner.kv.k]
    ids = prompt_ids(21, runner.info.vocab_size, 6)
    emb = runner.embed(ids)
    ref = transformers.AutoModel.from_pretrained(str(tiny_llama["hf"]), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).last_hidden_state[0].numpy()
    assert emb.shape == (21, runner.info.embedding_length) and emb.dtype == np.float32
    assert float(np.abs(emb - theirs).max()) <= TOL
    assert all(torch.equal(k0, k1) for k0, k1 in zip(before, runner.kv.k))


def test_model_info_and_kv_layout(tiny_llama, synthetic_model):
    from evenflow.backends.synthetic import make_spec

    from evenflow.backends.base import Runner, Tokenizer, load_runner

    runner = load_runner("torch", str(tiny_llama["gguf"]), RunnerSettings(device="cpu", max_num_seqs=3, block_size=BS))
    assert isinstance(runner, Runner) and isinstance(runner.tokenizer, Tokenizer) and runner.backend == "torch"
    spec = make_spec("tiny")
    info = runner.info
    assert (info.architecture, info.vocab_size, info.context_length) == ("llama", 2048, 2048)
    assert (info.embedding_length, info.block_count, info.head_count, info.head_count_kv) == (64, 2, 4, 2)
    assert info.parameter_count == spec.parameter_count() and info.file_type == "F32"
    assert info.metadata["general.architecture"] == "llama" and info.metadata["llama.context_length"] == 2048
    # Default sizing: every slot can hold a full context window.
    assert runner.num_kv_blocks == 3 * 2048 // BS and runner.max_num_seqs == 3 and runner.block_size == BS
    assert tuple(runner.kv.k[0].shape) == (runner.num_kv_blocks, BS, 2, 16) and len(runner.kv.v) == 2
    assert runner.tokenizer.eos_ids and runner.chat_template
    runner.free(0)  # paged memory: a no-op that must exist
    runner.close()
    with pytest.raises(RuntimeError):
        runner.step(Batch.from_spans([(0, [1], 0, [0], True)], BS))


def test_bfloat16_on_cpu_stays_close(tiny_llama):
    ids = prompt_ids(30, 2048, 7)
    ref = run_chunks(new_runner(tiny_llama["hf"]), Blocks(96), 0, ids, [30])
    bf = load(str(tiny_llama["hf"]), RunnerSettings(device="cpu", dtype="bfloat16", num_kv_blocks=8))
    assert bf.kv.k[0].dtype == torch.bfloat16
    got = run_chunks(bf, Blocks(8), 0, ids, [30])
    assert got.dtype == np.float32 and float(np.abs(got - ref).max()) < 0.05
    assert np.corrcoef(got, ref)[0, 1] > 0.99


def test_bad_batches_and_settings_raise(tiny_llama):
    runner = new_runner(tiny_llama["hf"], num_kv_blocks=4)
    with pytest.raises(ValueError, match="block_table"):
        runner.step(Batch.from_spans([(0, list(range(20)), 0, [0], True)], BS))  # 20 tokens need 2 blocks
    with pytest.raises(ValueError, match="outside"):
        runner.step(Batch.from_spans([(0, [1, 2], 0, [9], True)], BS))  # block 9 of 4
    with pytest.raises(ValueError, match="token id 5000"):
        runner.step(Batch.from_spans([(0, [5000], 0, [0], True)], BS))
    with pytest.raises(ValueError, match="block_size"):
        runner.step(Batch.from_spans([(0, [1], 0, [0], True)], 32))
    with pytest.raises(ValueError, match="dtype 'float8'"):
        load(str(tiny_llama["hf"]), RunnerSettings(device="cpu", dtype="float8"))
    with pytest.raises(ValueError, match="device 'tpu'"):
        load(str(tiny_llama["hf"]), RunnerSettings(device="tpu"))


def test_load_errors_name_the_problem(tiny_llama, tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load(str(tmp_path / "nope.gguf"), RunnerSettings(device="cpu"))
    with pytest.raises(ModelLoadError, match="not a GGUF file nor an HF directory"):
        load(str(tmp_path), RunnerSettings(device="cpu"))
    bad = tmp_path / "neox"
    shutil.copytree(tiny_llama["hf"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "gpt_neox", ["GPTNeoXForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitecture, match="'gpt_neox'.*llama, mistral, qwen2, qwen3"):
        load(str(bad), RunnerSettings(device="cpu"))
    gone = tmp_path / "noweights"
    shutil.copytree(tiny_llama["hf"], gone)
    for f in gone.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load(str(gone), RunnerSettings(device="cpu"))


def test_model_args_from_config_variants():
    from evenflow.backends.common.model_args import ModelArgs

    base = dict(model_type="llama", hidden_size=64, num_hidden_layers=1, intermediate_size=8,
                num_attention_heads=4, vocab_size=10)
    # transformers >= 5 nests theta and scaling in rope_parameters.
    args = ModelArgs.from_hf_config({**base, "rope_parameters": {"rope_theta": 5e5, **LLAMA3_ROPE_SCALING}})
    assert args.rope_theta == 5e5 and args.rope_scaling["rope_type"] == "llama3"
    assert ModelArgs.from_hf_config({**base, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}).rope_scaling is None
    args = ModelArgs.from_hf_config({**base, "model_type": "qwen3", "head_dim": 32, "num_key_value_heads": 2})
    assert (args.head_dim, args.num_key_value_heads, args.qk_norm, args.attention_bias) == (32, 2, True, False)
    assert ModelArgs.from_hf_config({**base, "model_type": "qwen2"}).attention_bias
    with pytest.raises(ModelLoadError, match="'yarn'.*linear, llama3"):
        ModelArgs.from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ModelLoadError, match="missing required key 'hidden_size'"):
        ModelArgs.from_hf_config({k: v for k, v in base.items() if k != "hidden_size"})
