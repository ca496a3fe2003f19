"""`evenflow run MODEL [PROMPT]` as Ollama's: one-shot (a prompt or piped stdin), else the REPL (repl.py); an
embedding model embeds the prompt and prints the vector.

Streams a reply, shows thinking unless hidden, prints Ollama's `--verbose` timing block, and pulls a missing
model first, as Ollama's run does (the streaming and the session: session.py). Flags parse as Ollama's (cobra/
pflag): `--think` and the boolean flags take a value only as `--flag=value`, flags and words mix in any order.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

from ..daemon.settings import parse_go_duration
from .common import CLIError, check, daemon_client
from .repl import Repl
from .session import Session, ensure_model, print_timings, stream_reply

VALUE_FLAGS = ("--keepalive", "--format", "--dimensions", "--host")  # `--flag value` or `--flag=value`
BARE_FLAGS = ("--think", "--verbose", "--insecure", "--nowordwrap", "--hidethinking", "--truncate")  # `=value` only
THINK_VALUES = ("true", "false", "high", "medium", "low", "max")


def ollama_argv(argv: list[str]) -> list[str]:
    """`run`'s arguments as pflag reads them, rewritten for argparse: every flag as one `--flag=value` token (a
    bare `--think` is `--think=true` and never takes the next word), then `--` and the words (model, prompt).
    An unknown flag is a CLIError, as pflag's."""
    flags: list[str] = []
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            words += argv[i + 1:]
            break
        if arg in VALUE_FLAGS and i + 1 < len(argv):
            flags.append(f"{arg}={argv[i + 1]}")
            i += 1
        elif arg in BARE_FLAGS:
            flags.append(f"{arg}=true")
        elif arg in ("-h", "--help") or arg.split("=", 1)[0] in VALUE_FLAGS + BARE_FLAGS:
            flags.append(arg)
        elif arg.startswith("-") and arg != "-":
            raise CLIError(f"Error: unknown flag: {arg}")  # as pflag: `-5 degrees` needs `--` before it
        else:
            words.append(arg)
        i += 1
    return [*flags, "--", *words]


def go_bool(value: str) -> bool:
    """Go's strconv.ParseBool, as pflag reads `--verbose=...`."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise argparse.ArgumentTypeError(f'invalid argument "{value}": expected true or false (1, t, T, TRUE, True, '
                                     "0, f, F, FALSE, False)")


def parse_think(value: str | None) -> bool | str | None:
    """--think's value as Ollama takes it (exact, lowercase): true (also bare), false, high, medium, low, max."""
    if value is None:
        return None
    if value in ("", "true"):
        return True
    if value == "false":
        return False
    if value in THINK_VALUES:
        return value
    raise CLIError(f'Error: invalid value for --think: "{value}" (must be true, false, high, medium, low, or max)')


def parse_format(value: str | None) -> Any:
    """--format: `json`, or a JSON schema (any JSON value) sent as the request's `format`; empty means none."""
    if not value:
        return None
    if value == "json":
        return "json"
    try:
        return json.loads(value)
    except ValueError as e:
        raise CLIError(f"Error: invalid --format {value!r}: expected json or a JSON schema ({e})") from None


def parse_keepalive(value: str | None) -> str | None:
    """--keepalive as Go's time.ParseDuration reads it (5m, 1h30m, 0, -1m); sent as given."""
    if value is None or value == "":
        return None
    try:
        parse_go_duration(value)
    except ValueError:
        raise CLIError(f'Error: time: invalid duration "{value}"') from None
    return value


def one_shot(client: httpx.Client, sess: Session, prompt: str) -> None:
    body = sess.body(prompt=prompt)
    if sess.system:
        body["system"] = sess.system
    _, final = stream_reply(client, "/api/generate", body, sess)
    print()
    if sess.verbose and final:
        print_timings(final)


def embed(client: httpx.Client, model: str, text: str, args: argparse.Namespace, keepalive: str | None) -> None:
    """An embedding model's `run`: /api/embed of the prompt, the vector printed as JSON (as Ollama's run does)."""
    if not text:
        raise CLIError(f'Error: embedding models require input text. Usage: evenflow run {model} "your text here"')
    body: dict[str, Any] = {"model": model, "input": text}
    if keepalive is not None:
        body["keep_alive"] = keepalive
    if args.truncate is not None:
        body["truncate"] = args.truncate
    if args.dimensions > 0:
        body["dimensions"] = args.dimensions
    vectors = check(client.post("/api/embed", json=body)).json().get("embeddings") or []
    if not vectors:
        raise CLIError("Error: no embeddings returned")
    print(json.dumps(vectors[0], separators=(",", ":")))


def cmd_run(args: argparse.Namespace) -> None:
    keepalive = parse_keepalive(args.keepalive)
    sess = Session(args.model, format=parse_format(args.format), think=parse_think(args.think),
                   hidethinking=args.hidethinking, wordwrap=not args.nowordwrap, verbose=args.verbose,
                   keepalive=keepalive)
    prompt = " ".join(args.prompt) if args.prompt else ""
    piped = not sys.stdin.isatty()
    if piped:
        stdin = sys.stdin.read()
        prompt = f"{stdin}\n\n{prompt}".strip() if prompt else stdin
    with daemon_client() as c:
        info = ensure_model(c, args.model, args.insecure)
        caps = info.get("capabilities") or []
        if "embedding" in caps:
            embed(c, args.model, prompt, args, keepalive)
            return
        if sess.think is None and "thinking" in caps:
            sess.think = True  # Ollama's run turns thinking on for a model that has it unless told otherwise
        if prompt or piped:
            if not prompt.strip():
                raise CLIError("Error: the prompt read from stdin is empty")
            one_shot(c, sess, prompt)
            return
        Repl(c, sess).loop()


def add_parser(sub: Any) -> None:
    """Register `run` on the `evenflow` parser (main() passes its arguments through ollama_argv first)."""
    run = sub.add_parser("run", allow_abbrev=False,
                         help="run a model: a one-shot PROMPT, piped stdin, an interactive chat, or an embedding")
    run.add_argument("model")
    run.add_argument("prompt", nargs="*")
    run.add_argument("--keepalive", default=None, help="duration to keep a model loaded (e.g. 5m)")
    run.add_argument("--format", default=None, help='response format: json, or a JSON schema (e.g. \'{"type": ...}\')')
    run.add_argument("--think", nargs="?", const="true", default=None, metavar="true|false|high|medium|low|max",
                     help="enable thinking (bare --think is true; a value only as --think=VALUE)")
    run.add_argument("--dimensions", type=int, default=0, help="truncate output embeddings to this dimension "
                     "(embedding models only)")
    bools = (("verbose", "show timings for response"), ("insecure", "use an insecure registry (plain-HTTP pulls)"),
             ("nowordwrap", "don't wrap words to the next line automatically"),
             ("hidethinking", "hide thinking output (if provided)"),
             ("truncate", "for embedding models: truncate inputs exceeding context length (default: true); "
                          "--truncate=false to error instead"))
    for name, what in bools:
        run.add_argument(f"--{name}", nargs="?", type=go_bool, const=True, default=None if name == "truncate" else False,
                         metavar="BOOL", help=what)
    run.set_defaults(func=cmd_run)
