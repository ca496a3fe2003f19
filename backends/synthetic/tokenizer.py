"""A real byte-level BPE, trained deterministically on Python stdlib sources, with per-arch specials and chat templates.

The pre-tokenizer is the Llama-3 (or Qwen2) regex split + ByteLevel(use_regex=False), which llama.cpp
implements as pre-tokenizer `llama-bpe` (or `qwen2`), so HF tokenisation equals llama.cpp's on our GGUFs.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .arch_families import FAMILIES as ARCH_FAMILIES
from .family import LLAMA3_PATTERN, QWEN2_PATTERN, Family

log = logging.getLogger(__name__)

TOKENIZER_VERSION = 1

# Token types as GGUF stores them (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 3, 4, 5, 6

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] or '') | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3's hybrid-thinking template, written for evenflow: tools in <tools>, calls in <tool_call>, results in
# <tool_response>; `enable_thinking=False` closes an empty <think> block; earlier turns' reasoning is dropped.
QWEN3_TEMPLATE = (
    "{%- set system = (messages[0].content or '') if messages and messages[0].role == 'system' else '' %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' + (system + '\\n\\n' if system else '') + '# Tools\\n\\nYou may call one or more"
    " functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools>"
    " XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within"
    " <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\":"
    " <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif system %}{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' and not (m.content or '').startswith('<tool_response>') %}"
    "{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set content = m.content or '' %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set reasoning = m.thinking or m.reasoning_content or '' %}"
    "{%- if not reasoning and '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if reasoning and loop.index0 > ns.last_query %}"
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- content.lstrip('\\n') }}"
    "{%- for call in m.tool_calls or [] %}"
    "{%- set f = call.function or call %}"
    "{{- ('\\n' if content or not loop.first else '') + '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": '"
    " + (f.arguments if f.arguments is string else f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- set ns = namespace(system='') %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{%- set ns.system = (message['content'] or '') + '\\n\\n' %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + (message['content'] or '') + eos_token }}"
    "{%- else %}{{- '[INST] ' + ns.system + (message['content'] or '') + ' [/INST]' }}{%- set ns.system = '' %}"
    "{%- endif %}"
    "{%- endfor %}"
)


LLAMA3 = Family(("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<|finetune_right_pad_id|>"), (), False, "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>",
                "<|finetune_right_pad_id|>", None, ("<|end_of_text|>", "<|eot_id|>"), True, "llama-bpe",
                LLAMA3_PATTERN, True, LLAMA3_TEMPLATE)
# Qwen GGUFs carry bos = <|endoftext|> with add_bos false; without an explicit id llama.cpp defaults BPE bos to 11.
CHATML = Family(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), (), False, "<|endoftext|>", "<|im_end|>",
                "<|im_end|>", "<|endoftext|>", None, ("<|im_end|>", "<|endoftext|>"), False, "qwen2",
                QWEN2_PATTERN, False, CHATML_TEMPLATE)
# Qwen3 adds <think>/</think> as user-defined (non-special) tokens (always parsed, rendered in output) and
# a chat template with tools and thinking.
QWEN3 = dataclasses.replace(CHATML, user_defined=("<think>", "</think>"), chat_template=QWEN3_TEMPLATE)
MISTRAL = Family(("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), (), True, "<s>", "</s>", None, None, "<unk>",
                 ("</s>",), True, "llama-bpe", LLAMA3_PATTERN, True, MISTRAL_TEMPLATE)


def family_for(architecture: str) -> Family:
    """The tokenizer family of an architecture."""
    if architecture == "llama":
        return LLAMA3
    if architecture == "mistral":
        return MISTRAL
    if architecture == "qwen2":
        return CHATML
    if architecture in ("qwen3", "qwen3moe", "qwen35"):  # Qwen3's MoE and Qwen3.5 share its tokens and template
        return QWEN3
    if architecture in ARCH_FAMILIES:  # the other GGUF-only architectures' (archs.py)
        return ARCH_FAMILIES[architecture]
    raise ValueError(f"architecture {architecture!r} has no tokenizer family; allowed: llama, mistral, qwen2, qwen3, "
                     f"qwen3moe, qwen35, {', '.join(ARCH_FAMILIES)}")


# Pure-Python stdlib modules present on CPython 3.10-3.13; their sources are the training corpus.
CORPUS_MODULES = (
    "_pydecimal", "_pyio", "argparse", "ast", "base64", "bisect", "calendar", "collections", "colorsys",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "doctest", "email.message",
    "email.utils", "enum", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "graphlib",
    "heapq", "html.parser", "http.client", "http.server", "imaplib", "inspect", "json.decoder", "json.encoder",
    "locale", "logging", "logging.handlers", "mailbox", "numbers", "operator", "optparse", "pathlib", "pickle",
    "plistlib", "poplib", "pprint", "pydoc", "queue", "quopri", "random", "reprlib", "rlcompleter", "secrets",
    "shlex", "shutil", "smtplib", "socketserver", "statistics", "string", "stringprep", "subprocess", "symtable",
    "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "tracemalloc",
    "turtle", "types", "typing", "unittest.case", "urllib.parse", "urllib.request", "uuid", "warnings", "wave",
    "weakref", "webbrowser", "xml.dom.minidom", "xml.etree.ElementTree", "zipapp", "zipfile",
    "asyncio.base_events", "asyncio.streams", "asyncio.tasks", "bdb", "cmd", "code", "codecs", "compileall",
    "concurrent.futures._base", "concurrent.futures.process", "dis", "email._header_value_parser",
    "email.feedparser", "email.header", "filecmp", "fileinput", "gzip", "hashlib", "hmac", "http.cookiejar",
    "http.cookies", "ipaddress", "linecache", "mimetypes", "modulefinder", "multiprocessing.managers",
    "multiprocessing.pool", "netrc", "ntpath", "os", "pdb", "pkgutil", "platform", "posixpath", "profile",
    "pstats", "pyclbr", "runpy", "sched", "selectors", "shelve", "site", "socket", "ssl", "traceback",
    "unittest.mock", "xmlrpc.client", "zipimport",
)
# A little non-ASCII prose so common accented letters, CJK and emoji get merges of their own.
MULTILINGUAL = (
    "Le cœur a ses raisons que la raison ne connaît point. Über den Wolken muss die Freiheit wohl grenzenlos sein. "
    "El niño comió una manzana en la mañana. Съешь же ещё этих мягких французских булок. "
    "天下大事，必作于细。我们一起学习中文。日本語のテキストも少し入れておきます。한국어 문장도 있습니다. "
    "Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया. Emoji: 😀 🎉 👍 🚀 ✨ — “quotes” ‘single’ … € £ ¥ °C ±"
)


@functools.lru_cache(maxsize=1)
def corpus_texts() -> tuple[str, ...]:
    """The training corpus: sorted stdlib module sources (docstrings where sources are absent) + a prose sample."""
    texts: list[str] = []
    for name in sorted(CORPUS_MODULES):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and os.path.isfile(origin):
            texts.append(Path(origin).read_text(encoding="utf-8", errors="replace"))
        else:  # stripped installs ship .pyc only: fall back to docstrings, still deterministic per install
            module = importlib.import_module(name)
            texts.extend(sorted(filter(None, (getattr(v, "__doc__", None) for v in vars(module).values()
                                              if isinstance(getattr(v, "__doc__", None), str)))))
    texts.extend([MULTILINGUAL] * 20)
    return tuple(texts)


@functools.lru_cache(maxsize=None)
def tokenizer_fingerprint(vocab_size: int, architecture: str) -> str:
    """Digest of everything that determines the trained tokenizer (corpus, family, size, library version)."""
    import tokenizers

    fam = family_for(architecture)
    h = hashlib.sha256()
    h.update(json.dumps([TOKENIZER_VERSION, vocab_size, fam.specials, fam.user_defined, fam.specials_first,
                         fam.pattern, fam.ignore_merges, fam.add_bos, tokenizers.__version__]).encode())
    for text in corpus_texts():
        h.update(hashlib.sha256(text.encode("utf-8", "replace")).digest())
    return h.hexdigest()


def cache_dir() -> Path:
    """EVENFLOW_SYNTHETIC_CACHE, or the platformdirs user cache dir / evenflow / synthetic."""
    env = os.environ.get("EVENFLOW_SYNTHETIC_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("evenflow")) / "synthetic"


def _train(vocab_size: int, fam: Family) -> str:
    """Train the BPE and return tokenizer.json text (deterministic for a given corpus)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from tokenizers import AddedToken

    n_added = len(fam.specials) + len(fam.user_defined)
    tok = Tokenizer(models.BPE(ignore_merges=fam.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(fam.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    first = [AddedToken(s, special=True, normalized=False) for s in fam.specials] if fam.specials_first else []
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - (0 if fam.specials_first else len(fam.specials)) - len(fam.user_defined),
        min_frequency=2, special_tokens=first, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(corpus_texts(), trainer)
    if not fam.specials_first:
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in fam.specials])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in fam.user_defined])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise ValueError(f"vocab_size={vocab_size}: the corpus only supports {tok.get_vocab_size()} tokens "
                         f"({n_added} added); pick a smaller vocab_size")
    if fam.add_bos and fam.bos:
        bos_id = tok.token_to_id(fam.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos}:0 $A:0", pair=f"{fam.bos}:0 $A:0 {fam.bos}:1 $B:1", special_tokens=[(fam.bos, bos_id)])
    return tok.to_str()


def trained_tokenizer_json(vocab_size: int, architecture: str) -> str:
    """tokenizer.json text for (vocab_size, arch family), trained once and cached on disk."""
    return _trained_cached(vocab_size, architecture, str(cache_dir()))


@functools.lru_cache(maxsize=8)
def _trained_cached(vocab_size: int, architecture: str, cache: str) -> str:
    fam = family_for(architecture)
    key = tokenizer_fingerprint(vocab_size, architecture)[:24]
    path = Path(cache) / "tokenizers" / f"bpe-{vocab_size}-{key}.json"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    log.info("training a %d-token byte-level BPE for %s (cached at %s)", vocab_size, architecture, path)
    text = _train(vocab_size, fam)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # atomic: parallel test processes never read half a file
    return text


@dataclass
class Vocab:
    """A tokenizer as GGUF needs it, plus what HF files need (`hf_json` is None for a copied GGUF vocab)."""

    model: str  # tokenizer.ggml.model
    pre: str | None
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    unk_id: int | None
    stop_ids: list[int]
    add_bos: bool
    chat_template: str | None
    hf_json: str | None = None
    family: Family | None = None
    gguf_path: str | None = None  # a copied vocab: every tokenizer.* field comes from this file

    def output_mask(self) -> list[int]:
        """Ids whose output rows `text_only_output` zeroes: non-normal tokens and single-byte tokens."""
        out = []
        for i, (t, ty) in enumerate(zip(self.tokens, self.token_types)):
            single_byte = self.model == "gpt2" and len(t) == 1  # byte-level: one char == one byte
            if ty != TOKEN_NORMAL or single_byte:
                out.append(i)
        return out


def trained_vocab(vocab_size: int, architecture: str) -> Vocab:
    """Our trained BPE for an architecture, as a Vocab."""
    fam = family_for(architecture)
    text = trained_tokenizer_json(vocab_size, architecture)
    data = json.loads(text)
    vocab = dict(data["model"]["vocab"])
    added = {a["content"]: a for a in data["added_tokens"]}
    for a in data["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    types = [TOKEN_NORMAL] * len(tokens)
    for t, a in added.items():
        types[a["id"]] = TOKEN_CONTROL if a["special"] else TOKEN_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    get = lambda s: None if s is None else ids[s]  # noqa: E731
    return Vocab("gpt2", fam.pre, tokens, types, merges, get(fam.bos), get(fam.eos), get(fam.eot), get(fam.pad),
                 get(fam.unk), [ids[s] for s in fam.stop], fam.add_bos, fam.chat_template, text, fam)


def gguf_vocab_fields(path: str) -> list[tuple[str, object, list]]:
    """(key, value, GGUF types) of every `tokenizer.*` field of a GGUF; parsed once per file version."""
    st = os.stat(path)
    return _read_vocab_fields(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_vocab_fields(path: str, mtime_ns: int, size: int) -> list[tuple[str, object, list]]:
    from gguf import GGUFReader  # parsing a 128k-token vocab takes seconds: hence the cache

    reader = GGUFReader(path)
    return [(k, f.contents(), list(f.types)) for k, f in reader.fields.items() if k.startswith("tokenizer.")]


def gguf_vocab(path: str) -> Vocab:
    """Tokens, types and special ids of a vocab-only GGUF (its fields are copied verbatim when writing)."""
    fields = {k: v for k, v, _ in gguf_vocab_fields(path)}
    value = fields.get
    tokens = value("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens; expected a vocab GGUF")
    types = value("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    eos, eot = value("tokenizer.ggml.eos_token_id"), value("tokenizer.ggml.eot_token_id")
    return Vocab(value("tokenizer.ggml.model") or "gpt2", value("tokenizer.ggml.pre"), list(tokens), list(types),
                 list(value("tokenizer.ggml.merges") or []), value("tokenizer.ggml.bos_token_id"), eos, eot,
                 value("tokenizer.ggml.padding_token_id"), value("tokenizer.ggml.unknown_token_id"),
                 sorted({i for i in (eos, eot) if i is not None}), bool(value("tokenizer.ggml.add_bos_token")),
                 value("tokenizer.chat_template"), gguf_path=path)


def gguf_vocab_size(path: str) -> int:
    """Number of tokens in a vocab GGUF."""
    return len(gguf_vocab(path).tokens)


def vocab_for(spec) -> Vocab:
    """The Vocab a spec's model uses: the copied GGUF vocab, or our trained BPE."""
    if spec.vocab is not None:
        return gguf_vocab(spec.vocab)
    return trained_vocab(spec.vocab_size, spec.architecture)
