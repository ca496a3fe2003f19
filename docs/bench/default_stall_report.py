"""Render docs/bench/default_stall.json (from default_stall.py) as the markdown tables of docs/performance.md.

    python docs/bench/default_stall_report.py [docs/bench/default_stall.json] > docs/bench/default_stall.md
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BLOCK = 16  # evenflow's KV block size: step events count blocks (older events carry no "held")


EDGES = (512, 1024, 2048, 4096, 6144, 8192, 10240, 12288, 14336, 16384, 20480, 24576, 32768)


def f(x, nd=1) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def sb_cells(sb: dict) -> list[str]:
    w = sb.get("windows", {})
    b, d, a = w.get("baseline", {}), w.get("during_prefill", {}), w.get("after", {})
    long = sb.get("long", {})
    return [f"{f(d.get('p50_ms'))} / **{f(d.get('p99_ms'))}** / {f(d.get('max_ms'))}",
            f"**{f(long.get('ttft_s'), 2)}**", f"{f(b.get('mean_ms'))} / {f(a.get('mean_ms'))}",
            str(long.get("server_prompt_tokens") or long.get("est_prompt_tokens") or "–")]


def eb_cells(eb: dict) -> list[str]:
    st = eb.get("stall") or {}
    w = st.get("windows") or {}
    d, b, a = w.get("during_ms", {}), w.get("before_ms", {}), w.get("after_ms", {})
    ttft = st.get("long_ttft_ms")
    return [f"{f(d.get('p50'))} / **{f(d.get('p99'))}** / {f(d.get('max'))}",
            f"**{f(ttft / 1e3 if ttft else None, 2)}**", f"{f(b.get('mean'))} / {f(a.get('mean'))}",
            str(st.get("long_prompt_tokens") or "–")]


def load_cell(row: dict) -> str:
    ld = row.get("load", {})
    la = ld.get("loadavg_start", [None])[0], ld.get("loadavg_end", [None])[0]
    return f"{f(la[0])}→{f(la[1])}, {f(ld.get('cpu_pressure_pct'), 0)}%"


def label(r: dict) -> str:
    """evenflow's rows name their settings and commit; every row says when it finished (rows compare side by side)."""
    name = f"evenflow {r.get('label') or ''} @ {r.get('git', '?')}".replace("  ", " ") if r["server"] == "evenflow" \
        else r["server"]
    return f"{name}, {r['finished'][11:16]}" if r.get("finished") else name


def stall_table(rows: list[dict]) -> list[str]:
    out = ["| L | server | client | P50 / P99 / max gap during ingestion (ms) | long-prompt TTFT (s) | "
           "mean gap before / after (ms) | prompt tokens | load avg start→end, CPU pressure |",
           "|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["scenario"] == "stall"), key=lambda r: (r["L"], r.get("finished", ""))):
        server = label(r)
        for key in r:  # the clients in the order they ran ("stream_bench#2": the same client again)
            kind, _, again = key.partition("#")
            name = {"stream_bench": "stream_bench", "evenflow_bench": "evenflow bench"}.get(kind)
            if name:
                cells = sb_cells(r[key]) if kind == "stream_bench" else eb_cells(r[key])
                out.append("| " + " | ".join([str(r["L"]), server, name + (f" (again, #{again})" if again else ""),
                                              *cells, load_cell(r)]) + " |")
    return out


def alone_table(rows: list[dict]) -> list[str]:
    out = ["| L | server | TTFT (s) | prompt tokens | load avg start→end, CPU pressure |", "|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["scenario"] == "prefill"), key=lambda r: (r["L"], r.get("finished", ""))):
        s = next((x for x in r.get("stream_bench", {}).get("streams", []) if x.get("role") == "long"), {})
        server = label(r)
        out.append(f"| {r['L']} | {server} | **{f(s.get('ttft_s'), 2)}** | {s.get('server_prompt_tokens', '–')} | "
                   f"{load_cell(r)} |")
    return out


def held_tokens(s: dict) -> int | None:
    """What a step's queries attend: the unified cache's cells (`held`), else the running sequences' own tokens."""
    return s["held"] if s.get("held") is not None else s.get("running_tokens")


def step_cost_table(rows: list[dict]) -> list[str]:
    """Steps with 4 decodes, by the tokens held: the unified cache's cells before the step (running + cached
    prefixes), or with per-sequence streams the tokens the running sequences hold."""
    bins: dict[tuple[str, int, int], tuple[list[float], list[tuple[int, float]]]] = {}
    for r in rows:
        if r["server"] != "evenflow":
            continue
        for s in r.get("steps", []):
            if s.get("decodes") != 4 or held_tokens(s) is None:
                continue
            key = (f"{r.get('label', '')} @ {r.get('git', '?')}".strip(), r["L"], next((e for e in EDGES if held_tokens(s) <= e), EDGES[-1] * 2))
            dec, mix = bins.setdefault(key, ([], []))
            (mix.append((s["prefill_tokens"], s["forward_ms"])) if s["prefill_tokens"] else dec.append(s["forward_ms"]))
    out = ["| daemon run | L | tokens held (≤) | 4 decodes alone: steps, median ms | 4 decodes + a chunk: steps, "
           "median chunk, median ms |", "|---|---|---|---|---|"]
    med = statistics.median
    for (label, L, e), (dec, mix) in sorted(bins.items()):
        a = f"{len(dec)}, {med(dec):.1f}" if dec else "–"
        m = f"{len(mix)}, {med(p for p, _ in mix):.0f}, {med(t for _, t in mix):.1f}" if mix else "–"
        out.append(f"| {label} | {L} | {e} | {a} | {m} |")
    return out


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "default_stall.json"
    d = json.loads(path.read_text())
    rows = d["rows"]
    print(f"CPU: {d.get('cpu', '?')}\n")
    print("\n".join(stall_table(rows)) + "\n")
    print("\n".join(alone_table(rows)) + "\n")
    print("\n".join(step_cost_table(rows)))


if __name__ == "__main__":
    main()
