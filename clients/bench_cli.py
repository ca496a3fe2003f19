"""`evenflow bench {stall,poisson,sweep}`: argparse front-end of the load generator (`main(argv)`)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from .bench import (DEFAULT_DURATION_S, DEFAULT_MAX_REQUESTS, MAX_DURATION_CAP_S, MAX_REQUESTS_CAP, SWEEPABLE,
                    BenchResult, SweepResult, run_poisson, run_stall, run_sweep)
from .bench_http import ALIASES, PROTOCOLS, TargetError
from .bench_metrics import RequestRecord, parse_slo
from .bench_report import print_tables, result_tables, sweep_table, write_json, write_timeline_png

log = logging.getLogger(__name__)

EPILOG = """\
examples:
  evenflow bench stall --model llama3.2 --png stall.png          # against evenflow/Ollama on 127.0.0.1:11434
  evenflow bench stall --url http://127.0.0.1:8080 --protocol openai-completions --streams 4 --prompt-len 2048
  evenflow bench poisson --rate 2 --num-requests 64 --prompt-len 128:1024 --output-len 128 --slo ttft=500,itl=150
  evenflow bench sweep stall n_streams=1,2,4,8 --json sweep.json

Server-side knobs (token budget, n_batch, slots) are swept by re-running the server, e.g.
  for b in 64 256 1024; do <start the server with budget $b>; evenflow bench stall --label budget=$b \\
      --json stall-$b.json; <stop it>; done
Ollama ignores ignore_eos: its streams may end early at an EOS token (the report warns); llama-server and vLLM
honour it. Only loopback targets are used unless you pass --allow-remote with the address typed explicitly.
"""


def _default_url() -> str:
    raw = (os.environ.get("EVENFLOW_HOST") or os.environ.get("OLLAMA_HOST") or "").strip()
    if not raw:
        return "http://127.0.0.1:11434"
    if "://" not in raw:
        raw = "http://" + raw
    host_port = raw.split("://", 1)[1]
    if ":" not in host_port.rsplit("]", 1)[-1]:
        raw += ":11434"
    return raw.replace("0.0.0.0", "127.0.0.1")


def _labels(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise ValueError(f"bad --label {it!r}: expected KEY=VALUE")
        out[k] = v
    return out


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target and limits")
    g.add_argument("--url", default=None, help="server base URL (default: $EVENFLOW_HOST, $OLLAMA_HOST "
                   "or http://127.0.0.1:11434)")
    g.add_argument("--protocol", "-p", default="ollama-generate", choices=list(PROTOCOLS) + sorted(ALIASES),
                   help="API to drive (default ollama-generate)")
    g.add_argument("--model", "-m", help="model name (default: the first one the server lists)")
    g.add_argument("--allow-remote", action="store_true",
                   help="allow the non-loopback host typed in --url (never one taken from the environment)")
    g.add_argument("--duration", type=float, default=DEFAULT_DURATION_S,
                   help=f"stop everything after this many seconds (default {DEFAULT_DURATION_S:g}, "
                        f"cap {MAX_DURATION_CAP_S:g})")
    g.add_argument("--max-requests", type=int, default=DEFAULT_MAX_REQUESTS,
                   help=f"refuse runs needing more requests (default {DEFAULT_MAX_REQUESTS}, cap {MAX_REQUESTS_CAP})")
    g.add_argument("--request-timeout", type=float, default=600.0, help="per-request read timeout, seconds")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--ignore-eos", choices=("auto", "on", "off"), default="auto",
                   help="ask the server to ignore EOS so every request yields its full output length; auto: on for "
                        "the OpenAI protocols (llama-server, vLLM honour it), off for Ollama's (it has no such "
                        "option, so Ollama streams may end early at EOS; the report warns)")
    g.add_argument("--slo", help="goodput SLOs in ms, e.g. ttft=500,itl=150 (keys: ttft, tpot, itl, e2el; "
                                 "itl is checked on each request's worst gap)")
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="tag the run in the JSON (e.g. the server setting being compared); repeatable")
    g.add_argument("--sweep", metavar="PARAM=V1,V2,...", help="re-run once per value of a client-side parameter")
    o = p.add_argument_group("output")
    o.add_argument("--json", help="write the full result (every request's token times) to this path")
    o.add_argument("--png", help="write the token timeline to this PNG (one per value with --sweep)")
    o.add_argument("--quiet", "-q", action="store_true", help="no progress display")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evenflow bench", description="Load generator: does a long prompt stall "
                                     "everyone else's stream? Works against evenflow, Ollama, llama-server, vLLM.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="scenario", required=True)
    st = sub.add_parser("stall", help="N streams decode, then one long prompt arrives",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    st.add_argument("--streams", "-n", dest="n_streams", type=int, default=4)
    st.add_argument("--prompt-len", "-L", type=int, default=2048, help="tokens in the long prompt")
    st.add_argument("--output-len", type=int, default=1024, help="max tokens per stream (stopped after the window)")
    st.add_argument("--long-output-len", type=int, default=8, help="tokens asked of the long prompt")
    st.add_argument("--stream-prompt-len", type=int, default=64, help="tokens in each stream's prompt")
    st.add_argument("--warmup", dest="warmup_s", type=float, default=2.0,
                    help="seconds of steady decoding (the 'before' window) before the long prompt")
    st.add_argument("--tail", dest="tail_s", type=float, default=1.0,
                    help="seconds the streams keep going after the long prompt's first token")
    _common(st)
    po = sub.add_parser("poisson", help="Poisson arrivals with prompt/output length distributions",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    po.add_argument("--rate", type=float, default=1.0, help="requests per second (inf: all at once)")
    po.add_argument("--num-requests", type=int, default=32)
    po.add_argument("--prompt-len", default="256", help="N or MIN:MAX (uniform) prompt tokens")
    po.add_argument("--output-len", default="128", help="N or MIN:MAX (uniform) output tokens")
    po.add_argument("--max-concurrency", type=int, default=None)
    _common(po)
    sw = sub.add_parser("sweep", help="shorthand: sweep SCENARIO PARAM=V1,V2 [scenario options]")
    sw.add_argument("sweep_scenario", choices=sorted(SWEEPABLE))
    sw.add_argument("sweep_spec", metavar="PARAM=V1,V2,...")
    sw.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _progress_display(enabled: bool, total: int) -> tuple[Any, Any]:
    """A rich progress bar (requests finished, tokens received) and its callback; (None, None) without rich."""
    if not enabled:
        return None, None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    except ImportError:
        return None, None
    prog = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total} requests · {task.fields[tokens]} tokens"),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = prog.add_task("bench", total=total, tokens=0)
    counts = {"tokens": 0}

    def on_event(kind: str, rec: RequestRecord) -> None:
        if kind == "token":
            counts["tokens"] += 1
            prog.update(task, tokens=counts["tokens"])
        elif kind == "end":
            prog.advance(task)

    return prog, on_event


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    names = ["url", "protocol", "model", "allow_remote", "duration", "max_requests", "request_timeout", "seed",
             "ignore_eos"]
    names += (["n_streams", "prompt_len", "output_len", "long_output_len", "stream_prompt_len", "warmup_s", "tail_s"]
              if args.scenario == "stall" else
              ["rate", "num_requests", "prompt_len", "output_len", "max_concurrency"])
    kw = {n: getattr(args, n) for n in names}
    # --allow-remote only covers an address typed on this command line, never one from the environment.
    kw["url"], kw["allow_remote"] = (args.url, args.allow_remote) if args.url else (_default_url(), False)
    kw["ignore_eos"] = {"auto": None, "on": True, "off": False}[args.ignore_eos]
    kw["slo"] = parse_slo(args.slo)
    kw["label"] = _labels(args.label)
    return kw


def _parse_sweep(spec: str) -> tuple[str, list[str]]:
    param, sep, vals = spec.partition("=")
    values = [v.strip() for v in vals.split(",") if v.strip()]
    if not sep or not values:
        raise ValueError(f"bad sweep {spec!r}: expected PARAM=V1,V2,...")
    return param.strip(), values


def _emit(obj: BenchResult | SweepResult, args: argparse.Namespace) -> None:
    runs = obj.runs if isinstance(obj, SweepResult) else [obj]
    if isinstance(obj, SweepResult):
        for v, r in zip(obj.values, obj.runs):
            print_tables([(f"{obj.param}={v}: " + t, h, rows) for t, h, rows in result_tables(r)])
        print_tables([sweep_table(obj)])
    else:
        print_tables(result_tables(obj))
    for r in runs:
        for w in r.warnings:
            print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(f"wrote {write_json(obj, args.json)}", file=sys.stderr)
    if args.png:
        png = Path(args.png)
        for i, r in enumerate(runs):
            path = png if len(runs) == 1 else png.with_name(f"{png.stem}-{obj.param}{obj.values[i]}{png.suffix}")
            print(f"wrote {write_timeline_png(r, path)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one bench command; returns the exit status (0 ok, 1 run failed, 2 bad arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.scenario == "sweep":  # rewrite into the scenario's own parser, so every option is checked there
        args = parser.parse_args([args.sweep_scenario, *args.rest, "--sweep", args.sweep_spec])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        kw = _kwargs(args)
        sweep = _parse_sweep(args.sweep) if args.sweep else None
    except ValueError as e:
        parser.error(str(e))
    runs = len(sweep[1]) if sweep else 1
    per_run = (kw["n_streams"] + 1) if args.scenario == "stall" else kw["num_requests"]
    prog, on_event = _progress_display(not args.quiet and sys.stderr.isatty(), per_run * runs)
    kw["progress"] = on_event
    try:
        if prog is not None:
            prog.start()
        if sweep:
            obj: BenchResult | SweepResult = asyncio.run(run_sweep(args.scenario, sweep[0], sweep[1], **kw))
        else:
            obj = asyncio.run((run_stall if args.scenario == "stall" else run_poisson)(**kw))
    except TargetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except httpx.HTTPError as e:
        print(f"error: talking to {kw['url']}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if prog is not None:
            prog.stop()
    _emit(obj, args)
    runs_list = obj.runs if isinstance(obj, SweepResult) else [obj]
    return 1 if any(r.summary["completed"] + r.summary["stopped"] == 0 for r in runs_list) else 0


if __name__ == "__main__":
    sys.exit(main())
