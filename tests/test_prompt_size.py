"""The character bound on a prompt (daemon/api/pipeline/prompt_size.py): a long prompt that a sampled lower bound on
the longest piece already shows to fit is not held up measuring the whole vocabulary (~0.4 s for Gemma's 262k
tokens, after every load), and one beyond the exact bound is still refused before it is tokenized."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from evenflow.backends.base import GrammarVocab
from evenflow.daemon.api.pipeline import prompt_size


class Vocab:
    """Pieces of the given lengths; counts how often the whole vocabulary is measured."""

    def __init__(self, lengths: list[int]) -> None:
        self.pieces = [b"x" * n for n in lengths]
        self.vocab_size = len(self.pieces)
        self.measured = 0

    def token_bytes(self, t: int) -> bytes:
        return self.pieces[t]

    def grammar_vocab(self) -> GrammarVocab:
        self.measured += 1
        return GrammarVocab(list(self.pieces), [], [], None, lambda s: [])


def model(tok: Vocab) -> SimpleNamespace:
    return SimpleNamespace(name="m", runner=SimpleNamespace(tokenizer=tok), trained_context=1000)


@pytest.mark.parametrize("size", [7, 5000, 300_000])
def test_a_prompt_within_the_sampled_bound_is_not_held_up_and_one_past_the_exact_bound_is_refused(size):
    lengths = [1 + i % 5 for i in range(size)]  # pieces of 1..5 bytes everywhere ...
    lengths[size // 2 + 1] = 40  # ... and one long one the sample may miss
    tok = Vocab(lengths)
    m, window = model(tok), 100
    low = prompt_size.piece_lower_bound(m)
    assert 1 <= low <= 40
    assert prompt_size.char_limit(m, window, window * low) is None and tok.measured == 0
    prompt_size.check_text(m, "y" * (window * low), window, None)  # fits by the bound: no refusal, no measuring
    assert tok.measured == 0
    assert prompt_size.char_limit(m, window, window * 40 + 1) == window * 40 and tok.measured == 1
    with pytest.raises(prompt_size.ContextOverflow):
        prompt_size.check_text(m, "y" * (window * 40 + 1), window, None)
    assert tok.measured == 1  # measured once per tokenizer
