"""What a user gets from ``pip install``: the runtime and nothing else.

The wheel holds the plugin (``vllm_lookahead``: config, core, engine, kernels, the command line,
the bundled model's preparation) with its data and licence; the benchmarks (``benchmarks/``) and
the test helpers (``tests/support/``) stay in the checkout.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_PACKAGES = {
    "vllm_lookahead",
    "vllm_lookahead/core",
    "vllm_lookahead/engine",
    "vllm_lookahead/engine/hooks",
    "vllm_lookahead/engine/step",
    "vllm_lookahead/engine/propose",
    "vllm_lookahead/engine/metrics",
    "vllm_lookahead/kernels",
}


def test_the_wheel_holds_the_runtime_only(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("vllm_lookahead-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    files = {n for n in names if ".dist-info/" not in n}
    folders = {str(Path(n).parent) for n in files}
    assert folders == RUNTIME_PACKAGES, folders ^ RUNTIME_PACKAGES
    assert not [n for n in files if Path(n).name.startswith(("test_", "conftest"))]
    assert "vllm_lookahead/core/fitted.json" in files  # the draft rule's fitted numbers
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    # Installed somewhere else, away from this checkout, the plugin imports and finds its data.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import vllm_lookahead.core.fitted as F, vllm_lookahead.config as C\n"
        "assert F.__file__.startswith(sys.argv[1]), F.__file__\n"
        "print(len(F.FITTED), C.LookaheadConfig().window_size)\n"
        "import importlib.util as u\n"
        "print(u.find_spec('benchmarks') is None and u.find_spec('support') is None)\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH to this checkout
    out = subprocess.run(
        [sys.executable, "-c", code, str(target)],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    fitted, window, alone = out.stdout.split()
    assert int(fitted) > 0 and window == "7" and alone == "True"
