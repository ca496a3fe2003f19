"""Random weights and metadata of the GGUF-only architectures (archs.py), for gguf_writer.write_file."""
from __future__ import annotations

import numpy as np

from .archs import ARCHS, arch_shapes
from .spec import ModelSpec
from .random_weights import INIT_STD, is_norm, zero_non_text_rows

# Attention's query and key projections, and the recurrent layers' mixing weights: drawn with spec.qk_std (sharp
# attention, and a recurrent state that moves the logits, make cache bugs visible).
_QK = ("attn_q.weight", "attn_k.weight", "attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight",
       "attn_k_b.weight", "shortconv.in_proj.weight", "shortconv.conv.weight", "shortconv.out_proj.weight",
       "attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_beta.weight", "ssm_alpha.weight",
       "ssm_out.weight")


def arch_tensors(spec: ModelSpec) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array: normal(0, 0.02) from PCG64(seed) in the shapes' order, norms 1.0, and the values
    a working model needs elsewhere (a recurrent decay that decays, sinks of order one)."""
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    out: dict[str, np.ndarray] = {}
    for name, shape in arch_shapes(spec).items():
        w = rng.standard_normal(shape, dtype=np.float32)
        if is_norm(name):
            w = np.ones(shape, dtype=np.float32)
        elif name.endswith("ssm_a"):  # A = -exp(A_log): negative, so the delta-net state decays
            w = -np.exp(0.5 * w)
        elif name.endswith(("attn_sinks.weight", "ssm_dt.bias")):
            w *= np.float32(0.5)
        elif name.endswith("ffn_gate_inp.weight"):  # a router that actually routes: distinct expert scores
            w *= np.float32(0.5)
        else:
            w *= np.float32(spec.qk_std if name.endswith(_QK) else INIT_STD)
        out[name] = w
    if spec.text_only_output:
        zero_non_text_rows(spec, out["output.weight" if "output.weight" in out else "token_embd.weight"])
    return out


def write_arch_hparams(writer, spec: ModelSpec) -> None:
    ARCHS[spec.architecture].metadata(writer, spec, spec.arch_options)
