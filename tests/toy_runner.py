"""A tiny numpy backend that honours the Batch contract exactly, for fast scheduler/engine property tests.

Its "KV cache" is paged storage of token ids; a row's logits are a fixed function of the tokens it reads
back through the block table, so a wrong block table, position or missing write changes the output.
Byte-level tokenizer: ids 0-255 are bytes, 256 is EOS, 257 BOS.
"""
from __future__ import annotations

import numpy as np

from evenflow.backends.base import Batch, GrammarVocab, ModelInfo, Runner, special_piece

EOS, BOS, VOCAB = 256, 257, 258


class ByteTokenizer:
    vocab_size = VOCAB
    bos_id = BOS
    eos_id = EOS
    eos_ids = {EOS}
    add_bos = False

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")

    def id_to_piece(self, token_id: int) -> str | None:
        return chr(token_id) if token_id < 256 else None  # the special tokens are spelt nowhere (no bos/eos text)

    def grammar_vocab(self) -> GrammarVocab:
        tokens = [bytes([i]) for i in range(256)] + [special_piece(b"<eos>"), special_piece(b"<bos>")]
        return GrammarVocab(tokens, [EOS, BOS], [EOS], BOS, lambda text: list(text.encode("utf-8")))


class ToyRunner(Runner):
    backend = "toy"
    chat_template = None

    def __init__(self, num_kv_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 4,
                 context_length: int = 256, seed: int = 0, eos_bias: float = -4.0, fail_on_token: int | None = None):
        rng = np.random.default_rng(seed)
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.max_num_seqs = max_num_seqs
        self.tokenizer = ByteTokenizer()
        self.info = ModelInfo("toy", VOCAB, context_length, 16, 1, 1, 1)
        self.emb = rng.standard_normal((VOCAB, 16)).astype(np.float64)
        self.pos_w = rng.standard_normal((7, 16))
        self.out = rng.standard_normal((16, VOCAB)) * 3.0
        self.bias = np.zeros(VOCAB)
        self.bias[EOS] = eos_bias
        self.kv = np.full((num_kv_blocks, block_size), -1, dtype=np.int64)
        self.fail_on_token = fail_on_token
        self.steps: list[Batch] = []
        self.freed: list[int] = []

    def step(self, batch: Batch) -> np.ndarray:
        self.steps.append(batch)
        if self.fail_on_token is not None and self.fail_on_token in batch.token_ids:
            raise RuntimeError("toy backend failure")
        bs = self.block_size
        for span in batch.spans:
            for j in range(span.length):
                pos = span.start_pos + j
                blk = span.block_table[pos // bs]
                self.kv[blk, pos % bs] = batch.token_ids[span.start + j]
        rows = []
        for span in batch.spans:
            # every row of an all_logits span (draft tokens verified), else the last one when needed
            for n in range(span.context_len - span.num_logits + 1, span.context_len + 1):
                toks = np.array([self.kv[span.block_table[p // bs], p % bs] for p in range(n)])
                assert (toks >= 0).all(), "read an unwritten KV entry"
                h = (self.emb[toks] * self.pos_w[np.arange(n) % 7]).sum(0) / np.sqrt(n)
                h = h + self.emb[toks[-1]]
                rows.append(np.tanh(h) @ self.out + self.bias)
        return np.array(rows, dtype=np.float32).reshape(len(rows), VOCAB)

    def free(self, slot: int) -> None:
        self.freed.append(slot)

    def embed(self, token_ids: list[int]) -> np.ndarray:
        return self.emb[np.array(token_ids)].astype(np.float32)

    def close(self) -> None:
        pass
