"""Is a greedy answer the same text however the daemon computed it? A default daemon (llama.cpp), real Gemma 3 270M
Q4_K_M, three extraction prompts over a ~1.5k-token document, 80 tokens each, temperature 0:
cold (the prompt computed in chunks), again (a prefix-cache hit), beside another stream (two rows per step), each
with speculation off and on (`EVENFLOW_SPECULATIVE`). Prints a table; writes greedy_invariance.{json,md} here.

    python docs/bench/greedy_invariance.py
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from default_stall import import_model  # noqa: E402
from perf_suite import serve_daemon  # noqa: E402
from speculative import EXTRACT, STORY, complete, document  # noqa: E402

GGUF = Path(os.path.expanduser("~/.cache/evenflow-real-models/gemma-3-270m-q4_k_m.gguf"))


def answers(spec: str, doc: str) -> dict[str, dict[str, str]]:
    """Each prompt's cold, cached and beside-a-stream answers with speculation `spec`."""
    out: dict[str, dict[str, str]] = {}
    with serve_daemon({"OLLAMA_MODELS": tempfile.mkdtemp(), "EVENFLOW_SPECULATIVE": spec},
                      "greedy_invariance_daemon.log") as url:
        import_model(url, GGUF)
        for name, q in EXTRACT[:3]:
            row = {"cold": complete(url, doc + q, 80, 0.0, 1)["text"],
                   "cached": complete(url, doc + q, 80, 0.0, 1)["text"]}
            side: dict = {}
            t = threading.Thread(target=lambda: side.update(complete(url, STORY, 200, 0.0, 1)))
            t.start()
            row["beside a stream"] = complete(url, doc + q, 80, 0.0, 1)["text"]
            t.join()
            out[name] = row
    return out


def main() -> None:
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: python ../shared/tools/real_models.py gemma3")
    doc = document(6000)
    res = {spec: answers(spec, doc) for spec in ("off", "ngram")}
    ref = res["off"]
    lines = ["| prompt | speculation | cached == cold | beside a stream == cold | == speculation off, cold |",
             "|---|---|---|---|---|"]
    for spec, rows in res.items():
        for name, row in rows.items():
            lines.append(f"| {name} | {spec} | {row['cached'] == row['cold']} | {row['beside a stream'] == row['cold']}"
                         f" | {row['cold'] == ref[name]['cold']} |")
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    head = (f"Gemma 3 270M Q4_K_M, llama.cpp, default daemon over HTTP, 80 greedy tokens; {cpu}; "
            f"{platform.machine()}; shared machine.\n\n")
    table = "\n".join(lines)
    print(head + table)
    (HERE / "greedy_invariance.md").write_text("# Greedy answers and how they were computed\n\n" + head + table + "\n")
    (HERE / "greedy_invariance.json").write_text(json.dumps({"cpu": cpu, "answers": res}, indent=1))


if __name__ == "__main__":
    main()
