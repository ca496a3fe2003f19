"""Speculative decoding on real weights (llama.cpp): a model asked to copy from a document drafts from it, keeps
most drafts, and gives the answer decoding one token at a time gives.

The weights come from `../shared/tools/real_models.py` (cached under $EVENFLOW_REAL_MODELS or
~/.cache/evenflow-real-models); without them the tests skip. llama.cpp computes a row of a several-token span with
other kernels than a one-token decode (its CPU matmuls switch to tinyBLAS at two rows), so a verified row's logits
can differ from the decode's by rounding (up to ~0.4 on Gemma 3): the outputs are compared on the copied text, where
the model is sure, and a seed is checked to give the same output twice (docs/api.md, *Speculative decoding*)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams

pytest.importorskip("llama_cpp")

DIR = Path(os.environ.get("EVENFLOW_REAL_MODELS") or Path.home() / ".cache" / "evenflow-real-models")
MODELS = {"gemma3": "gemma-3-270m-q4_k_m.gguf", "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf"}
DOCUMENT = """SERVICE AGREEMENT

1. Definitions.
"Provider" shall mean the company that operates the hosting platform described in Schedule A.
"Customer" shall mean the person or organisation that signs this Agreement and pays the fees.
"Service" shall mean the hosting, storage and backup services listed in Schedule A, as updated from time to time.

2. Term. This Agreement begins on the date the Customer signs it and continues for twelve months, after which it
renews automatically for further periods of twelve months unless either party gives written notice of termination
at least thirty days before the end of the current period.

3. Fees. The Customer shall pay the monthly fee stated in Schedule B within fifteen days of each invoice. Late
payments bear interest at one percent per month.
"""
QUESTION = '\nCopy the definition of "Service" exactly:\n"Service" shall mean'


@pytest.fixture(scope="module", params=sorted(MODELS))
def runner(request):
    path = DIR / MODELS[request.param]
    if not path.is_file():
        pytest.skip(f"real weights not cached at {path} (python ../shared/tools/real_models.py {request.param})")
    r = load_runner("llamacpp", str(path), RunnerSettings(max_num_seqs=2, context_length=1024, num_threads=2))
    yield r
    r.close()


def generate(runner, params: SamplingParams, spec: str) -> tuple[list[int], int, int]:
    engine = Engine(runner, EngineConfig(max_num_batched_tokens=512, speculative=spec))
    stream = engine.submit(runner.tokenizer.encode(DOCUMENT + QUESTION), params, loop=None)
    while engine.run_once():
        pass
    deltas = list(stream)
    m = deltas[-1].metrics
    return [t for d in deltas for t in d.token_ids], m.draft_tokens, m.accepted_tokens


def test_copying_from_a_document_keeps_drafts_and_the_answer(runner) -> None:
    params = SamplingParams(temperature=0, num_predict=30, draft_num_predict=6)
    want, _, _ = generate(runner, params, "off")
    got, drafted, accepted = generate(runner, params, "ngram")
    copied = runner.tokenizer.encode(" the hosting, storage and backup services listed in Schedule A",
                                     add_special=False)
    assert got[:len(copied)] == want[:len(copied)]
    assert accepted > 0 and drafted >= accepted
    if "gemma" in runner.path:  # Gemma 3 copies the definition verbatim: most drafts from the document are kept
        assert runner.tokenizer.decode(got).startswith(" the hosting, storage and backup services")
        assert accepted >= drafted // 2


def test_a_seed_gives_the_same_sampled_answer_with_drafts(runner) -> None:
    params = SamplingParams(temperature=0.8, seed=11, num_predict=30, draft_num_predict=6)
    first, drafted, _ = generate(runner, params, "ngram")
    second, _, _ = generate(runner, params, "ngram")
    assert first == second and drafted > 0
