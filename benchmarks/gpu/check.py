"""The GPU check: the plugin's GPU code paths where vLLM is not installed, in a few minutes.

    python -m benchmarks.gpu.check --out DIR            # on a GPU, every part (~5 min)
    python -m benchmarks.gpu.check --out DIR --quick    # smaller sweeps
    python -m benchmarks.gpu.check --out DIR --parts exactness forward
    python -m benchmarks.gpu.check --out DIR --cpu-smoke  # tiny shapes, Triton's interpreter

Parts (each bounded by its share of ``--budget-s``; a case past its part's time is recorded as
skipped, never silently dropped):

* ``exactness`` (:mod:`.gpu_exactness`) -- the Triton tree-attention kernel against the dense
  float32 reference and the Triton KV compaction against the torch one, at real shapes and
  dtypes; the process exits 1 if any case fails or raises;
* ``layer`` (:mod:`.gpu_layer_time`) -- one attention layer's tree rows: the kernel, the engine's
  torch pass, the kernel's causal mode on the same rows, SDPA; ``compaction`` -- both compactions;
* ``forward`` (:mod:`.gpu_forward`) -- a Llama-3.1-8B-shaped decoder's forward by tokens per
  request and batch, written as ``cost_b<B>.json`` (``StepCost``) for ``bench --replay
  --replay-cost`` and ``bench --project --project-cost``; ``batches`` -- the same at the batches
  vLLM serves on a GPU (128, 256 and 1,024 requests, 512 tokens of context);
* ``sampling`` (:mod:`.gpu_sampling`) -- verifying random requests: the coupled walks against
  vLLM's own sampling step.

Writes ``gpu_check.json`` and ``gpu_check.md`` to ``--out`` after every case (a run cut short
keeps what it measured) with the GPU as ``torch.cuda.get_device_name()`` reports it, the
torch / Triton / CUDA versions, the date (UTC) and the command line.

It imports torch, numpy, triton and the engine-free modules of the package only (the kernels,
``engine.kv``, ``engine.tree_batch``, ``engine.attention``, ``core``): the GPU machine has no
vLLM and no pydantic.  Without CUDA (or with ``--cpu-smoke``) the same code runs tiny shapes on
the CPU under Triton's interpreter, whose timings mean nothing (labelled so); the interpreter
must be chosen before the kernels are defined, so the part modules are imported only once the
device is known (and a process that defined them for a GPU first is started again).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.record import Part, Results, Settings, log

PARTS = ("exactness", "layer", "compaction", "forward", "sampling", "batches")
BUDGET_SHARES = {
    "exactness": 0.18,
    "layer": 0.38,
    "compaction": 0.05,
    "forward": 0.3,
    "sampling": 0.09,
    "batches": 0.2,
}
KERNEL_MODULES = {
    "vllm_lookahead.kernels.tree_attention": "_tree_attention_kernel",
    "vllm_lookahead.kernels.kv_compaction": "_move_slots_kernel",
    "vllm_lookahead.kernels.exponential_noise": "_exponential_rows_kernel",
}
COMMAND = "benchmarks.gpu.check"


def use_interpreter(argv: list[str]) -> None:
    """Run the Triton kernels under the interpreter: set ``TRITON_INTERPRET=1`` before they are
    defined, or start this command again if this process defined them for a GPU already."""
    os.environ["TRITON_INTERPRET"] = "1"
    for name, kernel in KERNEL_MODULES.items():
        module = sys.modules.get(name)
        if module is not None and type(getattr(module, kernel)).__name__ != "InterpretedFunction":
            log("the kernels were defined for a GPU in this process: starting again under the interpreter")
            os.execve(sys.executable, [sys.executable, "-m", COMMAND, *argv], dict(os.environ))


def environment(settings: Settings, argv: list[str]) -> dict[str, Any]:
    import triton

    env = {
        "gpu": settings.device_name,
        "device": str(settings.device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date_utc": settings.date_utc,
        "command": shlex.join(["python", "-m", COMMAND, *argv]),
    }
    if settings.device.type == "cuda":
        props = torch.cuda.get_device_properties(settings.device)
        env.update(gpu_memory_gib=round(props.total_memory / 2**30, 1), sms=props.multi_processor_count)
    else:
        env["timings"] = (
            "meaningless: CPU run under Triton's interpreter with tiny shapes (a smoke test of the code paths)"
        )
    return env


def part_modules() -> tuple[dict[str, tuple[Callable, Callable]], Callable[[dict], list[str]]]:
    """Each part's ``run(settings, part)`` and ``markdown(part data)``, and the judge of the
    exactness part's record (imported now: after the interpreter choice, since they define the
    kernels)."""
    from benchmarks.gpu import (
        exactness as gpu_exactness,
    )
    from benchmarks.gpu import (
        forward as gpu_forward,
    )
    from benchmarks.gpu import (
        layer_time as gpu_layer_time,
    )
    from benchmarks.gpu import (
        sampling as gpu_sampling,
    )

    return {
        "exactness": (gpu_exactness.run, gpu_exactness.markdown),
        "layer": (gpu_layer_time.run, gpu_layer_time.markdown),
        "compaction": (gpu_layer_time.run_compaction, gpu_layer_time.markdown_compaction),
        "forward": (gpu_forward.run, gpu_forward.markdown),
        "sampling": (gpu_sampling.run, gpu_sampling.markdown),
        "batches": (gpu_forward.run_batches, gpu_forward.markdown),
    }, gpu_exactness.failures


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {COMMAND}", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (gpu_check.json, gpu_check.md, cost_b<B>.json)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run (default: all)")
    p.add_argument("--quick", action="store_true", help="smaller sweeps")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes on the CPU under Triton's interpreter (the default without CUDA)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="seconds for all parts together, shared as "
        + ", ".join(f"{k} {round(100 * v)}%%" for k, v in BUDGET_SHARES.items())
        + " (default: %(default)s)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for; 1 if an exactness case failed or raised, else 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    if smoke:
        use_interpreter(argv)
    device = torch.device("cpu") if smoke else torch.device("cuda", torch.cuda.current_device())
    name = "none: CPU under Triton's interpreter" if smoke else torch.cuda.get_device_name(device)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    settings = Settings(device, smoke, args.quick, Path(args.out), name, date)
    modules, judge = part_modules()
    results = Results(settings.out_dir, environment(settings, argv), {k: m[1] for k, m in modules.items()}, judge)
    log(f"gpu check on {name} (torch {torch.__version__}): parts {' '.join(args.parts)}")
    shares = sum(BUDGET_SHARES[p] for p in args.parts)
    for part_name in [p for p in PARTS if p in args.parts]:
        part = Part(results, part_name, args.budget_s * BUDGET_SHARES[part_name] / shares)
        modules[part_name][0](settings, part)
        part.finish()
    failed = results.data["failures"] or []
    log(
        f"written to {settings.out_dir}: gpu_check.json, gpu_check.md"
        + "".join(f", {f.name}" for f in sorted(settings.out_dir.glob("cost_b*.json")))
        + (f"; {len(failed)} exactness failure(s)" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
