"""Every command a user would paste from the reference docs runs as written.

The code lines of README.md and the reference pages (fenced blocks and 4-space indented blocks)
that call ``vllm-lookahead``, ``python -m vllm_lookahead...``, ``python -m benchmarks...`` or ``make``
are collected, with
line continuations joined.  Each ``make`` line must dry-run (``make -n``); each command's
options must be ones its ``--help`` lists (for ``serve``: ours, then vLLM's ``--help=all``);
every lookahead configuration in it (``--speculative-config`` JSON, bench ``lookahead:{...}``
specs) must validate.  Placeholders (MODEL, DIR, ...) are fine: only options and configurations
are checked, nothing is served or benchmarked.  The Python examples of the README run in
tests/engine/test_readme_examples.py and tests/engine/test_serve.py.

docs/results.md and its dated archive (docs/archive/) are left out: the archive records how each
measurement was taken, with the options of its day.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/benchmarking.md", "docs/design.md", "configs/README.md", "deploy/README.md")
PREFIXES = (
    ".venv/bin/vllm-lookahead ",
    "vllm-lookahead ",
    ".venv/bin/python -m vllm_lookahead",
    "python -m vllm_lookahead",
    "python3 -m vllm_lookahead",
    ".venv/bin/python -m benchmarks",
    "python -m benchmarks",
    "make ",
)


def code_lines(text: str) -> list[str]:
    """Lines of fenced and 4-space indented code blocks, continuations joined, prompts dropped."""
    out, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or line.startswith("    ")):
            pending = ""
            continue
        line = pending + line.strip().removeprefix("$ ")
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        out.append(line)
    return out


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) of every command line a user would paste."""
    found = []
    for doc in DOCS:
        for line in code_lines((ROOT / doc).read_text()):
            if line.startswith(PREFIXES):
                found.append((doc, line))
    return found


def argv_of(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    return [w.strip("[]") for w in words if w.strip("[]")]


@functools.cache
def help_text(*program: str) -> str:
    done = subprocess.run([*program, "--help"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, f"{program} --help failed:\n{done.stderr[-2000:]}"
    return done.stdout


@functools.cache
def vllm_serve_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "vllm_lookahead.cli", "serve", "--help=all"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def options_help(argv: list[str]) -> tuple[list[str], str]:
    """(the options given, the help text they must appear in) of one command."""
    if argv[0].endswith("vllm-lookahead"):
        cli = (sys.executable, "-m", "vllm_lookahead.cli")
        sub, args = argv[1], argv[2:]
        text = help_text(*cli, sub)
        if sub == "serve":
            text += vllm_serve_help()
        return args, text
    module = argv[argv.index("-m") + 1]
    return argv[argv.index("-m") + 2 :], help_text(sys.executable, "-m", module)


def check_configs(args: list[str]) -> None:
    """Every lookahead configuration among ``args`` validates."""
    from benchmarks.methods import parse_method
    from vllm_lookahead.config import LookaheadConfig

    for i, arg in enumerate(args):
        if arg in ("--speculative-config", "-sc") and i + 1 < len(args):
            value = args[i + 1]
            cat = re.fullmatch(r"\$\(cat (\S+)\)", value)  # "$(cat configs/X.json)": the file's JSON
            spec = json.loads((ROOT / cat.group(1)).read_text() if cat else value)
            if spec.get("method") == "lookahead":
                LookaheadConfig.from_user_dict(spec)
        if re.match(r"(none|ngram|suffix|lookahead)(:\{.*\})?$", arg):
            parse_method(arg)


COMMANDS = doc_commands()


def test_the_docs_hold_commands():
    assert len(COMMANDS) >= 15 and {doc for doc, _ in COMMANDS} >= {"README.md", "docs/benchmarking.md"}


@pytest.mark.parametrize("doc,command", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_command_runs_as_written(doc, command):
    argv = argv_of(command)
    if argv[0] == "make":
        done = subprocess.run(["make", "-n", "-C", str(ROOT), *argv[1:]], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{doc}: `{command}` does not dry-run:\n{done.stderr[-1500:]}"
        return
    args, text = options_help(argv)
    unknown = [
        a.split("=", 1)[0]
        for a in args
        if a.startswith("-") and not re.search(rf"(^|[\s,\[]){re.escape(a.split('=', 1)[0])}\b", text)
    ]
    assert not unknown, f"{doc}: `{command}` uses options its --help does not list: {unknown}"
    check_configs(args)
