"""What a user gets from ``pip install``: the package data the benchmark and the tests need."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_an_installed_wheel_carries_its_prompts_and_licences(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("vllm_lookahead-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("specbench_questions.jsonl", "LICENSE-Apache-2.0.txt", "README.md"):
        assert f"vllm_lookahead/bench/data/{name}" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "vllm_lookahead/core/fitted.json" in names  # the draft rule's fitted numbers

    # Installed somewhere else, away from this checkout, the benchmark finds its prompts.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import vllm_lookahead.bench.prompts as P\n"
        "assert str(P.SPECBENCH_FILE).startswith(sys.argv[1]), P.SPECBENCH_FILE\n"
        "print(len(P.category_prompts('qa', 80)), len(P.category_prompts('mt_bench', 80)))\n"
        "import vllm_lookahead.core.fitted as F\n"
        "assert F.__file__.startswith(sys.argv[1]), F.__file__\n"
        "print(len(F.FITTED))\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no VLLM_LOOKAHEAD_SPECBENCH, no PYTHONPATH to this checkout
    out = subprocess.run([sys.executable, "-c", code, str(target)], cwd=tmp_path, env=env,
                         check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[:2] == ["80", "80"] and int(out.stdout.split()[2]) > 0
