"""The product speaks of the software, its behaviour and its measurements -- never of who worked on
it when, or what was planned next.

Every text file under README.md, docs/, configs/, deploy/, vllm_lookahead/ and tests/ is scanned
for numbered work-log labels (a numbered work session, ticket or sub-point) and hand-over phrases;
each hit is listed as ``file:line: text``.  Measurements are labelled by date, machine and
command instead (``docs/results.md``).  References to other projects' issues (vLLM, SGLang, ...)
stay allowed: see :func:`upstream_reference`.

The patterns are assembled from pieces so that this file does not match itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("README.md", "docs", "configs", "deploy", "vllm_lookahead", "tests")

# Not our voice: recordings (engine output, prompts and logs of benchmark runs, kept verbatim;
# their .md reports and .py scripts are scanned) and third-party prompt sets.
RECORDING_DIRS = ("docs/bench",)
RECORDING_SUFFIXES = {".json", ".jsonl", ".csv", ".log", ".txt", ".svg"}
THIRD_PARTY_DIRS = ("benchmarks/data",)
SKIPPED_DIR_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}

_SESSION, _ISSUE, _POINT = "sess" + "ion", "iss" + "ue", "poi" + "nt"
LABEL = re.compile(rf"\b(?:{_SESSION}s?[ -]?[0-9]|{_ISSUE}s? [0-9]+|{_POINT} [0-9])", re.IGNORECASE)
PHRASES = (
    "whoever " + "works on",
    "next " + _SESSION,
    "this " + _SESSION,
    "earlier " + _SESSION + "s",
    "a next " + "person",
)
PHRASE = re.compile("|".join(re.escape(p) for p in PHRASES), re.IGNORECASE)

# A label within 24 characters after another project's name (vLLM, SGLang, llama.cpp, PyTorch,
# ArcticInference) or the word "upstream" names that project's tracker, not this software's.
UPSTREAM = re.compile(r"\b(?:vLLM|SGLang|llama\.cpp|PyTorch|ArcticInference|upstream)\b[\w' ]{0,24}$", re.IGNORECASE)
URL = re.compile(r"https?://\S+")


def upstream_reference(line: str, match: re.Match[str]) -> bool:
    """Whether ``match`` in ``line`` refers to another project: inside a URL or right after an
    upstream project's name."""
    if any(u.start() <= match.start() < u.end() for u in URL.finditer(line)):
        return True
    return UPSTREAM.search(line[: match.start()]) is not None


def work_log_hits(line: str) -> list[str]:
    """The work-log labels and hand-over phrases in ``line`` (upstream references left out)."""
    found = [m for m in LABEL.finditer(line) if not upstream_reference(line, m)]
    found += list(PHRASE.finditer(line))
    return [m.group(0) for m in found]


def _scanned(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    if any(rel.startswith(d + "/") for d in THIRD_PARTY_DIRS):
        return False
    if any(rel.startswith(d + "/") for d in RECORDING_DIRS) and path.suffix in RECORDING_SUFFIXES:
        return False
    return True


def _text_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in candidates:
            if path.is_file() and not SKIPPED_DIR_NAMES & set(path.parts) and _scanned(path):
                files.append(path)
    return files


def _read_text(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_work_log_labels_in_the_product():
    hits = []
    for path in _text_files():
        text = _read_text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if work_log_hits(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:160]}")
    assert not hits, "work-log labels (label measurements by date, machine and command):\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "line",
    [
        f"## 2026-11-25 ({_SESSION} 14) -- shared pool",
        f"as measured in {_SESSION.capitalize()} 13's run",
        f"the draft rule ({_ISSUE} 11, {_POINT} 2)",
        f"against the {_SESSION}-3 run",
        f"# Design notes (for whoever {'works on'} this next)",
        f"Full trees were not re-run this {_SESSION}",
    ],
)
def test_work_log_labels_are_found(line):
    assert work_log_hits(line)


@pytest.mark.parametrize(
    "line",
    [
        f"a known vLLM {_ISSUE} 6993 (fixed upstream)",
        f"see https://github.com/vllm-project/vllm/{_ISSUE}s/6993 for the report",
        f"upstream {_ISSUE} 1234 tracks it",
        f"SGLang's {_ISSUE} 42",
        "## 2026-11-25 -- shared pool against suffix decoding (Intel Xeon, 2 cores)",
        "the test session's toy servers",
    ],
)
def test_upstream_references_and_plain_text_pass(line):
    assert work_log_hits(line) == []
