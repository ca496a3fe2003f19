"""CLI: python -m evenflow.backends.synthetic --preset tiny --arch qwen2 --out DIR [--gguf q8_0] [--hf].

The GGUF-only architectures (gemma3, gpt-oss, qwen3moe, lfm2, qwen35, deepseek2) are written as GGUF alone."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from .factory import make_model
from .gguf_writer import GGUF_DTYPES
from .spec import ARCHITECTURES, LLAMA3_ROPE_SCALING, PRESETS, make_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evenflow.backends.synthetic",
                                     description="Write a random-weight model (HF directory and/or GGUF file).")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--arch", default=None, choices=ARCHITECTURES, help="default: the preset's (llama)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--gguf", nargs="?", const="f32", default=None, choices=GGUF_DTYPES,
                        help="write a GGUF file in this dtype (default f32)")
    parser.add_argument("--hf", action="store_true", help="write a Hugging Face directory")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--vocab", default=None, help="a vocab-only GGUF to copy the tokenizer from (GGUF only)")
    parser.add_argument("--tie-word-embeddings", action="store_true")
    parser.add_argument("--text-only-output", action="store_true", default=None)
    parser.add_argument("--llama3-rope", action="store_true", help="llama3 rope scaling (llama/mistral)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    overrides: dict = {}
    for key, value in (("architecture", args.arch), ("seed", args.seed), ("vocab", args.vocab),
                       ("text_only_output", args.text_only_output)):
        if value is not None:
            overrides[key] = value
    if args.tie_word_embeddings:
        overrides["tie_word_embeddings"] = True
    if args.llama3_rope:
        overrides["rope_scaling"] = dict(LLAMA3_ROPE_SCALING)
    from .archs import GGUF_ONLY

    default = ["gguf"] if args.arch in GGUF_ONLY else ["hf", "gguf"]  # llama.cpp alone runs those: no HF folder
    formats = [f for f, on in (("hf", args.hf), ("gguf", args.gguf is not None)) if on] or default
    try:
        spec = make_spec(args.preset, **overrides)
        paths = make_model(spec, args.out, formats=formats, gguf_dtype=args.gguf or "f32")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: str(v) for k, v in paths.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
