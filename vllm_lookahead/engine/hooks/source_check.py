"""The patch table and the vLLM functions the plugin calls, checked against a vLLM release's
source without importing it.

    python -m vllm_lookahead.engine.hooks.source_check vllm-0.33.0-....whl   # or an unpacked tree
    python -m vllm_lookahead.engine.hooks.source_check --download 0.33.0    # pip download --no-deps first

A vLLM release the plugin has not run on (no CPU build of it, or no GPU here) can still be read:
for every :data:`~vllm_lookahead.engine.hooks.patches.PATCHES` and
:data:`~vllm_lookahead.engine.hooks.patches.ATTENTION_PATCHES` target, the module must define the
owner and the function with exactly the parameter names the patch was written for (the check
:func:`~vllm_lookahead.engine.hooks.patching.check_signature` makes at start-up, done ahead of it);
for every :data:`~vllm_lookahead.engine.hooks.patches.FIELDS` entry, the class must be a dataclass
that does not declare the field itself;
for every function in :data:`CALLS` -- vLLM functions the plugin calls with arguments it chose
-- the call the plugin makes must still bind (enough positional parameters, the keywords
exist, no new required parameter).  The source is parsed with :mod:`ast`; a name a module
imports from elsewhere (``from x import f``) is followed to where it is defined.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Reader = Callable[[str], "str | None"]  # repository path (vllm/x/y.py) -> source, or None


@dataclass(frozen=True)
class Call:
    """A vLLM function the plugin calls: ``target`` as in a patch, with ``positional`` arguments
    and these ``keywords``."""

    target: str
    positional: int
    keywords: tuple[str, ...] = ()
    where: str = ""  # the plugin module that calls it


CALLS: tuple[Call, ...] = (
    Call("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p", 3, (), "engine/step/target_dist.py"),
    Call("vllm.v1.sample.ops.topk_topp_sampler:empty_exponential_noise_like", 2, (), "engine/step/sampler_noise.py"),
    Call("vllm.v1.sample.ops.topk_topp_sampler:sample_with_exponential_noise", 2, (), "engine/step/sampler_noise.py"),
    Call("vllm.v1.sample.ops.bad_words:_apply_bad_words_single_batch", 3, (), "engine/step/target_dist.py"),
    Call("vllm.v1.sample.ops.penalties:apply_all_penalties", 6, (), "engine/step/target_dist.py"),
    Call(
        "vllm._custom_ops:cpu_attn_get_scheduler_metadata",
        0,
        (
            "num_reqs",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "seq_lens",
            "dtype",
            "query_start_loc",
            "causal",
            "sliding_window_size",
            "isa",
            "enable_kv_split",
            "dynamic_causal",
            "kv_cache_dtype",
        ),
        "engine/step/attention.py",
    ),
    Call("vllm.v1.sample.sampler:Sampler.gather_logprobs", 3, (), "engine/step/verification.py"),  # a staticmethod
)


def wheel_reader(wheel: Path) -> Reader:
    names = zipfile.ZipFile(wheel)

    def read(path: str) -> str | None:
        try:
            return names.read(path).decode()
        except KeyError:
            return None

    return read


def tree_reader(root: Path) -> Reader:
    """Sources under ``root`` (the folder that holds the ``vllm`` package)."""

    def read(path: str) -> str | None:
        file = root / path
        return file.read_text() if file.is_file() else None

    return read


def _module_source(read: Reader, module: str) -> tuple[str, str] | None:
    base = module.replace(".", "/")
    for path in (f"{base}.py", f"{base}/__init__.py"):
        text = read(path)
        if text is not None:
            return path, text
    return None


def _resolve_import(node: ast.ImportFrom, module: str, path: str) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def find_function(read: Reader, target: str) -> ast.FunctionDef | ast.AsyncFunctionDef | str:
    """The definition of ``target`` ("module:name" or "module:Owner.name"), or why it is missing."""
    node = find_definition(read, target)
    if isinstance(node, str) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node
    return f"{target} is not a function"


def field_problem(read: Reader, target: str) -> str | None:
    """Why the field ``target`` ("module:Class.field") cannot be declared on the class, or None:
    the class must be a dataclass that does not declare the field itself."""
    owner, _, name = target.rpartition(".")
    cls = find_definition(read, owner)
    if isinstance(cls, str):
        return cls
    if not isinstance(cls, ast.ClassDef) or not any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
        return f"{owner} is not a dataclass"
    if any(isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name for n in cls.body):
        return f"{owner} declares {name} itself"
    return None


def find_definition(read: Reader, target: str, depth: int = 0) -> ast.AST | str:
    """The function or class ``target`` names, or why it is missing."""
    module, _, qualname = target.partition(":")
    found = _module_source(read, module)
    if found is None:
        return f"module {module} not in the source"
    path, text = found
    first, *rest = qualname.split(".")
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == first:
            return _member(node, rest, target)
        if isinstance(node, ast.ImportFrom) and depth < 5:
            for alias in node.names:
                if (alias.asname or alias.name) == first:
                    origin = _resolve_import(node, module, path)
                    return find_definition(read, f"{origin}:{'.'.join([alias.name, *rest])}", depth + 1)
    return f"{module} defines no {first}"


def _member(node: ast.AST, rest: list[str], target: str):
    for name in rest:
        if not isinstance(node, ast.ClassDef):
            return f"{target}: {getattr(node, 'name', '?')} is not a class"
        node = next(
            (
                n
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
            ),
            None,
        )
        if node is None:
            return f"{target}: no {name} in its class"
    return node


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """Parameter names in ``inspect.signature`` order."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return tuple(names)


def call_problem(fn: ast.FunctionDef | ast.AsyncFunctionDef, call: Call) -> str | None:
    """Why ``call`` would not bind to ``fn``, or None."""
    a = fn.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    if call.positional > len(positional) and a.vararg is None:
        return f"takes {len(positional)} positional parameters, the plugin passes {call.positional}"
    by_keyword = set(positional[len(a.posonlyargs) :]) | {p.arg for p in a.kwonlyargs}
    unknown = [k for k in call.keywords if k not in by_keyword and a.kwarg is None]
    if unknown:
        return f"has no parameter {', '.join(unknown)}"
    given = set(positional[: call.positional]) | set(call.keywords)
    required = positional[: len(positional) - len(a.defaults)]
    required += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    missing = [p for p in required if p not in given]
    return f"needs {', '.join(missing)}, which the plugin does not pass" if missing else None


def check(read: Reader) -> list[str]:
    """Every problem the patch table and :data:`CALLS` meet in the source ``read`` serves."""
    from vllm_lookahead.engine.hooks.patches import ATTENTION_PATCHES, FIELDS, PATCHES

    problems = []
    for patch in (*PATCHES, *ATTENTION_PATCHES.values()):
        fn = find_function(read, patch.target)
        if isinstance(fn, str):
            problems.append(f"patch {patch.target}: {fn}")
        elif parameters(fn) != patch.params:
            problems.append(
                f"patch {patch.target}: takes ({', '.join(parameters(fn))}), the patch was written for "
                f"({', '.join(patch.params)})"
            )
    for added in FIELDS:
        problem = field_problem(read, added.target)
        if problem:
            problems.append(f"field {added.target}: {problem}")
    for call in CALLS:
        fn = find_function(read, call.target)
        problem = fn if isinstance(fn, str) else call_problem(fn, call)
        if problem:
            problems.append(f"call {call.target} ({call.where}): {problem}")
    return problems


def download(version: str, into: Path) -> Path:
    """vLLM ``version``'s wheel (no dependencies) from the package index, into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    wheels = sorted(into.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
                "-d",
                str(into),
                f"vllm=={version}",
            ],
            check=True,
            timeout=900,
        )
        wheels = sorted(into.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip downloaded no wheel of vllm {version}")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vllm_lookahead.engine.hooks.source_check", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("source", nargs="?", help="a vLLM wheel, or a folder holding the vllm package")
    p.add_argument(
        "--download", metavar="VERSION", help="pip download vLLM VERSION's wheel (no dependencies) and check it"
    )
    args = p.parse_args(argv)
    if args.download:
        source = download(args.download, Path(tempfile.gettempdir()) / "vllm-lookahead-wheels")
    elif args.source:
        source = Path(args.source)
    else:
        p.error("give a wheel or folder, or --download VERSION")
    read = wheel_reader(source) if source.suffix == ".whl" else tree_reader(source)
    problems = check(read)
    for line in problems:
        print(line)
    print(f"{source}: {'no problems' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
