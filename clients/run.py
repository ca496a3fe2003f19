"""`evenflow run MODEL [PROMPT]` as Ollama's: one-shot (a prompt or piped stdin), else the REPL (repl.py).

Streams a reply, shows thinking unless hidden, prints Ollama's `--verbose` timing block, and pulls a missing
model first, as Ollama's run does (the streaming and the session: session.py).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx

from .common import CLIError, daemon_client
from .repl import Repl
from .session import Session, ensure_model, print_timings, stream_reply


def _parse_think(value: str | None) -> bool | str | None:
    if value is None:
        return None
    v = value.lower()
    if v in ("true", "1", ""):
        return True
    if v in ("false", "0"):
        return False
    if v in ("low", "medium", "high"):
        return v
    raise CLIError(f"Error: invalid --think value {value!r}; use true, false, low, medium or high")


def one_shot(client: httpx.Client, sess: Session, prompt: str) -> None:
    body = sess.body(prompt=prompt)
    if sess.system:
        body["system"] = sess.system
    _, final = stream_reply(client, "/api/generate", body, sess)
    print()
    if sess.verbose and final:
        print_timings(final)


def cmd_run(args: argparse.Namespace) -> None:
    sess = Session(args.model, format=args.format or None, think=_parse_think(args.think),
                   hidethinking=args.hidethinking, wordwrap=not args.nowordwrap, verbose=args.verbose,
                   keepalive=args.keepalive)
    prompt = " ".join(args.prompt) if args.prompt else ""
    piped = not sys.stdin.isatty()
    if piped:
        stdin = sys.stdin.read()
        prompt = f"{stdin}\n\n{prompt}".strip() if prompt else stdin
    with daemon_client() as c:
        ensure_model(c, args.model, args.insecure)
        if prompt or piped:
            if not prompt.strip():
                raise CLIError("Error: the prompt read from stdin is empty")
            one_shot(c, sess, prompt)
            return
        Repl(c, sess).loop()


def add_parser(sub: Any) -> None:
    """Register `run` on the `evenflow` parser."""
    run = sub.add_parser("run", help="run a model: a one-shot PROMPT, piped stdin, or an interactive chat")
    run.add_argument("model")
    run.add_argument("prompt", nargs="*")
    run.add_argument("--keepalive", default=None, help="how long the model stays loaded (e.g. 5m, 0)")
    run.add_argument("--verbose", action="store_true", help="print the timings of each reply")
    run.add_argument("--format", default=None, choices=["json"], help="response format")
    run.add_argument("--think", nargs="?", const="true", default=None, metavar="true|false|low|medium|high",
                     help="thinking (for models that support it)")
    run.add_argument("--hidethinking", action="store_true", help="do not print the thinking")
    run.add_argument("--nowordwrap", action="store_true", help="do not wrap words at the terminal width")
    run.add_argument("--insecure", action="store_true",
                     help="allow a plain-HTTP registry named http://host/... if the model must be pulled")
    run.set_defaults(func=cmd_run)
