"""llama.cpp's OpenMP threads poll briefly at a barrier, then sleep (issue 38): set when the backend is imported,
before llama.cpp's library loads, unless the user chose an OpenMP wait policy of their own."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import os, evenflow.backends.llamacpp.runner; "
         "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[-2]


@pytest.mark.skipif(not __import__("importlib").util.find_spec("llama_cpp"), reason="llama-cpp-python not installed")
def test_short_barrier_polling_unless_the_user_set_one() -> None:
    assert _probe() == "1000 None"
    assert _probe(OMP_WAIT_POLICY="active") == "None active"
    assert _probe(GOMP_SPINCOUNT="300000") == "300000 None"
