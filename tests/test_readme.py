"""The README is a user's page: short, and its picture of how the plugin is built names every
module of the installed package (the parameter table, the per-request keys, the commands and the
Python examples are checked where their code lives: test_config, test_request_overrides,
test_doc_commands, tests/engine/test_readme_examples.py and test_serve.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAX_LINES = 250


def test_the_readme_is_short():
    assert len(README.splitlines()) <= MAX_LINES


def test_how_it_is_built_names_every_module():
    section = README.split("## How it is built", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\w+", section))
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "vllm_lookahead").rglob("*.py"))
        if p.name != "__init__.py" and p.stem not in named
    ]
    assert missing == []


def test_each_python_example_guards_or_needs_no_engine_of_its_own():
    """An example that builds an ``LLM`` starts vLLM's worker processes, which re-import the
    script: it must run under ``if __name__ == "__main__":`` to run pasted alone into a file."""
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    for block in blocks:
        if "LLM(" in block:
            assert 'if __name__ == "__main__":' in block.split("LLM(", 1)[0], block
