"""The disk KV cache (daemon/engine/kv_disk.py): files that are damaged, foreign, cut off or killed mid-write are
never read; restored prefixes give the cold run's greedy tokens on every backend and KV layout; a daemon reads a
document back after `keep_alive: 0` and after a restart."""
from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.backends.synthetic.archs import GGUF_ONLY
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.disk_prefixes import prompt_keys
from evenflow.daemon.engine.kv_disk import DiskKVCache

NS = "a" * 32


def chain(n: int, seed: int = 0) -> list[bytes]:
    return prompt_keys(list(random.Random(seed).choices(range(100), k=n * 4 + 1)), 4)


def saved(tmp: Path, keys: list[bytes], payload: bytes, budget: int = 1 << 30) -> DiskKVCache:
    disk = DiskKVCache(tmp, budget, min_tokens=1)
    disk.save(NS, keys, payload, {"tokens": len(keys) * 4})
    assert disk.flush(30)
    return disk


# ---- files ----

def test_save_lookup_read_and_partial_match(tmp_path):
    tokens = random.Random(0).choices(range(100), k=25)
    keys = prompt_keys(tokens, 4)  # 6 full blocks
    disk = saved(tmp_path, keys, b"kv" * 1000)
    entry, n = disk.lookup(NS, keys)
    assert n == 6
    assert disk.read(NS, entry, n).payload == b"kv" * 1000
    assert disk.lookup(NS, chain(9, seed=1)) is None
    # a prompt sharing 4 blocks and then differing: the keys chain, so exactly 4 match
    entry, n = disk.lookup(NS, prompt_keys(tokens[:16] + [7] * 13, 4))
    assert n == 4 and disk.read(NS, entry, n).num_blocks == 4
    fresh = DiskKVCache(tmp_path, 1 << 30)  # a restarted daemon indexes what is on disk
    assert fresh.lookup(NS, keys)[1] == 6
    assert fresh.lookup("b" * 32, keys) is None  # another model or KV configuration


def test_damaged_truncated_foreign_and_half_written_files_are_never_read(tmp_path):
    keys = chain(5)
    disk = saved(tmp_path, keys, bytes(range(256)) * 40)
    path = next((tmp_path / NS).glob("*.kv"))
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # one flipped payload byte
    path.write_bytes(bytes(data))
    entry, n = disk.lookup(NS, keys)
    assert disk.read(NS, entry, n) is None and not path.exists() and disk.rejected_files == 1
    assert disk.lookup(NS, keys) is None

    disk = saved(tmp_path, keys, bytes(range(256)) * 40)
    path.write_bytes(path.read_bytes()[:-1000])  # cut off mid-payload
    assert DiskKVCache(tmp_path, 1 << 30).lookup(NS, keys) is None and not path.exists()

    disk = saved(tmp_path, keys, b"x" * 999)
    (tmp_path / ("c" * 32)).mkdir()
    foreign = tmp_path / ("c" * 32) / path.name
    os.replace(path, foreign)  # a file of another namespace moved here: its header names the other one
    assert DiskKVCache(tmp_path, 1 << 30).lookup("c" * 32, keys) is None and not foreign.exists()

    import json as _json
    for i, junk in enumerate([b"EVENFLOW-KV\n\x02", b"EVENFLOW-KV\n" + b"\xff" * 40,  # cut off; absurd header length
                              b"EVENFLOW-KV\n" + len(h := _json.dumps({"format": 1, "namespace": NS, "blocks": 10**15,
                                                                        "payload_len": 1}).encode()).to_bytes(4, "little")
                              + h]):  # a header claiming 10^15 blocks
        (tmp_path / NS / f"{i}{'0' * 31}.kv").write_bytes(junk)
    hostile = DiskKVCache(tmp_path, 1 << 30)
    assert hostile.lookup(NS, keys) is None and hostile.rejected_files == 3
    assert not list((tmp_path / NS).glob("*.kv"))

    tmp = tmp_path / NS / f".{path.name}.tmp123-4"  # what a writer killed before its rename leaves
    tmp.write_bytes(b"EVENFLOW-KV\n" + b"\0" * 50)
    assert DiskKVCache(tmp_path, 1 << 30).lookup(NS, keys) is None


def test_a_longer_prefix_replaces_the_saved_shorter_one_and_the_budget_evicts_the_oldest(tmp_path):
    tokens = list(random.Random(3).choices(range(100), k=41))
    short, long_ = prompt_keys(tokens[:21], 4), prompt_keys(tokens, 4)
    disk = saved(tmp_path, short, b"s" * 500)
    disk.save(NS, long_, b"l" * 1000, {})
    assert disk.flush(30)
    files = list((tmp_path / NS).glob("*.kv"))
    assert len(files) == 1 and files[0].name == f"{long_[-1].hex()}.kv"
    assert disk.lookup(NS, short)[1] == len(short)  # served from the longer entry
    size = files[0].stat().st_size
    small = DiskKVCache(tmp_path, int(size * 2.5), min_tokens=1)
    for seed in (10, 11):
        small.save(NS, chain(10, seed), b"l" * 1000, {})
        assert small.flush(30)
        time.sleep(0.01)  # distinct modification times on coarse file systems
    assert small.lookup(NS, long_) is None  # the least recently used went
    assert small.usage()["entries"] == 2 and small.usage()["size"] <= small.budget


WRITER = textwrap.dedent("""
    import sys
    from evenflow.daemon.engine.kv_disk import DiskKVCache
    from evenflow.daemon.engine.disk_prefixes import prompt_keys
    disk = DiskKVCache(sys.argv[1], 1 << 40, min_tokens=1)
    for i in range(10_000):
        disk.save("n" * 32, prompt_keys([i] * 4 * 20 + [1], 4), bytes([i % 251]) * (8 << 20), {})
        disk.flush()
        print(i, flush=True)
""")


def test_kill_9_mid_write_leaves_nothing_readable_but_whole_entries(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # some entries are whole; the next is being written when the kill comes
            assert proc.stdout.readline(), "the writer died"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    disk = DiskKVCache(tmp_path, 1 << 40)
    whole = 0
    for i in range(10_000):
        hit = disk.lookup("n" * 32, prompt_keys([i] * 4 * 20 + [1], 4))
        if hit is None:
            break
        r = disk.read("n" * 32, *hit)
        assert r is not None and r.payload == bytes([i % 251]) * (8 << 20)
        whole += 1
    assert whole >= 3 and disk.rejected_files == 0
    assert disk.lookup("n" * 32, prompt_keys([whole + 1] * 4 * 20 + [1], 4)) is None


# ---- every backend and KV layout: a restored prefix gives the cold tokens ----

LAYOUTS = [
    pytest.param(("torch", "hf", None), id="torch"),
    pytest.param(("mlx", "hf", None), id="mlx",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")),
    pytest.param(("llamacpp", "gguf", "streams"), id="llamacpp-streams",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="no llama-cpp-python")),
    pytest.param(("llamacpp", "gguf", "unified"), id="llamacpp-unified",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="no llama-cpp-python")),
]
# The factory's GGUF-only architectures, in llama.cpp's default layout for a pool of full windows (streams); a hybrid
# recurrent and a sliding-window one in the unified layout too (their prefixes carry state checkpoints or windows:
# recurrent.pack_prefix, window.SlidingWindow.export).
LAYOUTS += [pytest.param(("llamacpp", "gguf", layout, arch), id=f"llamacpp-{layout}-{arch}",
                         marks=pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="no llama-cpp-python"))
            for arch in GGUF_ONLY for layout in (("streams", "unified") if arch in ("lfm2", "gemma3") else ("streams",))]


@pytest.fixture(scope="module", params=LAYOUTS)
def runner(request, synthetic_model):
    backend, fmt, layout, *arch = request.param
    path = synthetic_model("tiny", arch[0] if arch else "llama", formats=(fmt,), gguf_dtype="f32", qk_std=0.3)[fmt]
    blocks = 4 * 512 // 16 if layout == "streams" else 96
    r = load_runner(backend, str(path), RunnerSettings(max_num_seqs=4, block_size=16, num_kv_blocks=blocks,
                                                        context_length=512, max_num_batched_tokens=256,
                                                        dtype="float32", flash_attention="off", kv_layout=layout))
    yield r
    r.close()


def run(engine: Engine, prompts: list[list[int]], n: int = 6) -> list[list[int]]:
    streams = [engine.submit(p, SamplingParams(temperature=0, num_predict=n), loop=None) for p in prompts]
    while engine.run_once():
        pass
    return [[t for d in s for t in d.token_ids] for s in streams]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), doc_len=st.integers(40, 200), shared=st.lists(st.integers(0, 220), min_size=1,
                                                                                   max_size=3))
def test_restored_prefixes_give_the_cold_greedy_tokens(runner, tmp_path_factory, seed, doc_len, shared):
    rng = random.Random(seed)
    word = lambda: rng.randrange(10, runner.info.vocab_size - 64)  # noqa: E731
    docs = [[word() for _ in range(doc_len)], [word() for _ in range(doc_len // 2 + 20)]]
    # prompts sharing a random part of a document (all of it, some blocks, none), then their own tail
    asks = [docs[i % 2][: min(k, len(docs[i % 2]))] + [word() for _ in range(rng.randrange(1, 9))]
            for i, k in enumerate(shared)]
    cold = run(Engine(runner, EngineConfig(max_num_batched_tokens=48)), asks)
    disk = DiskKVCache(tmp_path_factory.mktemp("kv"), 1 << 30, min_tokens=32)
    first = Engine(runner, EngineConfig(max_num_batched_tokens=48), kv_disk=disk, model_id="m")
    run(first, docs)
    first.shutdown()
    assert disk.flush(30)
    again = Engine(runner, EngineConfig(max_num_batched_tokens=48), kv_disk=disk, model_id="m")  # memory is empty
    again.warm_disk_cache()
    assert run(again, asks) == cold
    saved_blocks = {len(e.keys) for ns in disk._entries.values() for e in ns.values()}
    assert saved_blocks, "nothing was saved"
    if any(min(k, len(docs[i % 2])) >= 48 for i, k in enumerate(shared)):  # 3 blocks of a document: some from disk
        # a window model's saved prefix read back cut short of its windows is refused and recomputed (the disk lookup
        # does not yet ask the backend where it can resume): equal to cold, counted as failed
        window = getattr(runner, "_window", None) is not None
        assert again.disk.restored_tokens > 0 or (window and again.disk.failed)
        assert again.disk.failed == 0 or window
    assert again.blocks.num_free == again.blocks.num_blocks
    other = Engine(runner, EngineConfig(max_num_batched_tokens=48), kv_disk=disk, model_id="other weights")
    run(other, asks[:1])
    assert other.disk.restored_tokens == 0  # another model's namespace


def test_a_request_aborted_while_its_prefix_is_read_ends_and_frees_everything(runner, tmp_path):
    import threading

    class SlowDisk(DiskKVCache):
        gate = threading.Event()
        reading = threading.Event()

        def read(self, *args):
            self.reading.set()
            assert self.gate.wait(60)
            return super().read(*args)

    disk = SlowDisk(tmp_path, 1 << 30, min_tokens=32)
    doc = [random.Random(5).randrange(10, 200) for _ in range(120)]
    first = Engine(runner, EngineConfig(max_num_batched_tokens=48), kv_disk=disk, model_id="m")
    run(first, [doc])
    first.shutdown()
    assert disk.flush(30)
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=48), kv_disk=disk, model_id="m")
    eng.start()
    try:
        stream = eng.submit(doc + [11, 12], SamplingParams(temperature=0, num_predict=50), loop=None)
        assert disk.reading.wait(60)
        eng.abort(stream.seq_id)  # the client left before the request reached the scheduler
        disk.gate.set()
        deltas = list(stream)
        assert deltas[-1].done and deltas[-1].done_reason == "abort"
        while not eng.idle:
            time.sleep(0.01)
        assert eng.stats().running == eng.stats().waiting == 0
    finally:
        eng.shutdown()
    assert eng.blocks.num_free == eng.blocks.num_blocks


# ---- the daemon: after keep_alive 0, and after a restart ----

def test_a_document_survives_unload_and_restart(tmp_path, synthetic_model):
    pytest.importorskip("llama_cpp")
    from api_harness import start_daemon, upload_model

    gguf = synthetic_model("tiny", "llama", formats=("gguf",), gguf_dtype="f32")["gguf"]
    doc = " ".join(f"word{i} and more text about item {i}." for i in range(60))

    def ask(url: str, question: str, keep_alive: str | int = "5m") -> dict:
        r = httpx.post(url + "/api/generate", json={"model": "doc", "prompt": doc + "\n" + question, "stream": False,
                                                    "keep_alive": keep_alive, "raw": True,
                                                    "options": {"temperature": 0, "num_predict": 8}}, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    def metric(url: str, name: str) -> float:
        lines = httpx.get(url + "/metrics").text.splitlines()
        return sum(float(x.split()[-1]) for x in lines if x.startswith(name + "{") or x.startswith(name + " "))

    d = start_daemon(tmp_path, backend="llamacpp")
    try:
        upload_model(d.url, gguf, "doc")
        first = ask(d.url, "Question one?", keep_alive=0)
        deadline = time.monotonic() + 60
        while httpx.get(d.url + "/api/ps").json()["models"] and time.monotonic() < deadline:
            time.sleep(0.05)
        d.ctx.manager.kv_disk.flush(60)
        ps = httpx.get(d.url + "/api/ps").json()
        assert ps["models"] == [] and ps["kv_cache"]["entries"] >= 1
        again = ask(d.url, "Question one?")
        assert again["response"] == first["response"]
        assert again["prompt_eval_count"] == first["prompt_eval_count"]
        restored = metric(d.url, "evenflow_kv_disk_restored_tokens_total")
        assert restored >= 256
        ps_cli = subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "ps"], capture_output=True, text=True,
                                env={**os.environ, "OLLAMA_HOST": d.url}, timeout=120)
        assert "KV disk cache:" in ps_cli.stdout and "in 1 saved prefix (" in ps_cli.stdout, ps_cli.stdout + ps_cli.stderr
    finally:
        d.stop()
    d = start_daemon(tmp_path, backend="llamacpp")  # the same store and cache folder: a restart
    try:
        assert ask(d.url, "Question one?")["response"] == first["response"]
        assert metric(d.url, "evenflow_kv_disk_restored_tokens_total") >= 256
        assert metric(d.url, "evenflow_kv_disk_entries") >= 1
    finally:
        d.stop()


def test_the_settings_take_sizes_and_zero_turns_the_cache_off(tmp_path):
    from evenflow.daemon.settings import ConfigError, load_settings
    from evenflow.daemon.manager import ModelManager

    assert load_settings({}).kv_cache_size == 10 * 2**30
    assert load_settings({"EVENFLOW_KV_CACHE_SIZE": "1.5GiB"}).kv_cache_size == int(1.5 * 2**30)
    assert load_settings({"EVENFLOW_KV_CACHE_SIZE": "500 MB"}).kv_cache_size == 500 * 10**6
    assert load_settings({"EVENFLOW_KV_CACHE_SIZE": "4096"}).kv_cache_size == 4096
    with pytest.raises(ConfigError, match="EVENFLOW_KV_CACHE_SIZE"):
        load_settings({"EVENFLOW_KV_CACHE_SIZE": "lots"})
    s = load_settings({"EVENFLOW_KV_CACHE_SIZE": "0", "EVENFLOW_KV_CACHE_DIR": str(tmp_path)})
    assert s.kv_cache_dir == tmp_path and ModelManager(s, lambda name: None).kv_disk is None
