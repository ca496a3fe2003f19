"""Bench output: a terminal table (rich when installed, plain text otherwise), JSON, and a PNG token timeline."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, TextIO

from .bench import BenchResult, StallResult, SweepResult

log = logging.getLogger(__name__)

_STAT_COLS = ("mean", "p50", "p90", "p99", "max")


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def result_tables(result: BenchResult) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for every table a result prints: the metric stats, counts, and the stall windows."""
    s = result.summary
    tables = []
    metric_rows = [[name] + [_fmt(s[key][c]) for c in _STAT_COLS] + [str(s[key]["count"])]
                   for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2EL", "e2el_ms"))]
    cfg = result.config
    model = str(cfg.get("model"))
    model = model.rsplit("/", 1)[-1] if model.endswith(".gguf") else model  # llama-server names models by path
    title = f"{result.scenario} · {cfg.get('protocol')} · {model} @ {cfg.get('url')}"
    tables.append((title + " (ms)", ["metric", *_STAT_COLS, "n"], metric_rows))
    counts = [["requests (completed / stopped by bench / failed)",
               f"{s['requests']} ({s['completed']} / {s['stopped']} / {s['failed']})"],
              ["duration (s)", _fmt(s["duration_s"], 2)],
              ["input / output tokens", f"{s['total_input_tokens']} / {s['total_output_tokens']}"],
              ["request throughput (req/s)", _fmt(s["request_throughput"], 3)],
              ["output throughput (tok/s)", _fmt(s["output_throughput"], 1)],
              ["total token throughput (tok/s)", _fmt(s["total_token_throughput"], 1)]]
    if "goodput" in s:
        slo = ",".join(f"{k}={v:g}" for k, v in s["slo_ms"].items())
        counts.append([f"goodput (req/s, SLO {slo} ms)",
                       f"{_fmt(s['goodput'], 3)} ({s['good_requests']} good, {100 * s['good_fraction']:.0f}%)"])
    tables.append(("throughput", ["", ""], counts))
    if isinstance(result, StallResult) and result.windows:
        w = result.windows
        rows = [[name, _fmt((w[f"{key}_s"][1] - w[f"{key}_s"][0]) * 1000.0, 0)]
                + [_fmt(w[f"{key}_ms"][c]) for c in _STAT_COLS] + [str(w[f"{key}_ms"]["count"])]
                for name, key in (("before long prompt", "before"), ("during its prefill", "during"),
                                  ("after its first token", "after"))]
        tables.append(("stream inter-token gaps by window (ms)", ["window", "length", *_STAT_COLS, "gaps"], rows))
        long = result.long
        tables.append(("long prompt", ["", ""], [
            ["prompt tokens (measured / requested)", f"{long.prompt_tokens} / {long.prompt_len_target}"],
            ["TTFT (ms)", _fmt(long.ttft * 1000.0 if long.ttft is not None else None)],
            ["worst stream gap during prefill / typical gap before", _fmt(w["stall_ratio"], 2) + "×"],
            ["streams decoding through the window", f"{w['streams_through_window']}/{result.config['n_streams']}"],
        ]))
    return tables


def sweep_table(sweep: SweepResult) -> tuple[str, list[str], list[list[str]]]:
    """One row per swept value with the headline numbers of its run."""
    rows = []
    for v, r in zip(sweep.values, sweep.runs):
        s = r.summary
        row = [str(v), _fmt(s["ttft_ms"]["p50"]), _fmt(s["ttft_ms"]["p99"]), _fmt(s["itl_ms"]["p50"]),
               _fmt(s["itl_ms"]["p99"]), _fmt(s["itl_ms"]["max"]), _fmt(s["output_throughput"])]
        if isinstance(r, StallResult):
            w = r.windows or {}
            long = r.long
            row += [_fmt((w.get("before_ms") or {}).get("p50")), _fmt((w.get("during_ms") or {}).get("max")),
                    _fmt(long.ttft * 1000.0 if long.ttft is not None else None)]
        rows.append(row)
    header = [sweep.param, "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "ITL max", "out tok/s"]
    if sweep.scenario == "stall":
        header += ["before p50", "during max", "long TTFT"]
    return f"sweep of {sweep.param} ({sweep.scenario}, ms)", header, rows


def print_tables(tables: list[tuple[str, list[str], list[list[str]]]], file: TextIO | None = None) -> None:
    """Rich tables when rich is installed, aligned plain text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    if Console is not None:
        console = Console(file=file)
        for title, header, rows in tables:
            t = Table(title=title, show_header=any(header))
            for i, h in enumerate(header):
                t.add_column(h, justify="left" if i == 0 else "right")
            for r in rows:
                t.add_row(*r)
            console.print(t)
        return
    out = []
    for title, header, rows in tables:
        all_rows = ([header] if any(header) else []) + rows
        widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]
        out.append(title)
        out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                for r in all_rows]
        out.append("")
    print("\n".join(out), file=file)


def _clean(v: Any) -> Any:
    """NaN/inf -> None so the file is strict JSON (a request the deadline kept from being sent has no start)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_json(obj: BenchResult | SweepResult, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_clean(obj.to_dict()), indent=2, default=str, allow_nan=False) + "\n")
    return p


def write_timeline_png(result: BenchResult, path: str | Path, max_rows: int = 64) -> Path:
    """Every request's token arrivals on its own row over time; the stall window shaded; the long first token marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    recs = [r for r in result.records if not math.isnan(r.start)][:max_rows]
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * max(len(recs), 2)))
    labels = []
    for row, r in enumerate(recs):
        color = "tab:red" if r.kind == "long" else "tab:blue"
        end = r.end if r.end is not None else (r.token_times[-1] if r.token_times else r.start)
        ax.hlines(row, r.start, end, color="0.85", linewidth=6, zorder=1)
        if r.token_times:
            ax.scatter(r.token_times, [row] * len(r.token_times), marker="|", s=120, color=color, linewidths=1,
                       zorder=2)
        ax.plot([r.start], [row], marker=">", color="0.3", markersize=5, zorder=3)
        n_prompt = str(r.prompt_tokens) if r.prompt_tokens is not None else f"~{r.prompt_len_target}"
        labels.append(f"{'LONG ' if r.kind == 'long' else ''}#{r.rid} ({n_prompt} tok)")
    if isinstance(result, StallResult) and result.long_send is not None and result.long_first_token is not None:
        ax.axvspan(result.long_send, result.long_first_token, color="tab:orange", alpha=0.25,
                   label=f"long prompt prefill ({(result.long_first_token - result.long_send) * 1000:.0f} ms)")
        long_row = next(i for i, r in enumerate(recs) if r.kind == "long")
        ax.plot([result.long_first_token], [long_row], marker="*", color="tab:red", markersize=14, zorder=4,
                label="long prompt's first token")
        if result.windows and result.windows["during_ms"]["max"] is not None:
            ax.set_title(f"{result.scenario}: worst stream gap during prefill "
                         f"{result.windows['during_ms']['max']:.0f} ms vs typical "
                         f"{_fmt(result.windows['before_ms']['p50'])} ms before", loc="left", fontsize=10)
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, ncol=2, frameon=False)
    else:
        ax.set_title(f"{result.scenario}: token arrivals per request")
    ax.set_yticks(range(len(recs)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time since start (s)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
