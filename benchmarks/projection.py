"""GPU projection of measured draft shapes -- a model, not a measurement (``bench --project``).

No GPU ran for this project.  This module turns what *was* measured -- per
configuration and workload, MAT (tokens per target forward) and draft tokens per
step -- into the tokens/s ratio over no speculation that a GPU serving a 7B model
in bf16 at batch 1 would see, under a roofline cost model of one forward:

    t(T) = max(bytes of weights / (eta_mem * HBM bandwidth),  2 * params * T / (eta_mfu * peak FLOPs))
           + t_step + (t_tree if the draft branches)

``T`` = tokens in the forward (1 + draft tokens).  Weight streaming dominates
until the knee where the GEMMs become compute-bound (~96 tokens on an A100 at
eta_mfu 0.5, ~184 on an H100).  Calibration: with eta_mem = 0.8 and eta_mfu = 0.5
the A100 curve is flat to 64 tokens and 1.17x at 112, against the Medusa paper's
simulated A100 7B curve (flat to 64, ~1.1x at 80-96, ~1.2x at 112; Cai et al.,
2024, arXiv:2401.10774, Fig. 7).  ``t_step`` is what a step costs besides the
weights (launches, sampling, bookkeeping); ``t_tree`` what a branching tree adds:
this plugin's eager per-layer tree-attention launch on CUDA (the Triton kernel of
:mod:`vllm_lookahead.kernels.tree_attention`, one launch per layer outside CUDA graphs;
its memory traffic is not in the roofline -- ``--project-cost`` prices it as measured).
vLLM's DDTree PR
measured a tree at 99 tok/s against a chain at 145 under CUDA graphs on an RTX
A6000 -- overheads decide, so the table gives the tree both with and without it.

The projected speedup is ``MAT * t(1) / t(1 + draft)``: the measured acceptance of
the bundled 135M model, which repeats itself much more than a 7B chat model (its
MAT 2-7 at 512 tokens against the lookahead paper's ~1.5-2x speedups on A100 with
7B models), so the figures say how draft shapes rank on a GPU, not what a 7B model
would gain.

``bench --project --project-cost FILE...`` prices the same rows with forward costs measured on a
GPU instead (:func:`project_measured`: the ``cost_b<B>.json`` files of ``python -m
benchmarks.gpu.check``, a Llama-3.1-8B-shaped decoder timed per tokens and batch).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_lookahead.core.step_cost import StepCost


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_per_s: float
    bf16_flops: float  # dense peak
    eta_mem: float = 0.8
    eta_mfu: float = 0.5
    step_overhead_s: float = 0.6e-3  # launches, sampling, scheduler at batch 1 under CUDA graphs
    launch_s: float = 8e-6  # one eager kernel launch


# Datasheet peaks: A100 SXM 80GB 2.039 TB/s, 312 TFLOP/s bf16 dense; H100 SXM 3.35 TB/s, 989 TFLOP/s.
A100 = Gpu("A100-SXM-80GB", 2.039e12, 312e12)
H100 = Gpu("H100-SXM", 3.35e12, 989e12)


@dataclass(frozen=True)
class Model:
    name: str
    params: float
    layers: int
    bytes_per_param: int = 2  # bf16


LLAMA_7B = Model("7B (LLaMA-2-7B shape), bf16", 6.74e9, 32)
# The Triton tree-attention kernel on CUDA: one launch per layer, splits combined in it (the torch
# pass it replaced was 8).  (The GPU backends' kernels still attend the draft rows first: their work
# is not counted.)
TREE_LAUNCHES_PER_LAYER = 1


def forward_seconds(gpu: Gpu, model: Model, tokens: int, branching: bool = False, tree_pass: bool = True) -> float:
    """Modelled time of one target forward over ``tokens`` query tokens at batch 1."""
    memory = model.params * model.bytes_per_param / (gpu.eta_mem * gpu.hbm_bytes_per_s)
    compute = 2.0 * model.params * tokens / (gpu.eta_mfu * gpu.bf16_flops)
    t = max(memory, compute) + gpu.step_overhead_s
    if branching and tree_pass:
        t += model.layers * TREE_LAUNCHES_PER_LAYER * gpu.launch_s
    return t


def projected_speedup(
    gpu: Gpu, model: Model, mat: float, draft_tokens: float, branching: bool, tree_pass: bool = True
) -> float:
    """Tokens/s over no speculation: ``mat`` tokens per forward of ``1 + draft_tokens`` tokens."""
    base = forward_seconds(gpu, model, 1)
    return mat * base / forward_seconds(gpu, model, round(1 + draft_tokens), branching, tree_pass)


def knee_tokens(gpu: Gpu, model: Model) -> float:
    """Tokens per forward where the GEMMs turn compute-bound."""
    memory = model.params * model.bytes_per_param / (gpu.eta_mem * gpu.hbm_bytes_per_s)
    return memory * gpu.eta_mfu * gpu.bf16_flops / (2.0 * model.params)


def _speculative_rows(results_json: Path) -> list[tuple[Any, bool]]:
    """The batch-1 greedy rows of speculative methods in a ``results.json``, each with whether the
    method's drafts branch."""
    from benchmarks.report import build_rows

    raw: dict[str, Any] = json.loads(Path(results_json).read_text())
    branching_of = {m["method"]: _branching(m.get("speculative_config")) for m in raw["methods"]}
    return [
        (r, branching_of.get(r.method, False))
        for r in build_rows(raw)
        if r.concurrency == 1 and r.temperature == 0 and r.draft_per_step > 0
    ]


def _row_start(r: Any, branching: bool) -> str:
    return f"| {r.method} | {r.workload} | {r.mat:.2f} | {r.draft_per_step:.1f} | {'yes' if branching else 'chain'} | "


def project(results_json: Path, gpus: tuple[Gpu, ...] = (A100, H100), model: Model = LLAMA_7B) -> str:
    """Markdown: measured MAT and draft size per speculative method and batch-1 workload of a
    ``results.json``, and the projected speedup on each GPU (tree with and without the eager pass)."""
    head = " | ".join(f"{g.name}" + (" (no tree pass)" if i else "") for g in gpus for i in (0, 1))
    lines = [
        f"Projection, not a measurement: {model.name} at batch 1, roofline knee "
        + ", ".join(f"{g.name} {knee_tokens(g, model):.0f} tokens" for g in gpus)
        + "; MAT and draft tokens measured on this CPU with the bundled model.",
        "",
        f"| method | workload | MAT | draft/step | tree | {head} |",
        "|---|---|---|---|---|" + "---|" * (2 * len(gpus)),
    ]
    for r, branching in _speculative_rows(results_json):
        cells = []
        for g in gpus:
            for tree_pass in (True, False):
                cells.append(f"{projected_speedup(g, model, r.mat, r.draft_per_step, branching, tree_pass):.2f}x")
        lines.append(_row_start(r, branching) + " | ".join(cells) + " |")
    return "\n".join(lines)


def measured_speedup(cost: StepCost, mat: float, draft_tokens: float, branching: bool) -> float:
    """Tokens/s over no speculation under a measured cost: ``mat`` tokens per forward of
    ``1 + draft_tokens`` tokens, every draft row priced as a tree row when the drafts branch (the
    tree pass recomputes the rows after a tree's leading chain: an upper bound)."""
    tokens = round(1 + draft_tokens)
    return mat * cost.forward(1) / cost.forward(tokens, tokens - 1 if branching else 0)


def project_measured(results_json: Path, cost_files: Sequence[Path]) -> str:
    """Markdown: like :func:`project`, with forward costs measured on a GPU instead of the
    roofline -- one column per ``cost_b<B>.json`` of ``python -m benchmarks.gpu.check``
    (or any ``StepCost`` JSON), each the cost of forwards of ``B`` requests drafting alike."""
    from vllm_lookahead.core.step_cost import StepCost

    raws = [json.loads(Path(path).read_text()) for path in cost_files]
    costs = [StepCost.from_dict(raw) for raw in raws]
    gpus = [raw.get("gpu", Path(path).stem) for raw, path in zip(raws, cost_files)]
    labels = [f"{gpu}, batch {raw['batch']}" if "batch" in raw else gpu for gpu, raw in zip(gpus, raws)]
    models = "; ".join(dict.fromkeys(raw.get("model", "model not named") for raw in raws))
    lines = [
        f"Measured forward cost on {', '.join(dict.fromkeys(gpus))} ({models}), acceptance measured "
        "on the 135M model on CPU: MAT and draft tokens per step of this CPU's batch-1 runs, priced by the "
        "GPU's forward time at 1 and 1 + draft tokens per request (branching drafts: every draft row priced "
        "as a tree row).",
        "",
        "| method | workload | MAT | draft/step | tree | " + " | ".join(labels) + " |",
        "|---|---|---|---|---|" + "---|" * len(labels),
    ]
    for r, branching in _speculative_rows(results_json):
        cells = [f"{measured_speedup(c, r.mat, r.draft_per_step, branching):.2f}x" for c in costs]
        lines.append(_row_start(r, branching) + " | ".join(cells) + " |")
    return "\n".join(lines)


def step_cost(gpu: Gpu, model: Model = LLAMA_7B, up_to: int = 1024) -> StepCost:
    """This roofline as the draft rule's cost model (``bench --replay --replay-cost a100``): what
    the rule would choose on that GPU -- a model, no GPU ran."""
    from vllm_lookahead.core.step_cost import StepCost

    sizes = [1 << k for k in range(up_to.bit_length()) if 1 << k <= up_to]
    return StepCost(
        tuple(sizes),
        tuple(forward_seconds(gpu, model, n) for n in sizes),
        tree_step_seconds=model.layers * TREE_LAUNCHES_PER_LAYER * gpu.launch_s,
    )


def _branching(spec: dict | None) -> bool:
    """Whether a method's drafts branch.  The cost rule ("auto") chose chains on this CPU; its
    GPU choices are the replay's (``step_cost``), not this table's."""
    if not spec or spec.get("method") != "lookahead":
        return False
    from benchmarks.methods import lookahead_config
    from vllm_lookahead.config import DraftMode

    cfg = lookahead_config(spec)
    if cfg.mode is DraftMode.AUTO:
        return False
    return cfg.window_size > 0 or cfg.guess_set_size > 1
