"""The backend registry (backends/registry.py): what each backend declares it can do is what its runner does, `auto`
reads only the declarations, and nothing outside a backend's own package switches on its name."""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import itertools
from pathlib import Path

import pytest

from evenflow.backends.base import (KV_CACHE_TYPES, GrammarVocab, RunnerSettings, Tokenizer, UnsupportedArchitecture,
                                    load_runner)
from evenflow.backends.choice import Machine, backends_for, choose_backend, total_vram
from evenflow.backends.registry import LLAMA_DECODERS, backend_names, backend_spec, specs
from evenflow.backends.synthetic.archs import GGUF_ONLY
from evenflow.daemon.settings import load_settings
from evenflow.daemon.manager import ModelManager
from evenflow.daemon.model_types import LoadFailed, ModelRecord

from toy_runner import ToyRunner

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = [s.name for s in specs() if importlib.util.find_spec(s.package)]
SETTINGS = RunnerSettings(max_num_seqs=2, context_length=256)
FORMAT_OF = {"gguf": "gguf", "safetensors": "hf"}  # a spec's format -> the synthetic factory's


def installed(name: str):
    return pytest.param(name, id=name, marks=pytest.mark.skipif(name not in INSTALLED, reason=f"{name} not installed"))


def test_every_backend_declares_itself_once():
    assert backend_names() == ["llamacpp", "mlx", "torch"]
    assert [s.name for s in specs()] == ["llamacpp", "mlx", "torch"]  # auto's preference
    for s in specs():
        assert s.formats and set(s.formats) <= {"gguf", "safetensors"}
        assert set(s.kv_cache_types) <= set(KV_CACHE_TYPES) and {"auto", "f16"} <= set(s.kv_cache_types)
    assert backend_spec("llamacpp").kv_cache_types == KV_CACHE_TYPES  # every RunnerSettings.kv_cache_type
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'; available: llamacpp, mlx, torch"):
        backend_spec("tensorrt")


@pytest.mark.parametrize("name", [installed(n) for n in ("llamacpp", "mlx", "torch")])
def test_a_runner_does_what_its_backend_declares(name, synthetic_model):
    """Every declared format loads (a Llama-family model) and the runner says it is this backend; it takes tokens back
    as declared; a format it does not declare is refused before loading, naming the backends that read it."""
    spec = backend_spec(name)
    paths = synthetic_model("tiny", "llama", formats=("hf", "gguf"))
    for fmt in ("gguf", "safetensors"):
        path = str(paths[FORMAT_OF[fmt]])
        if fmt not in spec.formats:
            with pytest.raises(UnsupportedArchitecture, match=f"the {name} backend reads a GGUF file, not a "
                               "safetensors folder; mlx, torch read it"):
                load_runner(name, path, SETTINGS)
            continue
        runner = load_runner(name, path, SETTINGS)
        try:
            assert runner.backend == name and runner.can_rollback == spec.rollback
            assert runner.info.architecture in (spec.architectures or (runner.info.architecture,))
            tok = runner.tokenizer  # the whole Tokenizer contract, called directly by the engine and the API
            assert isinstance(tok, Tokenizer) and isinstance(tok.grammar_vocab(), GrammarVocab)
            assert tok.eos_id in tok.eos_ids and tok.id_to_piece(tok.eos_id)
        finally:
            runner.close()


@pytest.mark.parametrize("name", ["mlx", "torch"])
def test_a_backend_refuses_an_architecture_it_does_not_declare_naming_who_runs_it(name, synthetic_model):
    """A torch (or MLX) load of a gemma3 GGUF is refused before torch is imported, naming llama.cpp."""
    assert backend_spec(name).architectures == LLAMA_DECODERS
    for arch in GGUF_ONLY:
        gguf = str(synthetic_model("tiny", arch, formats=("gguf",))["gguf"])
        with pytest.raises(UnsupportedArchitecture) as e:
            load_runner(name, gguf, SETTINGS)
        assert f"the {name} backend does not run architecture {arch!r}" in str(e.value)
        assert f"{arch} runs on: llamacpp" in str(e.value) and backends_for(arch) == ["llamacpp"]


def test_a_backend_whose_package_is_missing_says_so(synthetic_model, monkeypatch):
    """`auto` may pick a backend nothing installed provides (an HF folder with only llama.cpp): a clear load error,
    never a ModuleNotFoundError out of the loader."""
    from evenflow.backends.base import ModelLoadError

    hf = str(synthetic_model("tiny", formats=("hf",))["hf"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ModelLoadError, match="the torch backend needs the Python package 'torch', which is not "
                                             "installed"):
        load_runner("torch", hf, SETTINGS)


@pytest.mark.skipif("llamacpp" not in INSTALLED, reason="llama_cpp not installed")
def test_llamacpp_honours_the_kv_cache_types_it_declares(synthetic_model):
    gguf = str(synthetic_model("tiny", "llama", formats=("gguf",), head_dim=32)["gguf"])  # q8_0 packs 32 values
    for kv in backend_spec("llamacpp").kv_cache_types:
        if kv in ("auto", "f16"):
            continue
        runner = load_runner("llamacpp", gguf, RunnerSettings(max_num_seqs=2, context_length=256, kv_cache_type=kv,
                                                              flash_attention="off"))
        try:
            assert runner.kv_types[0] == kv  # K always; V only with flash attention on (llama.cpp's rule)
        finally:
            runner.close()


def test_the_vram_probes_run():
    """Each installed backend's probe imports it and answers (this machine's GPU memory, 0 on a CPU-only one)."""
    for name in INSTALLED:
        got = backend_spec(name).probe_vram()
        assert isinstance(got, int) and got >= 0 and total_vram(name) == got


# ---- choose_backend reads the declarations only: every machine, format and architecture ----

ARCHS = (None, "llama", "qwen3", *GGUF_ONLY)


@pytest.mark.parametrize("apple", [False, True], ids=["linux", "apple-silicon"])
def test_auto_picks_an_installed_backend_that_runs_the_model_when_there_is_one(apple):
    names = [s.name for s in specs()]
    for k in range(len(names) + 1):
        for have in itertools.combinations(names, k):
            machine = Machine(apple_silicon=apple, installed=frozenset(have))
            for fmt, arch in itertools.product(("gguf", "safetensors"), ARCHS):
                got = backend_spec(choose_backend(fmt, machine, arch))
                assert machine.fits(got), (fmt, arch, have)  # never MLX off Apple Silicon
                able = [s for s in specs() if s.reads(fmt) and s.runs(arch) and machine.fits(s)]
                if any(s.name in have for s in able):  # one installed runs it: that one, and none preferred over it
                    assert got in able and got.name in have, (fmt, arch, have)
                    assert not any(s.name in have and s.preference < got.preference for s in able), (fmt, arch, have)
                elif able:  # none installed: one that would (its loader names its missing package)
                    assert got in able, (fmt, arch, have)


# ---- the manager asks the registry, not the backend's name ----

def _manager(tmp_path, backend: str, **record) -> tuple[ModelManager, list]:
    calls: list = []

    def loader(name, path, rs):
        calls.append((name, rs))
        return ToyRunner()

    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    settings = load_settings(env={"EVENFLOW_BACKEND": backend, "OLLAMA_KV_CACHE_TYPE": "q8_0"})
    return ModelManager(settings, lambda name: ModelRecord(name, str(path), **record), loader), calls


@pytest.mark.parametrize("name", ["llamacpp", "mlx", "torch"])
def test_the_manager_passes_a_projector_only_to_a_backend_that_runs_one(tmp_path, name):
    mgr, calls = _manager(tmp_path, name, projector="/p.gguf")

    async def run():
        (await mgr.acquire("m")).release()
        await mgr.shutdown()

    asyncio.run(run())
    spec = backend_spec(name)
    assert calls[0][1].projector_path == ("/p.gguf" if spec.vision else None)
    assert calls[0][1].kv_cache_type == "q8_0"  # passed on; a backend that does not honour it logs so


@pytest.mark.parametrize("name", ["mlx", "torch"])
def test_a_draft_model_on_a_backend_that_runs_none_is_refused_naming_the_one_that_does(tmp_path, name):
    assert not backend_spec(name).draft_model
    mgr, calls = _manager(tmp_path, name, params={"draft_model": "small"})

    async def run():
        with pytest.raises(LoadFailed, match=f"draft models run on the llama.cpp backend only .this model runs on "
                                             f"{name}"):
            await mgr.acquire("m")
        await mgr.shutdown()

    asyncio.run(run())


# ---- no switch on a backend's name outside its own package ----

BACKEND_PACKAGES = tuple(ROOT / "backends" / n for n in ("llamacpp", "mlx", "torch"))


def _names_compared(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every comparison with a backend's name: `x == "torch"`, `x in ("mlx", ...)`, a match case."""
    names = set(backend_names())
    hits = []
    for node in ast.walk(tree):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        for op in operands:
            elts = op.elts if isinstance(op, (ast.Tuple, ast.List, ast.Set)) else [op]
            hits += [(node.lineno, e.value) for e in elts if isinstance(e, ast.Constant) and e.value in names]
    return hits


def test_no_module_switches_on_a_backend_name_outside_its_package():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "docs") or any(path.is_relative_to(p) for p in BACKEND_PACKAGES):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{rel}:{line}: compares with {name!r}" for line, name in _names_compared(tree)]
    assert not found, "ask the backend's BackendSpec (backends/registry.py) instead:\n" + "\n".join(found)


def test_the_name_check_finds_a_switch():
    src = 'if backend == "llamacpp" or b in ("torch", "x"):\n    pass\nmatch b:\n    case "mlx": pass\n'
    assert sorted(n for _, n in _names_compared(ast.parse(src))) == ["llamacpp", "mlx", "torch"]


def test_only_lib_imports_llama_cpp():
    """Registering llama.cpp sets nothing: its OpenMP setting is made where llama_cpp is first imported (lib.py)."""
    for path in sorted((ROOT / "backends" / "llamacpp").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(m == "llama_cpp" or m.startswith("llama_cpp.") for m in mods) and path.name != "lib.py":
                assert path.name == "vision.py" and "mtmd_cpp" in ast.unparse(node), f"{path.name} imports llama_cpp"
