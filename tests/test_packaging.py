"""The wheel installs one top-level package, `evenflow`, holding daemon/, backends/, tui/, clients/."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_has_only_the_evenflow_namespace(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("evenflow-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"evenflow"}
    for module in ("evenflow/__init__.py", "evenflow/daemon/engine/scheduler.py", "evenflow/backends/base.py",
                   "evenflow/backends/torch/runner.py", "evenflow/backends/llamacpp/runner.py",
                   "evenflow/backends/mlx/runner.py", "evenflow/clients/cli.py", "evenflow/tui/__init__.py",
                   "evenflow/daemon/store/store.py"):
        assert module in names, module
    assert not any(n.startswith("evenflow/tests/") or n.startswith("tests/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "evenflow = evenflow.clients.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_editable_install_maps_the_repository():
    out = subprocess.run([sys.executable, "-c", "import evenflow, evenflow.daemon.engine as e; "
                          "print(evenflow.__file__); print(e.__file__)"], check=True, capture_output=True,
                         text=True, cwd="/").stdout.split()
    assert Path(out[0]).resolve() == ROOT / "__init__.py"
    assert Path(out[1]).resolve() == ROOT / "daemon" / "engine" / "__init__.py"
