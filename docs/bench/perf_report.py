"""Render docs/bench/perf_suite.json (written by perf_suite.py) as the markdown tables of docs/performance.md.

    python docs/bench/perf_report.py > docs/bench/perf_tables.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def f(v, digits=1):
    return "–" if v is None or v != v else f"{v:.{digits}f}"


def samples(row: dict, digits: int) -> str:
    return ", ".join(f(v, digits) for v in row.get("samples", [])) or "–"


def main(path: str = str(HERE / "perf_suite.json")) -> None:
    d = json.loads(Path(path).read_text())
    m = d["meta"]
    print(f"Run of {m['date']}: {m['model']}, {m['gguf_bytes'] / 1e6:.0f} MB; {m['threads']} threads on "
          f"{m['cpus']} CPUs ({m['cpu']}); client protocol {m['protocol']}; {m['streams']} streams.\n")
    for L in sorted({r["L"] for r in d["stall"]}):
        print(f"### Stall: {m['streams']} streams decoding, then a {L}-token prompt arrives\n")
        print("| configuration | P50 / P99 gap before (ms) | P50 / P99 / max gap during ingestion (ms) | "
              "long-prompt TTFT (s) | frontier TTFT (s) |")
        print("|---|---|---|---|---|")
        for r in (r for r in d["stall"] if r["L"] == L):
            b, du = r["before"], r["during"]
            print(f"| {r['config']} | {f(b.get('p50'))} / {f(b.get('p99'))} | {f(du.get('p50'))} / "
                  f"{f(du.get('p99'))} / {f(du.get('max'))} | {f(r['ttft_s'], 2)} | "
                  f"{f(r.get('frontier_ttft_s'), 2)} |")
        print()
    print("### The same prompt with no one streaming (TTFT alone)\n")
    print("Paired runs: the three servers are up together and take turns, rep after rep; median, then every sample.\n")
    print("| configuration | L | TTFT (s), median | samples (s) |")
    print("|---|---|---|---|")
    for r in sorted(d["ttft_alone"], key=lambda r: r["L"]):
        print(f"| {r['config']} | {r['L']} | {f(r['ttft_s'], 2)} | {samples(r, 2)} |")
    print("\n### Aggregate decode throughput (N concurrent streams, 96 tokens each, short prompts)\n")
    print("Paired runs as above; median tokens/s, then every sample.\n")
    print("| streams | evenflow tok/s | llama-server tok/s | ratio of medians | evenflow samples | llama-server samples |")
    print("|---|---|---|---|---|---|")
    by = {(r["config"], r["streams"]): r for r in d["throughput"]}
    for n in sorted({r["streams"] for r in d["throughput"]}):
        e, ls = by.get(("evenflow", n), {}), by.get(("llama-server", n), {})
        ev, lv = e.get("tok_s"), ls.get("tok_s")
        print(f"| {n} | {f(ev)} | {f(lv)} | {f(ev / lv if ev and lv else None, 2)} | {samples(e, 1)} | "
              f"{samples(ls, 1)} |")
    bw = d["bandwidth"]
    print(f"\nBandwidth bound: {bw['weight_bytes'] / 1e6:.0f} MB of weights read per decode step at a measured "
          f"{bw['measured_gbs']:.1f} GB/s (numpy sum over 256 MiB) -> at most "
          f"{bw['single_stream_bound_tok_s']:.1f} tokens/s for one stream.")


if __name__ == "__main__":
    main(*sys.argv[1:])
