"""Part c of the GPU check: what a forward of a Llama-3.1-8B-shaped decoder costs, by tokens per
request and batch, written as :class:`~vllm_lookahead.core.step_cost.StepCost` files.

The decoder (:class:`RandomDecoder`) has Llama-3.1-8B's shapes -- hidden 4096, 32 layers, 32 query
/ 8 KV heads of 128, SwiGLU MLP of 14336, vocabulary 128256, RMSNorm, rotate-half RoPE -- and
random bf16 weights (N(0, 1) x 0.02, made on the device: nothing is downloaded).  A forward of
``B`` requests with ``T`` tokens each (the root and ``T - 1`` drafts, at ``context`` tokens of
context) embeds the tokens, and per layer: fused QKV projection, RoPE at each node's position
(context + depth), the step's K/V written into a paged cache by slot (one ``index_put``, as the
backends' cache update), attention of every row by the Triton kernel over the paged context and
the tree (:func:`~vllm_lookahead.kernels.tree_attention.tree_attention`), output projection, MLP;
then the logits of every row.  Three attention modes:

* ``chain``  -- a chain tree, one causal launch per layer (what vLLM's own causal kernel does);
* ``tree``   -- a :func:`~benchmarks.gpu.fixtures.branching_tree`, as the plugin runs it
  on a GPU: the causal launch over every row (vLLM's kernel), then the tree launch over the rows
  from the first branch on (their tree-masked result written over);
* ``tree_one_pass`` -- the same tree, one launch with the tree mask over every row
  (``TreeRows(first_node=0)``): what a backend with tree masks would spend.

Each forward shape is captured once in a CUDA graph (the plans are built before capture and the
kernel's split counters reset themselves) and replayed; eager where capture fails (recorded) or
off CUDA.  Seconds per forward are medians of replays between CUDA events.  ``cost_b<B>.json``
holds, per batch ``B``, the chain forwards by ``T`` and ``tree_row_seconds`` = (tree - chain
forward of the same T) summed over the measured tree sizes / the tree rows they recomputed (the
rows after each tree's leading chain, x B: the unit of ``StepCost.forward``'s ``tree_rows``),
floored at 0 -- readable by ``bench --replay --replay-cost FILE`` and ``bench --project
--project-cost FILE...``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from benchmarks.gpu.fixtures import (
    PagedLayers,
    branching_tree,
    cell,
    chain_tree,
    md_table,
    time_per_call,
)
from vllm_lookahead.core.step_cost import StepCost
from vllm_lookahead.kernels.tree_attention import CacheAddressing, TreeAttentionPlan, TreeRows, tree_attention

if TYPE_CHECKING:
    from benchmarks.gpu.record import Part, Settings

MODES = ("chain", "tree", "tree_one_pass")


@dataclass(frozen=True)
class DecoderShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_size: int
    mlp: int
    vocab: int


LLAMA_8B = DecoderShape("Llama-3.1-8B shape, random bf16 weights", 4096, 32, 32, 8, 128, 14336, 128256)
TINY = DecoderShape("tiny decoder (CPU smoke run)", 64, 2, 4, 2, 16, 128, 256)


@dataclass(frozen=True)
class Sweep:
    """Forward sizes measured: tokens per request ``T`` (chains), ``T`` of the tree modes, batches."""

    tokens: tuple[int, ...]
    tree_tokens: tuple[int, ...]
    batches: tuple[int, ...]
    context: int

    @classmethod
    def of(cls, smoke: bool, quick: bool) -> Sweep:
        if smoke:
            return cls((1, 2, 4, 8), (4, 8), (1, 2), 32)
        if quick:
            return cls((1, 4, 16, 64), (16, 64), (1, 16), 1024)
        return cls((1, 2, 4, 8, 12, 16, 24, 32, 48, 64), (8, 16, 32, 64), (1, 4, 16, 32), 1024)

    @classmethod
    def serving(cls, smoke: bool, quick: bool) -> Sweep:
        """Part ``batches``: the batches vLLM's GPU defaults allow in flight (``max_num_seqs``
        1,024 on an H100), at 512 tokens of context (1,024 requests' paged cache then takes
        ~70 GB), a few tokens per request."""
        if smoke:
            return cls((1,), (4,), (3,), 32)
        if quick:
            return cls((1, 4), (8,), (128, 1024), 512)
        return cls((1, 2, 4, 8), (8,), (128, 256, 1024), 512)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``[tokens, heads, head_size]``; ``cos``/``sin`` ``[tokens, 1, head_size / 2]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@dataclass
class Step:
    """One forward's device inputs, built before capture: tokens, RoPE positions, cache slots
    (as block and offset) and the attention plans every layer launches, in order."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    blocks: torch.Tensor
    offsets: torch.Tensor
    plans: list[TreeAttentionPlan]
    tree_rows: int  # rows recomputed with the tree mask (after each tree's leading chain), all requests


class RandomDecoder:
    """A decoder of ``shape`` with random weights and a paged KV cache for ``max_batch`` requests
    of ``context + max_tokens`` positions (random context)."""

    def __init__(
        self,
        shape: DecoderShape,
        dtype: torch.dtype,
        device: torch.device,
        max_batch: int,
        context: int,
        max_tokens: int,
    ) -> None:
        self.shape, self.context = shape, context
        gen = torch.Generator(device).manual_seed(0)

        def weight(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=gen, dtype=dtype, device=device).mul_(0.02)

        s = shape
        qkv = (s.heads + 2 * s.kv_heads) * s.head_size
        self.embed, self.lm_head = weight(s.vocab, s.hidden), weight(s.hidden, s.vocab)
        self.final_norm = torch.ones(s.hidden, dtype=dtype, device=device)
        self.layers = [
            dict(
                attn_norm=self.final_norm.clone(),
                qkv=weight(s.hidden, qkv),
                o=weight(s.heads * s.head_size, s.hidden),
                mlp_norm=self.final_norm.clone(),
                gate_up=weight(s.hidden, 2 * s.mlp),
                down=weight(s.mlp, s.hidden),
            )
            for _ in range(s.layers)
        ]
        self.paged = PagedLayers.allocate(
            s.layers, max_batch, context + max_tokens, s.kv_heads, s.head_size, dtype, device
        )
        self.addressing = CacheAddressing.of(self.paged.caches[0])
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, s.head_size, 2, device=device).float() / s.head_size))
        angles = torch.outer(torch.arange(context + max_tokens, device=device).float(), inv_freq)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def step(self, batch: int, tokens: int, mode: str) -> Step:
        """The inputs of a forward of ``batch`` requests x ``tokens`` tokens in attention ``mode``."""
        tree = chain_tree(tokens) if mode == "chain" else branching_tree(tokens - 1)
        first, ctx, dev = tree.first_branch_node, self.context, self.paged.buffer.device
        anc = tree.ancestor_mask()
        every = [TreeRows(b, b * tokens, 0, tokens, ctx, anc) for b in range(batch)]
        s, table = self.shape, self.paged.block_table
        dt = self.paged.buffer.dtype
        plans = [
            TreeAttentionPlan.build(
                every, table, s.heads, s.kv_heads, s.head_size, causal=mode != "tree_one_pass", cache_dtype=dt
            )
        ]
        if mode == "tree" and first < tokens:
            cut = [TreeRows(b, b * tokens + first, first, tokens, ctx, anc) for b in range(batch)]
            plans.append(TreeAttentionPlan.build(cut, table, s.heads, s.kv_heads, s.head_size, cache_dtype=dt))
        slots = torch.cat([self.paged.slots(b, ctx + torch.arange(tokens, device=dev)) for b in range(batch)])
        depths = torch.from_numpy(tree.depths.astype("int64")).to(dev)
        gen = torch.Generator(dev).manual_seed(tokens)
        ids = torch.randint(0, s.vocab, (batch * tokens,), generator=gen, device=dev)
        return Step(
            ids,
            (ctx + depths).repeat(batch),
            slots // self.paged.block_size,
            slots % self.paged.block_size,
            plans,
            0 if mode == "chain" else batch * (tokens - first),
        )

    def forward(self, step: Step) -> torch.Tensor:
        """Logits of every row of ``step``."""
        h = self.embed.index_select(0, step.token_ids)
        cos, sin = self.cos[step.positions].unsqueeze(1), self.sin[step.positions].unsqueeze(1)
        for i, w in enumerate(self.layers):
            h = self._layer(i, w, h, cos, sin, step)
        return rms_norm(h, self.final_norm) @ self.lm_head

    def _layer(
        self, i: int, w: dict[str, torch.Tensor], h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step: Step
    ) -> torch.Tensor:
        s, n = self.shape, h.shape[0]
        q, k, v = (rms_norm(h, w["attn_norm"]) @ w["qkv"]).split(
            [s.heads * s.head_size, s.kv_heads * s.head_size, s.kv_heads * s.head_size], dim=-1
        )
        q = rope(q.view(n, s.heads, s.head_size), cos, sin)
        k = rope(k.view(n, s.kv_heads, s.head_size), cos, sin)
        cache = self.paged.caches[i]
        cache[step.blocks, :, step.offsets] = torch.cat((k, v.view(n, s.kv_heads, s.head_size)), dim=-1)
        out = torch.empty_like(q)
        for plan in step.plans:
            tree_attention(plan, q, cache, out, self.addressing, 1 / math.sqrt(s.head_size))
        h = h + out.view(n, -1) @ w["o"]
        gate, up = (rms_norm(h, w["mlp_norm"]) @ w["gate_up"]).chunk(2, dim=-1)
        return h + (F.silu(gate) * up) @ w["down"]


def graph_call(fn: Callable[[], Any], device: torch.device) -> tuple[Callable[[], Any], str]:
    """``fn`` captured in a CUDA graph (its replay), after two warm-up calls on a side stream (Triton
    compiles there, not under capture); ``fn`` itself where capture is impossible or fails."""
    if device.type != "cuda":
        return fn, "eager (no CUDA)"
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, "cuda graph"
    except Exception as exc:  # noqa: BLE001 -- recorded; timed eagerly instead
        torch.cuda.synchronize(device)
        return fn, f"eager: capture failed ({type(exc).__name__}: {str(exc)[:200]})"


def measure_forward(
    decoder: RandomDecoder, batch: int, tokens: int, mode: str, device: torch.device, timing: dict[str, int]
) -> dict[str, Any]:
    """Seconds per forward of ``batch`` x ``tokens`` in ``mode`` (graph replays or eager calls;
    ``timing`` overrides 3 samples of 3 calls after 1 warm-up call)."""
    step = decoder.step(batch, tokens, mode)
    call, how = graph_call(lambda: decoder.forward(step), device)
    seconds = time_per_call(call, device, **{"calls": 3, "samples": 3, "warmup": 1, **timing})
    return {
        "batch": batch,
        "tokens": tokens,
        "mode": mode,
        "seconds": seconds,
        "tree_rows": step.tree_rows,
        "launches_per_layer": len(step.plans),
        "run": how,
    }


def step_cost(rows: list[dict[str, Any]], batch: int) -> tuple[StepCost, dict[str, Any]] | None:
    """The batch's chain forwards and measured tree-row price as a :class:`StepCost` (None before any
    chain forward of the batch was measured), and how the price was worked out."""
    mine = [r for r in rows if r["batch"] == batch]
    chain = {r["tokens"]: r["seconds"] for r in mine if r["mode"] == "chain"}
    if not chain:
        return None
    pairs = [
        (r["seconds"] - chain[r["tokens"]], r["tree_rows"])
        for r in mine
        if r["mode"] == "tree" and r["tokens"] in chain and r["tree_rows"]
    ]
    extra, tree_rows = sum(e for e, _ in pairs), sum(n for _, n in pairs)
    price = max(0.0, extra / tree_rows) if tree_rows else 0.0
    cost = StepCost(tuple(sorted(chain)), tuple(chain[t] for t in sorted(chain)), tree_row_prior=price)
    return cost, {"tree_extra_seconds": extra, "tree_rows_measured": tree_rows}


def write_cost_file(out_dir: Path, rows: list[dict[str, Any]], batch: int, meta: dict[str, Any]) -> Path | None:
    """``cost_b<batch>.json``: ``StepCost.to_dict()`` plus where it was measured (extra keys,
    ignored by ``StepCost.from_dict``)."""
    made = step_cost(rows, batch)
    if made is None:
        return None
    path = out_dir / f"cost_b{batch}.json"
    path.write_text(json.dumps({**made[0].to_dict(), **meta, "batch": batch, **made[1]}, indent=1) + "\n")
    return path


def run(settings: Settings, part: Part) -> None:
    """Part c: batches in ascending order, each its chain sweep then its trees, then its cost file."""
    run_sweep(settings, part, Sweep.of(settings.smoke, settings.quick))


def run_batches(settings: Settings, part: Part) -> None:
    """Part ``batches``: part c at serving batch sizes (:meth:`Sweep.serving`), the context cut
    to what the GPU's free memory holds beside the weights (the smaller GPU's 80 GB)."""
    sweep = Sweep.serving(settings.smoke, settings.quick)
    if settings.device.type == "cuda":
        s = LLAMA_8B
        per_token = s.layers * 2 * s.kv_heads * s.head_size * 2  # bf16 K and V, every layer
        room = torch.cuda.mem_get_info(settings.device)[0] - 28 * 2**30  # weights, activations, graphs
        fits = room // per_token // max(sweep.batches) - max(sweep.tokens + sweep.tree_tokens)
        sweep = replace(sweep, context=max(64, min(sweep.context, fits // 64 * 64)))
    run_sweep(settings, part, sweep)


def run_sweep(settings: Settings, part: Part, sweep: Sweep) -> None:
    """Batches in ascending order, each its chain sweep then its trees, then its cost file."""
    shape = TINY if settings.smoke else LLAMA_8B
    made: dict[str, RandomDecoder] = {}
    built = part.record(
        "decoder",
        {"model": shape.name},
        lambda: _build(settings, shape, sweep, made),
        lambda r: f"decoder built: {r['params'] / 1e9:.3g} B parameters in {r['build_s']:.1f} s",
    )
    if built is None:
        return
    decoder = made.pop("decoder")
    meta = {
        "gpu": settings.device_name,
        "model": shape.name,
        "context": sweep.context,
        "source": "python -m benchmarks.gpu.check",
        "date_utc": settings.date_utc,
    }
    part.data["cost_files"] = {}
    for batch in sweep.batches:
        todo = [(t, "chain") for t in sweep.tokens] + [(t, m) for t in sweep.tree_tokens for m in MODES[1:]]
        for tokens, mode in todo:
            part.record(
                "forward",
                {"batch": batch, "tokens": tokens, "mode": mode},
                lambda b=batch, t=tokens, m=mode, d=decoder: measure_forward(
                    d, b, t, m, settings.device, settings.timing
                ),
                lambda r: (
                    f"forward B={r['batch']} T={r['tokens']} {r['mode']}: {r['seconds'] * 1e3:.2f} ms ({r['run']})"
                ),
            )
        path = write_cost_file(settings.out_dir, part.table("forward"), batch, meta)
        if path is not None:
            part.data["cost_files"][str(batch)] = {"path": path.name, **json.loads(path.read_text())}
    del decoder  # its weights and cache freed before the next part
    if settings.device.type == "cuda":
        torch.cuda.empty_cache()


def _build(settings: Settings, shape: DecoderShape, sweep: Sweep, made: dict[str, RandomDecoder]) -> dict[str, Any]:
    """The decoder (into ``made``) and what describes it."""
    start = time.perf_counter()
    decoder = made["decoder"] = RandomDecoder(
        shape,
        settings.model_dtype,
        settings.device,
        max(sweep.batches),
        sweep.context,
        max(sweep.tokens + sweep.tree_tokens),
    )
    params = sum(w.numel() for layer in decoder.layers for w in layer.values())
    params += decoder.embed.numel() + decoder.lm_head.numel()
    return {
        "model": shape.name,
        "params": params,
        "layers": shape.layers,
        "dtype": str(settings.model_dtype).removeprefix("torch."),
        "build_s": time.perf_counter() - start,
    }


def markdown(data: dict[str, Any]) -> list[str]:
    """Part c's table per batch (ms per forward by tokens per request and mode) and its cost file."""
    rows = data.get("tables", {}).get("forward", [])
    lines = ["### Forward of the decoder, ms per forward", ""]
    decoder = data.get("tables", {}).get("decoder", [])
    if decoder:
        d = decoder[0]
        lines += [
            f"{d['model']}: {d['params'] / 1e9:.2f} B parameters, {d['layers']} layers, {d['dtype']}; "
            "every row's logits; attention by the Triton kernel over a paged cache.",
            "",
        ]
    for batch in sorted({r["batch"] for r in rows}):
        mine = {(r["tokens"], r["mode"]): r for r in rows if r["batch"] == batch}
        tokens = sorted({t for t, _ in mine})
        table = [
            {
                "tokens": t,
                **{m: mine[(t, m)]["seconds"] for m in MODES if (t, m) in mine},
                "tree_rows": mine.get((t, "tree"), {}).get("tree_rows"),
                "run": ", ".join(sorted({mine[(t, m)]["run"] for m in MODES if (t, m) in mine})),
            }
            for t in tokens
        ]
        columns = [("T per request", lambda r: str(r["tokens"]))]
        columns += [(f"{m} ms", lambda r, m=m: cell(r, m, 1e3, 4)) for m in MODES]
        columns += [("tree rows", lambda r: cell(r, "tree_rows")), ("run", lambda r: r["run"])]
        cost = data.get("cost_files", {}).get(str(batch))
        lines += (
            [
                f"Batch {batch}"
                + (f" -> {cost['path']}, tree_row_seconds {cost['tree_row_seconds'] * 1e6:.2f} us" if cost else "")
                + ":",
                "",
            ]
            + md_table(table, columns)
            + [""]
        )
    return lines
