"""``python -m benchmarks.host_work``: the plugin's host work per decode step, without a model.

    python -m benchmarks.host_work --out docs/bench/DATE-host-work

Replays recorded greedy streams (:mod:`.streams`) through lookahead's worker-side path exactly as
the engine runs it (:mod:`.lookahead_replay`) and through vLLM's ``ngram`` and ``suffix``
proposers (:mod:`.anchors`), at each batch size and context length: host time per step and per
request, p50 and p99, split by phase.  Writes ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks.engine_env import run_as_engines
from benchmarks.host_work.anchors import ANCHORS, AnchorReplay, missing
from benchmarks.host_work.lookahead_replay import PHASES, LookaheadReplay, StepTimes
from benchmarks.host_work.served import MAX_NUM_BATCHED_TOKENS
from benchmarks.host_work.streams import RECORDING, recorded_streams, with_context

BATCH_SIZES = (1, 8, 32, 128, 256, 1024)
CONTEXTS = (0, 8192)
TEMPERATURES = (0.0, 0.7)


@contextmanager
def engine_heap() -> Iterator[None]:
    """The garbage collector as a vLLM engine runs its steps: everything allocated before serving
    (imports, the recording, the replay's set-up) frozen out of its scans, as vLLM's engine core
    does at start-up (``vllm.utils.gc_utils.freeze_gc_heap``); what the steps allocate is scanned
    as it would be in the engine."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _stats(values: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


def _lookahead_cell(
    args: argparse.Namespace, served: list, batch: int, temperature: float, cost: object, max_model_len: int
) -> dict:
    replay = LookaheadReplay(
        served,
        batch,
        json.loads(args.config),
        cost,
        max_model_len,
        args.max_num_batched_tokens,
        temperature,
        device_time=args.device_time,
    )
    times = StepTimes()
    with engine_heap():
        for _ in range(args.warmup):
            replay.step(None)
        for _ in range(args.steps):
            replay.step(times)
    total = times.totals()
    stall = {"stall_s": _stats(times.stall)} if times.stall else {}
    return stall | {
        "step_s": _stats(total),
        "request_s": _stats(total / np.maximum(1, times.decoding)),
        "phases_s": {p: _stats(times.seconds[p]) for p in PHASES},
        "collector_s": _stats(times.collector),
        "draft_tokens_per_step": float(np.mean(times.draft_tokens)),
        "tokens_per_request_step": sum(times.emitted) / max(1, sum(times.decoding)),
    }


def _anchor_cells(
    args: argparse.Namespace, served: list, batch: int, max_model_len: int, cell: dict, cost: object
) -> None:
    for name in args.anchors:
        if missing(name):
            continue
        forward = cost if args.device_time else None
        anchor = AnchorReplay(name, served, batch, max_model_len, args.max_num_batched_tokens, forward)
        seconds: list[float] = []
        drafted = emitted = 0
        with engine_heap():
            for _ in range(args.warmup):
                anchor.step(None)
            for _ in range(args.steps):
                d, e = anchor.step(seconds)
                drafted, emitted = drafted + d, emitted + e
        cell[name] = {
            "step_s": _stats(seconds),
            "request_s": _stats(np.asarray(seconds) / batch),
            "draft_tokens_per_step": drafted / args.steps,
            "tokens_per_request_step": emitted / max(1, args.steps * batch),
        }


def run(args: argparse.Namespace) -> dict:
    from benchmarks.replay import replay_cost
    from benchmarks.suite import environment

    env = environment()
    streams = recorded_streams(args.recording)
    cost = replay_cost(args.cost)
    cells = []
    for context in args.contexts:
        served = with_context(streams, context)
        max_model_len = max(len(s.prompt) + len(s.output) for s in served) + 8
        for batch in args.batch_sizes:
            for temperature in args.temperatures:
                cell = {"context": context, "batch": batch, "temperature": temperature}
                cell["lookahead"] = _lookahead_cell(args, served, batch, temperature, cost, max_model_len)
                if temperature == 0:  # vLLM's proposers: the same host work whatever the temperature
                    _anchor_cells(args, served, batch, max_model_len, cell, cost)
                print(_line(cell), flush=True)
                cells.append(cell)
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{env.get('cpu', env['machine'])}, {_cores()} cores",
        "allocator": args.allocator,
        "environment": env,
        "command": "python -m benchmarks.host_work " + " ".join(args.argv),
        "recording": str(args.recording),
        "cost": args.cost,
        "config": json.loads(args.config),
        "steps": args.steps,
        "device_time": args.device_time,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "skipped": {name: missing(name) for name in args.anchors if missing(name)},
        "cells": cells,
    }


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3f}"


def _line(cell: dict) -> str:
    la = cell["lookahead"]
    where = f"context {cell['context']:>5} batch {cell['batch']:>4} T={cell.get('temperature', 0):g}"
    parts = [
        f"{where}: lookahead {_ms(la['step_s']['p50'])} ms/step p50 "
        f"({_ms(la['step_s']['p99'])} p99, GC {_ms(la['collector_s']['mean'])} mean), "
        f"{1e6 * la['request_s']['p50']:.1f} us/request"
    ]
    if "stall_s" in la:
        parts.append(f"stall {_ms(la['stall_s']['p50'])} p50 / {_ms(la['stall_s']['p99'])} p99")
    for name in ANCHORS:
        if name in cell:
            parts.append(f"{name} {_ms(cell[name]['step_s']['p50'])} ms/step")
    return "; ".join(parts)


def _spread(stats: dict[str, float]) -> str:
    return " / ".join(_ms(stats[k]) for k in ("mean", "p50", "p99"))


def markdown(result: dict) -> str:
    anchors = [a for a in ANCHORS if any(a in c for c in result["cells"])]
    stalls = result.get("device_time", False)
    lines = [
        f"# Host work per decode step ({result['date']})",
        "",
        f"Machine: {result['machine']}; {result.get('allocator', 'glibc malloc, its default thresholds')}.  "
        f"Command: `{result['command']}`.  "
        f"Streams: greedy completions of `{Path(result['recording']).parent.name}` (T > 0: sampled from a "
        "model peaked at them, `benchmarks/host_work/sampled_model.py`); "
        f"draft rule priced with the `{result['cost']}` forward; {result['steps']} measured steps per cell; "
        f"new prompts computed in chunks of a {result.get('max_num_batched_tokens', '-')}-token step budget.",
        "",
        "Lookahead: everything between two forwards that no speculation does not do, in ms per step "
        "(mean / p50 / p99) and us per decoding request (p50); then the p50 of each phase.  "
        + (
            ", ".join(f"`{a}`" for a in anchors) + ": vLLM's proposer, ms per step (mean / p50 / p99)."
            if anchors
            else ""
        )
        + "  The garbage collector runs as in a vLLM engine: the heap before serving frozen; "
        "`of which GC`: its collections within the step's phases, ms per step (mean / p50 / p99).  "
        "vLLM's proposers are run greedy only: their host work does not depend on the temperature."
        + (
            "  `--device-time`: every step sleeps through its forward as the cost model prices it; "
            "`stall`: how long past it the engine thread resumed, ms (mean / p50 / p99)."
            if stalls
            else ""
        ),
        "",
        "| "
        + " | ".join(
            [
                "context",
                "batch",
                "T",
                "lookahead ms/step",
                "of which GC",
                "us/request",
                *PHASES,
                "draft tokens/step",
                "tokens/request-step",
                *(f"{a} ms/step" for a in anchors),
                *(["stall"] if stalls else []),
            ]
        )
        + " |",
        "|" + "---|" * (8 + len(PHASES) + len(anchors) + stalls),
    ]
    for c in result["cells"]:
        la = c["lookahead"]
        row = [
            str(c["context"]),
            str(c["batch"]),
            f"{c.get('temperature', 0):g}",
            _spread(la["step_s"]),
            _spread(la["collector_s"]) if "collector_s" in la else "-",
            f"{1e6 * la['request_s']['p50']:.1f}",
            *(_ms(la["phases_s"][p]["p50"]) for p in PHASES),
            f"{la['draft_tokens_per_step']:.1f}",
            f"{la['tokens_per_request_step']:.2f}",
            *(_spread(c[a]["step_s"]) if a in c else "-" for a in anchors),
            *([_spread(la["stall_s"]) if "stall_s" in la else "-"] if stalls else []),
        ]
        lines.append("| " + " | ".join(row) + " |")
    for name, why in result["skipped"].items():
        lines += ["", f"`{name}` not run: {why}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.host_work", description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    p.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS), help="history tokens before each prompt")
    p.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=list(TEMPERATURES),
        help="0: greedy (the recording's tokens); > 0: sampled from a model peaked at them",
    )
    p.add_argument("--steps", type=int, default=200, help="measured steps per cell")
    p.add_argument("--warmup", type=int, default=50, help="steps before measuring (the batch fills, pools warm)")
    p.add_argument("--anchors", nargs="*", default=list(ANCHORS), choices=ANCHORS)
    p.add_argument("--config", default="{}", help="lookahead's --speculative-config keys (JSON)")
    p.add_argument("--cost", default="h100", help="the draft rule's forward: h100, a100 (rooflines), cpu, or a file")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=MAX_NUM_BATCHED_TOKENS,
        help="tokens per step: new prompts are computed in chunks within it (vLLM's default on an H100)",
    )
    p.add_argument(
        "--device-time",
        action="store_true",
        help="each step sleeps through its forward as --cost prices it (the host cold after it, as on a "
        "GPU server; new requests' states built meanwhile); reports the engine thread's stall past it",
    )
    p.add_argument("--recording", type=Path, default=RECORDING)
    p.add_argument(
        "--inherit-malloc",
        action="store_true",
        help="keep this process's malloc settings (else the engines' fixed thresholds, benchmarks/engine_env.py)",
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.argv = argv
    args.allocator = run_as_engines("benchmarks.host_work", argv, args.inherit_malloc)
    t0 = time.perf_counter()
    result = run(args)
    result["wall_s"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(result))
    print(f"wrote {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
