"""The tree-attention kernel's launch settings side by side on a GPU: which tile sizes, warps and
pipelining depth :meth:`TreeAttentionPlan.build` should choose.

    python -m benchmarks.gpu.tile_sweep --out DIR     # ~1-2 min on one H100

For a few layer shapes of the GPU check (Llama-3.1-8B's 32/8 heads and a 70B-like 64/8, head
size 128, bf16, branching trees) every setting is run once against the dense float32 reference
(:func:`~vllm_lookahead.kernels.tree_attention.dense_reference`, the GPU check's bf16 tolerance)
and all are timed side by side with :func:`~benchmarks.gpu.fixtures.time_side_by_side`
(CUDA graphs, samples in turn), next to the plan's default and the kernel's causal mode (plain
causal attention of the same rows).  Writes
``tile_sweep.json`` and ``tile_sweep.md``.  Needs only torch, numpy and triton.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.exactness import TOLERANCE as EXACTNESS_TOLERANCE
from benchmarks.gpu.exactness import _compare
from benchmarks.gpu.fixtures import PagedLayers, md_table, time_side_by_side
from benchmarks.gpu.layer_time import LayerCase, LayerStep
from vllm_lookahead.kernels.tree_attention import dense_reference

SHAPES = (  # heads, kv heads, context, requests, draft rows (the most telling first: a budget cuts the last)
    (64, 8, 8192, 8, 64),
    (32, 8, 8192, 8, 64),
    (32, 8, 8192, 8, 16),
    (64, 8, 32768, 8, 32),
    (32, 8, 32768, 32, 64),
    (32, 8, 512, 32, 64),
    (32, 8, 2048, 1, 16),
)
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "every tile masked": {"mask_every_tile": True},
    "block_n 64": {"block_n": 64},
    "block_n 128": {"block_n": 128},
    "stages 2": {"num_stages": 2},
    "stages 4": {"num_stages": 4},
    "block_m 64": {"block_m": 64},
    "block_m 256, 8 warps": {"block_m": 256, "num_warps": 8},
    "block_m 256, 16 warps": {"block_m": 256, "num_warps": 16},
    "block_m 256, 16 warps, stages 4": {"block_m": 256, "num_warps": 16, "num_stages": 4},
    "block_m 256, 16 warps, block_n 128, stages 2": {"block_m": 256, "num_warps": 16, "block_n": 128, "num_stages": 2},
}
TOLERANCE = EXACTNESS_TOLERANCE[torch.bfloat16]  # scaled error |out - ref| / (1 + |ref|), as the GPU check


def reference(step: LayerStep) -> list[torch.Tensor]:
    c = step.case
    keys, values = [], []
    for r in range(c.requests):
        k, v = step.paged.read(0, r, c.context + step.tree.size)
        keys.append(k.transpose(0, 1))
        values.append(v.transpose(0, 1))
    return dense_reference(step.query, keys, values, step.rows, step.scale)


def measure_shape(shape: tuple[int, ...], device: torch.device) -> list[dict[str, Any]]:
    heads, kv_heads, ctx, reqs, drafts = shape
    case = LayerCase(heads, kv_heads, 128, ctx, reqs, drafts)
    paged = PagedLayers.allocate(1, reqs, ctx + drafts + 1, kv_heads, 128, torch.bfloat16, device)
    step = LayerStep.build(case, paged, torch.Generator(device).manual_seed(0))
    ref = reference(step)
    calls = {"causal (default settings)": step.kernel_call(causal=True)[0]}
    rows = {"causal (default settings)": {**asdict(case), "setting": "causal (default settings)", "scaled_err": None}}
    for name, options in SETTINGS.items():
        step.output.zero_()
        try:
            call, _, plan = step.kernel_call(causal=False, **options)
            call()
            err = _compare(step.output, step.rows, ref)["scaled_err"]
        except Exception as exc:  # noqa: BLE001 -- a setting that does not compile or launch is recorded
            rows[name] = {**asdict(case), "setting": name, "error": f"{type(exc).__name__}: {exc}"}
            continue
        calls[name] = call
        rows[name] = {
            **asdict(case),
            "setting": name,
            "scaled_err": err,
            "exact": err <= TOLERANCE,
            "block_m": plan.block_m,
            "block_n": plan.block_n,
            "num_warps": plan.num_warps,
            "num_stages": plan.num_stages,
            "splits": plan.num_splits,
        }
    for name, seconds in time_side_by_side(calls, device).items():
        rows[name]["seconds"] = seconds
    default = rows["default"]["seconds"]
    for r in rows.values():
        if "seconds" in r:
            r["over_default"] = r["seconds"] / default
    return list(rows.values())


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = ["# Tree-attention kernel settings side by side", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
    settings = ["causal (default settings)", *SETTINGS]
    table = []
    for shape in SHAPES:
        mine = {
            r["setting"]: r
            for r in data["rows"]
            if (r["heads"], r["kv_heads"], r["context"], r["requests"], r["draft_rows"]) == shape
        }
        if not mine:
            continue
        entry = {"shape": "{}/{} ctx {} x {} req, {} drafts".format(*shape)}
        for s in settings:
            r = mine.get(s, {})
            entry[s] = (
                "error"
                if "error" in r
                else "-"
                if "seconds" not in r
                else f"{r['seconds'] * 1e6:.0f}" + ("" if r.get("exact", True) else " INEXACT")
            )
        table.append(entry)
    columns = [("shape", lambda e: e["shape"])] + [(f"{s} us", lambda e, s=s: e[s]) for s in settings]
    bad = [r for r in data["rows"] if r.get("exact") is False or "error" in r]
    lines += [
        f"Every setting against the dense reference: {'all within' if not bad else f'{len(bad)} NOT within'} "
        f"the bf16 tolerance {TOLERANCE} (scaled error).",
        "",
    ]
    return "\n".join(lines + md_table(table, columns)) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.tile_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=150.0, help="shapes after this many seconds are left out")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the tile sweep needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    import triton

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "environment": {
            "gpu": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": "python -m benchmarks.gpu.tile_sweep",
        },
        "rows": [],
    }
    start = time.monotonic()
    for shape in SHAPES:
        if time.monotonic() - start > args.budget_s:
            data.setdefault("left_out", []).append(shape)
            continue
        data["rows"] += measure_shape(shape, device)
        torch.cuda.empty_cache()
        (out / "tile_sweep.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        (out / "tile_sweep.md").write_text(markdown(data))
        print(f"[{time.monotonic() - start:6.1f} s] {shape} done", flush=True)
    print((out / "tile_sweep.md").read_text())
    return 0 if all(r.get("exact", True) and "error" not in r for r in data["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
