"""The scripted model's weights, set by hand: a one-layer GPT-2 that predicts the next token from the last
CONTEXT tokens, looked up in a table of the contexts its scripts need.

Residual stream (N_EMBD = 256), every part zero-sum so LayerNorm only rescales, by a constant:
  CLS     [0, 12)     the current token's code (token_embd): a balanced ±1 codeword per token the scripts use,
                      one shared codeword for every other token
  slot h  [12h, 12h+12), h = 1..16   the code of the token h positions back, copied by attention head h-1
  POS     [204, 238)  position embedding: cos/sin of 8 frequencies, negated copies, and a constant pair (+1, -1)
  OUT     [238, 254)  the output: a balanced ±1 codeword per used token (tied embeddings, so also in token_embd,
                      scaled down to EPS there)
Head h-1 attends from p to p-h: its query is the position embedding rotated back by h steps, its key the position
embedding, so the score (a sum of cosines of the offset error) peaks at p-h and beats every other position within
the context length by >= 32 (the frequencies' margin is checked, the scale set from it; the greedy search that chose
THETAS gave a margin of ~2 for 8k positions). GELU sees +-Z = 24, where ggml computes it exactly. One MLP neuron per
(context, next token): it sums code agreements over its context's slots, a perfect match scores 12 per slot and any
mismatch at least 4 less (distinct balanced codewords differ in >= 2 places), and the threshold sits in the middle,
scaled by the constant pair so it holds whatever LayerNorm's scale. A firing neuron writes A x the next token's OUT
code; the FFN bias writes BETA x the end-of-generation token's, so a context no script knows ends the reply.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

N_EMBD, N_HEAD, HEAD_DIM = 256, 16, 16
N_CODE, N_OUT = 12, 16
CONTEXT = N_HEAD + 1  # the current token and the 16 before it
THETAS = (0.06892889, 0.19428335, 0.2279191, 0.24779017, 0.31281091, 1.13724399, 2.06595293, 2.28626634)
N_FREQ = len(THETAS)
POS = N_CODE * CONTEXT  # 204
COS, SIN, NCOS, NSIN = POS, POS + N_FREQ, POS + 2 * N_FREQ, POS + 3 * N_FREQ
REF = POS + 4 * N_FREQ  # 236: +1, 237: -1
OUT = REF + 2  # 238
EPS, A, BETA, Z, OUT_GAIN = 1 / 16, 64.0, 1.0, 24.0, 20.0
NORM_EPS = 1e-5


@dataclass
class SparseRows:
    """A matrix whose rows all equal `default` but those in `rows` (token_embd: only used tokens differ)."""

    n_rows: int
    default: np.ndarray
    rows: dict[int, np.ndarray]

    def dense(self) -> np.ndarray:
        out = np.tile(self.default, (self.n_rows, 1))
        for i, r in self.rows.items():
            out[i] = r
        return out


@dataclass(frozen=True)
class Neuron:
    """Fires when the last len(context) tokens are `context` (most recent first) and writes `target`'s logit."""

    context: tuple[int, ...]
    target: int


def balanced_codes(n: int, count: int) -> np.ndarray:
    """`count` distinct ±1 vectors of length n with n/2 of each sign, in a fixed order."""
    out = []
    for ones in itertools.combinations(range(n), n // 2):
        v = -np.ones(n, dtype=np.float32)
        v[list(ones)] = 1
        out.append(v)
        if len(out) == count:
            return np.stack(out)
    raise ValueError(f"only {len(out)} balanced codewords of length {n}, {count} needed")


def position_margin(n_ctx: int) -> float:
    """How far the attention score at the wanted offset stands above any other offset within n_ctx."""
    d = np.arange(1, n_ctx + CONTEXT, dtype=np.float64)
    return float(N_FREQ - np.cos(np.outer(d, THETAS)).sum(axis=1).max())


def compile_neurons(sequences: list[tuple[list[int], list[int]]],
                    describe: Callable[[list[int]], str] = str) -> list[Neuron]:
    """The neurons that make each (prompt, script) continue exactly: for every token to predict, the shortest context
    (up to CONTEXT tokens) that no position predicting another token shares. ValueError where none is short enough;
    `describe` shows token ids in its message."""
    positions: list[tuple[int, list[int], int, int]] = []  # (reply, sequence, index of the current token, next)
    for r, (prompt, script) in enumerate(sequences):
        if not prompt:
            raise ValueError(f"reply {r}: a scripted reply needs a non-empty prompt to follow")
        z = list(prompt) + list(script)
        positions += [(r, z, q, z[q + 1]) for q in range(len(prompt) - 1, len(z) - 1)]
    index: dict[int, dict[tuple[int, ...], set[int]]] = {}

    def context(z: list[int], q: int, m: int) -> tuple[int, ...]:
        return tuple(z[q - i] for i in range(min(m, q + 1)))

    def targets(ctx: tuple[int, ...]) -> set[int]:
        """Next tokens after `ctx` anywhere, a position nearer the start than len(ctx) counting as a match."""
        m = len(ctx)
        if m not in index:
            index[m] = {}
            for _, z, q, t in positions:
                index[m].setdefault(context(z, q, m), set()).add(t)
        out = set(index[m].get(ctx, ()))
        for n in range(1, m):  # positions with only n tokens before them (a prompt shorter than the context)
            out |= index[m].get(ctx[:n], set())  # such keys come only from those positions
        return out

    neurons: dict[Neuron, None] = {}
    for r, z, q, target in positions:
        for m in range(1, min(CONTEXT, q + 1) + 1):
            ctx = context(z, q, m)
            if targets(ctx) == {target}:
                neurons[Neuron(ctx, target)] = None
                break
        else:
            others = sorted(targets(ctx) - {target})
            where = f"reply {r}, token {q + 1 - len(sequences[r][0])} ({describe([target])!r})"
            if q + 1 < CONTEXT:
                raise ValueError(f"{where}: its prompt of {q + 1} tokens cannot tell it apart from "
                                 f"{describe(others)!r}; give the reply a longer prompt")
            raise ValueError(f"{where} follows {describe(list(reversed(ctx)))!r}, as {describe(others)!r} does "
                             f"elsewhere: a scripted model sees {CONTEXT} tokens back, so two replies (or two places "
                             "in one) must not share that long a stretch with different continuations")
    return list(neurons)


def _norm_scale(sq_norm: float) -> float:
    """What LayerNorm divides a zero-mean vector of this squared norm by."""
    return math.sqrt(sq_norm / N_EMBD + NORM_EPS)


def build_tensors(neurons: list[Neuron], n_vocab: int, end_id: int,
                  n_ctx: int) -> dict[str, np.ndarray | SparseRows]:
    """GGUF name -> float32 array (numpy layout: rows are outputs) for a gpt2-architecture model; token_embd as
    SparseRows."""
    margin = position_margin(n_ctx)
    if margin < 1.0:
        raise ValueError(f"context length {n_ctx}: position attention margin {margin:.2f} is too small")
    kappa = 32.0 / margin  # the wanted position's score beats any other by >= 32 (e^-32 x n_ctx stays negligible)
    used = sorted({t for n in neurons for t in (*n.context, n.target)} | {end_id})
    codes = balanced_codes(N_CODE, len(used) + 1)  # codeword 0: every token the scripts never use
    outs = balanced_codes(N_OUT, len(used))
    row = {t: i for i, t in enumerate(used)}

    embd = SparseRows(n_vocab, np.zeros(N_EMBD, dtype=np.float32), {})
    embd.default[:N_CODE] = codes[0]
    for t, i in row.items():
        embd.rows[t] = np.zeros(N_EMBD, dtype=np.float32)
        embd.rows[t][:N_CODE] = codes[i + 1]
        embd.rows[t][OUT:OUT + N_OUT] = EPS * outs[i]

    p = np.arange(n_ctx, dtype=np.float64)[:, None] * np.asarray(THETAS)[None, :]
    pos = np.zeros((n_ctx, N_EMBD), dtype=np.float32)
    pos[:, COS:SIN], pos[:, SIN:NCOS] = np.cos(p), np.sin(p)
    pos[:, NCOS:NSIN], pos[:, NSIN:REF] = -np.cos(p), -np.sin(p)
    pos[:, REF], pos[:, REF + 1] = 1.0, -1.0

    # LayerNorm scales of the layer's input (token + position) and of the MLP's input (+ 16 copied codes)
    sigma0 = _norm_scale(N_CODE + 2 * N_FREQ + 2)
    sigma1 = _norm_scale(N_CODE * CONTEXT + 2 * N_FREQ + 2)
    gamma = 2 * math.sqrt(kappa)  # q.k / sqrt(HEAD_DIM) = gamma^2 / 4 x sum of cosines
    qkv = np.zeros((3 * N_EMBD, N_EMBD), dtype=np.float32)
    wo = np.zeros((N_EMBD, N_EMBD), dtype=np.float32)
    for k in range(N_HEAD):
        h, base = k + 1, k * HEAD_DIM
        for f, theta in enumerate(THETAS):
            c, s = math.cos(h * theta), math.sin(h * theta)
            qkv[base + f, COS + f], qkv[base + f, SIN + f] = gamma * sigma0 * c, gamma * sigma0 * s
            qkv[base + N_FREQ + f, SIN + f], qkv[base + N_FREQ + f, COS + f] = gamma * sigma0 * c, -gamma * sigma0 * s
            qkv[N_EMBD + base + f, COS + f] = gamma * sigma0
            qkv[N_EMBD + base + N_FREQ + f, SIN + f] = gamma * sigma0
        for d in range(N_CODE):
            qkv[2 * N_EMBD + base + d, d] = sigma0  # the value is the source token's code, at amplitude 1
            wo[N_CODE * h + d, base + d] = 1.0

    lam = Z * sigma1 / 2  # a perfect match gives Z, any mismatch at most -Z
    up = np.zeros((len(neurons), N_EMBD), dtype=np.float32)
    down = np.zeros((N_EMBD, len(neurons)), dtype=np.float32)
    for n, neuron in enumerate(neurons):
        for h, tok in enumerate(neuron.context):
            up[n, N_CODE * h:N_CODE * (h + 1)] = lam * codes[row[tok] + 1]
        bias = lam * (N_CODE * len(neuron.context) - 2) / 2
        up[n, REF], up[n, REF + 1] = -bias, bias
        down[OUT:OUT + N_OUT, n] = (A / Z) * outs[row[neuron.target]]
    down_bias = np.zeros(N_EMBD, dtype=np.float32)
    down_bias[OUT:OUT + N_OUT] = BETA * outs[row[end_id]]
    out_norm = np.zeros(N_EMBD, dtype=np.float32)
    out_norm[OUT:OUT + N_OUT] = OUT_GAIN
    ones, zeros = np.ones(N_EMBD, dtype=np.float32), np.zeros(N_EMBD, dtype=np.float32)
    return {
        "token_embd.weight": embd, "position_embd.weight": pos,
        "blk.0.attn_norm.weight": ones, "blk.0.attn_norm.bias": zeros,
        "blk.0.attn_qkv.weight": qkv, "blk.0.attn_qkv.bias": np.zeros(3 * N_EMBD, dtype=np.float32),
        "blk.0.attn_output.weight": wo, "blk.0.attn_output.bias": zeros,
        "blk.0.ffn_norm.weight": ones, "blk.0.ffn_norm.bias": zeros,
        "blk.0.ffn_up.weight": up, "blk.0.ffn_up.bias": np.zeros(len(neurons), dtype=np.float32),
        "blk.0.ffn_down.weight": down, "blk.0.ffn_down.bias": down_bias,
        "output_norm.weight": out_norm, "output_norm.bias": zeros,
    }
