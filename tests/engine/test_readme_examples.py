"""The README's in-process Python example runs as written, on a fresh interpreter, with the
bundled model (the OpenAI-client example runs against the bundled-model server in test_serve.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import readme_python_block

pytestmark = [pytest.mark.engine, pytest.mark.real_model]


def test_readme_python_example_runs(real_model, engines, tmp_path):
    engines.close_all()  # the example asks for a share of free memory: no other engine holds any
    script = tmp_path / "example.py"
    script.write_text(readme_python_block("# Python: the bundled model"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    text = done.stdout.strip().splitlines()
    assert text and text[-1].strip(), done.stdout[-2000:]
    print(text[-1])
