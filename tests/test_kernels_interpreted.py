"""The Triton kernels' tests (tests/kernels), run under Triton's interpreter in a process of
their own (Triton decides at import whether kernels are interpreted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_triton_kernels_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = "\n".join(done.stdout.splitlines()[-25:])
    print(tail)
    assert done.returncode == 0, (
        f"tests/kernels failed under the interpreter:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    )
    assert " passed" in tail and " failed" not in tail
