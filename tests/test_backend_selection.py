"""`auto` picks a backend per model: a GGUF on llama.cpp everywhere, an HF folder on torch (CUDA or CPU) or MLX on
Apple Silicon."""
from __future__ import annotations

import importlib.util
import platform

import pytest

from evenflow.backends.base import RunnerSettings, auto_backend, load_runner
from evenflow.backends.choice import Machine, choose_backend, model_format
from evenflow.backends.registry import backend_names


def machine(apple_silicon: bool, *installed: str) -> Machine:
    return Machine(apple_silicon=apple_silicon, installed=frozenset(installed))


LINUX_GPU = machine(False, "torch", "llamacpp")
MAC = machine(True, "mlx", "torch", "llamacpp")


def test_registered_backends():
    assert backend_names() == ["llamacpp", "mlx", "torch"]
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'; available: llamacpp, mlx, torch"):
        load_runner("tensorrt", "x.gguf", RunnerSettings())


@pytest.mark.parametrize("machine", [LINUX_GPU, MAC], ids=["cuda-or-cpu", "apple-silicon"])
def test_a_gguf_runs_on_llamacpp_on_every_machine(machine):
    assert choose_backend("gguf", machine) == "llamacpp"


def test_an_hf_folder_runs_on_torch_or_mlx():
    assert choose_backend("safetensors", LINUX_GPU) == "torch"  # torch takes CUDA when it sees a GPU, else the CPU
    assert choose_backend("safetensors", MAC) == "mlx"
    intel_mac = machine(False, "torch", "llamacpp")
    assert choose_backend("safetensors", intel_mac) == "torch"
    mac_without_mlx = machine(True, "torch", "llamacpp")
    assert choose_backend("safetensors", mac_without_mlx) == "torch"
    linux_with_mlx_cpu = machine(False, "mlx", "torch")  # MLX's Linux CPU build is for tests: never `auto`'s pick
    assert choose_backend("safetensors", linux_with_mlx_cpu) == choose_backend("gguf", linux_with_mlx_cpu) == "torch"


def test_missing_packages_fall_back_to_what_is_installed():
    only_torch = machine(False, "torch")
    assert choose_backend("gguf", only_torch) == "torch"  # torch reads the GGUFs of the architectures it knows
    assert choose_backend("gguf", machine(True, "mlx")) == "mlx"  # so does MLX
    only_llamacpp = machine(False, "llamacpp")
    # no installed backend reads an HF folder: the one that would (its loader names its missing package)
    assert choose_backend("safetensors", only_llamacpp) == "torch"
    assert choose_backend("safetensors", machine(True, "llamacpp")) == "mlx"
    assert choose_backend("unknown", machine(False)) == "llamacpp"  # nothing installed: the loader says so


def test_model_format_reads_the_file(tmp_path, synthetic_model):
    paths = synthetic_model("tiny", "llama", formats=("hf", "gguf"))
    assert model_format(str(paths["gguf"])) == "gguf"
    assert model_format(str(paths["hf"])) == "safetensors"
    junk = tmp_path / "x.gguf"
    junk.write_bytes(b"NOTGGUF")
    assert model_format(str(junk)) == "unknown"
    assert model_format(str(tmp_path / "missing")) == "unknown"


@pytest.mark.skipif(platform.system() == "Darwin", reason="Apple Silicon picks MLX for an HF folder")
def test_auto_backend_on_this_machine(synthetic_model):
    paths = synthetic_model("tiny", "llama", formats=("hf", "gguf"))
    if importlib.util.find_spec("llama_cpp"):
        assert auto_backend(str(paths["gguf"])) == "llamacpp"  # even where torch sees a GPU
    if importlib.util.find_spec("torch"):
        assert auto_backend(str(paths["hf"])) == "torch"


# ---- what each backend runs, by architecture (its BackendSpec.architectures) ----

def test_a_gguf_only_llamacpp_runs_goes_to_llamacpp_even_without_it():
    from evenflow.backends.choice import backends_for
    from evenflow.backends.registry import backend_spec
    from evenflow.backends.synthetic.archs import GGUF_ONLY

    only_torch = machine(False, "torch")
    assert choose_backend("gguf", only_torch, "llama") == "torch"  # torch reads a Llama-shaped GGUF itself
    for arch in GGUF_ONLY:  # ... but not these: llama.cpp's loader then says what is missing
        assert choose_backend("gguf", only_torch, arch) == "llamacpp"
        assert choose_backend("gguf", MAC, arch) == "llamacpp"
        assert backends_for(arch) == ["llamacpp"]
    assert backends_for("qwen3") == ["llamacpp", "mlx", "torch"]
    assert backends_for("qwen3", "safetensors") == ["mlx", "torch"]
    assert backend_spec("llamacpp").architectures is None


def test_a_forced_backend_that_cannot_run_the_architecture_says_which_can(synthetic_model):
    from evenflow.backends.base import UnsupportedArchitecture
    from evenflow.backends.synthetic.archs import GGUF_ONLY

    for arch in GGUF_ONLY:
        gguf = str(synthetic_model("tiny", arch, formats=("gguf",))["gguf"])
        if importlib.util.find_spec("llama_cpp"):
            assert auto_backend(gguf) == "llamacpp"
        for backend in ("torch", "mlx"):
            with pytest.raises(UnsupportedArchitecture) as e:
                load_runner(backend, gguf, RunnerSettings())  # refused before torch or mlx is even imported
            assert f"does not run architecture {arch!r}" in str(e.value) and f"{arch} runs on: llamacpp" in str(e.value)
    with pytest.raises(ValueError, match="GGUF only"):  # the factory writes no HF folder the backends could not run
        synthetic_model("tiny", "gemma3", formats=("hf", "gguf"))


@pytest.mark.skipif(not importlib.util.find_spec("torch"), reason="torch is not installed")
def test_the_daemon_forced_to_torch_answers_a_gemma3_request_with_the_reason(tmp_path, synthetic_model):
    import httpx
    from api_harness import start_daemon, upload_model

    d = start_daemon(tmp_path, backend="torch")
    try:
        upload_model(d.url, synthetic_model("tiny", "gemma3", formats=("gguf",))["gguf"], "g3")
        r = httpx.post(d.url + "/api/generate", json={"model": "g3", "prompt": "hi", "stream": False}, timeout=120)
        assert r.status_code == 400, r.text
        assert "architecture 'gemma3'" in r.json()["error"] and "llamacpp" in r.json()["error"]
    finally:
        d.stop()
