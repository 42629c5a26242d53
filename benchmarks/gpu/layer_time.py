"""Part b of the GPU check: what one attention layer's tree rows cost, and KV compaction.

Each case is a step of ``requests`` tree requests, each with ``context`` tokens of context and the
same :func:`~benchmarks.gpu.fixtures.branching_tree` of ``draft_rows`` drafts, in one
bf16 layer cache (token-major blocks, random block table).  The rows timed are the ones the plugin
recomputes with the tree mask (from each tree's first branch on), by:

1. ``kernel``  -- :func:`~vllm_lookahead.kernels.tree_attention.tree_attention`, one launch;
   ``engine`` -- the same through the engine (:func:`~vllm_lookahead.engine.step.attention.fix_draft_rows`
   with the kernel: its glue per layer included, the plan built by the first call as the first
   layer of a step builds it);
2. ``torch``   -- the engine's torch pass (``fix_draft_rows`` with ``VLLM_LOOKAHEAD_TREE_KERNEL=torch``,
   its per-step index plan likewise built by the first call);
3. ``causal``  -- the same kernel with ``causal=True`` over the same rows and keys: plain causal
   attention, so ``kernel / causal`` is what the tree mask itself costs; ``m64+gathered`` -- the
   kernel with query tiles of at most 64 rows and the ancestor words gathered per key tile (the
   two choices :meth:`TreeAttentionPlan.build` makes otherwise), side by side; ``every tile masked``
   -- the kernel with bounds and score masks on every key tile, not only the context's last one;
   ``other tile`` -- where a request has more than 128 rows per KV head, the kernel with the other
   of the two wide query tiles (256 rows on 16 warps where the plan chose 128, 128 on 8 where it
   chose 256);
4. ``sdpa``    -- ``torch.nn.functional.scaled_dot_product_attention`` of the same rows over a
   contiguous copy of the same keys, no mask (the copy is not timed): an outside baseline.

The kernel's settings and SDPA are timed by
:func:`~benchmarks.gpu.fixtures.time_side_by_side` (CUDA graphs of 10 calls, their
samples taken in turn: device time, no host launch cost, so ``kernel / causal`` is what the mask
costs on the GPU even where a call is launch-bound); the engine's two paths, which run eagerly in
the engine, by :func:`~benchmarks.gpu.fixtures.time_per_call` medians (CUDA events over
back-to-back eager calls, the host's launch and glue included where they are longer).  The same
cache is read on every call, so a small case (a few MB of K/V) is served from the L2 cache -- an optimistic
figure next to a real forward, whose 32 layers
read 32 different caches.  The torch pass pads every request to the longest and materialises
``requests x kv_heads x (group x rows) x keys`` scores twice (scores, softmax): its bytes are
estimated first and the case is skipped (recorded) when they exceed half of the free memory.

Compaction: :func:`~vllm_lookahead.kernels.kv_compaction.move_slots` (one launch for every layer)
against the torch :func:`vllm_lookahead.engine.step.kv.move_slots` (a gather and a scatter per layer
and per K / V), 32 layers of 8 KV heads x 128, 5 moves per request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.gpu.fixtures import (
    PagedLayers,
    branching_tree,
    cell,
    count_launches,
    engine_call,
    engine_path,
    md_table,
    strided_query,
    time_host,
    time_per_call,
    time_side_by_side,
)
from vllm_lookahead.engine.step import kv
from vllm_lookahead.engine.step.tree_batch import TreeRequest
from vllm_lookahead.kernels import kv_compaction
from vllm_lookahead.kernels.tree_attention import CacheAddressing, TreeAttentionPlan, TreeRows, tree_attention

if TYPE_CHECKING:
    from benchmarks.gpu.record import Part, Settings

BLOCK_SIZE = 16
MEMORY_SHARE = 0.5  # the torch pass and the SDPA copy may use this share of the free device memory


@dataclass(frozen=True)
class LayerCase:
    heads: int
    kv_heads: int
    head_size: int
    context: int
    requests: int
    draft_rows: int


@dataclass(frozen=True)
class Grid:
    """The cases of part b: every combination, cheapest first (a time budget cuts the largest)."""

    shapes: tuple[tuple[int, int, int], ...]  # (query heads, KV heads, head size)
    contexts: tuple[int, ...]
    requests: tuple[int, ...]
    draft_rows: tuple[int, ...]
    compaction_layers: int
    compaction_shape: tuple[int, int]  # (KV heads, head size)

    @classmethod
    def of(cls, smoke: bool, quick: bool) -> Grid:
        if smoke:
            return cls(((4, 2, 32),), (32, 100), (1, 2), (4, 8), 4, (2, 16))
        if quick:
            return cls(((32, 8, 128), (64, 8, 128)), (512, 8192, 32768), (1, 32), (16, 64), 32, (8, 128))
        return cls(((32, 8, 128), (64, 8, 128)), (512, 2048, 8192, 32768), (1, 8, 32), (8, 16, 32, 64), 32, (8, 128))

    def groups(self) -> Iterator[tuple[int, int, list[LayerCase]]]:
        """(context, requests, cases sharing one cache), by cache size."""
        for ctx, reqs in sorted(((c, r) for c in self.contexts for r in self.requests), key=lambda cr: cr[0] * cr[1]):
            yield ctx, reqs, [LayerCase(h, hkv, d, ctx, reqs, n) for h, hkv, d in self.shapes for n in self.draft_rows]


@dataclass
class LayerStep:
    """One case's inputs: the tree requests over ``paged``'s layer 0 and their rows."""

    case: LayerCase
    paged: PagedLayers
    tree: Any
    rows: list[TreeRows]
    query: torch.Tensor  # [requests * tree size, heads, head_size]
    output: torch.Tensor

    @classmethod
    def build(cls, case: LayerCase, paged: PagedLayers, gen: torch.Generator) -> LayerStep:
        tree = branching_tree(case.draft_rows)
        n, first = tree.size, tree.first_branch_node
        rows = [TreeRows(r, r * n + first, first, n, case.context, tree.ancestor_mask()) for r in range(case.requests)]
        dev, dt = paged.buffer.device, paged.buffer.dtype
        query = strided_query(case.requests * n, case.heads, case.kv_heads, case.head_size, dt, dev, gen)
        return cls(case, paged, tree, rows, query, torch.empty_like(query, memory_format=torch.contiguous_format))

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.case.head_size)

    def kernel_call(self, causal: bool, **options: Any) -> tuple[Callable[[], None], float, TreeAttentionPlan]:
        """One layer's launch of the kernel (plan built outside it, with ``options`` of
        :meth:`TreeAttentionPlan.build`), the plan's host build seconds, and the plan."""
        c, cache = self.case, self.paged.caches[0]
        plan, build_s = time_host(
            lambda: TreeAttentionPlan.build(
                self.rows,
                self.paged.block_table,
                c.heads,
                c.kv_heads,
                c.head_size,
                causal=causal,
                **{"cache_dtype": cache.dtype, **options},
            ),
            cache.device,
        )
        addressing = CacheAddressing.of(cache)
        return (lambda: tree_attention(plan, self.query, cache, self.output, addressing, self.scale)), build_s, plan

    def engine_call(self) -> Callable[[], None]:
        """One layer of the engine's tree path over the same rows (a new step: its plan is built
        by the first call); which path, :func:`engine_path` decides."""
        c, n = self.case, self.tree.size
        requests = [
            TreeRequest(r, f"r{r}", self.tree, None, r * n, c.context, self.tree.logit_rows())
            for r in range(c.requests)
        ]
        return engine_call(self.paged, requests, c.heads, self.query, self.output.view(self.query.shape[0], -1))

    def sdpa_call(self) -> Callable[[], torch.Tensor]:
        """SDPA of the same rows over contiguous copies of each request's keys (query heads that
        share a KV head stacked as rows: no mask, so that is the same attention)."""
        c, n = self.case, self.tree.size
        q_rows = self.rows[0].num_nodes - self.rows[0].first_node
        group = c.heads // c.kv_heads
        q = self.query.view(c.requests, n, c.heads, c.head_size)[:, n - q_rows :]
        q = q.reshape(c.requests, q_rows, c.kv_heads, group, c.head_size).permute(0, 2, 3, 1, 4)
        q = q.reshape(c.requests, c.kv_heads, group * q_rows, c.head_size).contiguous()
        k = torch.empty(c.requests, c.kv_heads, c.context + n, c.head_size, dtype=q.dtype, device=q.device)
        v = torch.empty_like(k)
        for r in range(c.requests):
            k[r], v[r] = self.paged.read(0, r, c.context + n)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)

    def torch_pass_bytes(self) -> int:
        """Device bytes the torch pass allocates per layer: gathered K and V, scores and their
        softmax, the additive mask and its boolean source (all padded to the longest request)."""
        c = self.case
        q_rows = self.rows[0].num_nodes - self.rows[0].first_node
        keys = -(-(c.context + self.tree.size) // BLOCK_SIZE) * BLOCK_SIZE
        el = self.query.element_size()
        group_rows = c.requests * (c.heads // c.kv_heads) * q_rows * keys  # the mask, per query head group
        return (
            el
            * (2 * c.requests * c.kv_heads * keys * c.head_size + 2 * c.requests * c.heads * q_rows * keys + group_rows)
            + group_rows
        )

    def sdpa_bytes(self) -> int:
        c = self.case
        return 2 * c.requests * c.kv_heads * (c.context + self.tree.size) * c.head_size * self.query.element_size()


def free_bytes(device: torch.device) -> float:
    """Free device memory (CUDA), or no limit."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else float("inf")


def measure_case(
    step: LayerStep, device: torch.device, launches: dict[str, Any], timing: dict[str, int]
) -> dict[str, Any]:
    """Seconds per layer of the four ways (see the module docstring) for one case; ``launches``:
    filled with the kernel's and the torch pass's launch counts by the first case."""
    kernel, plan_s, plan = step.kernel_call(causal=False)
    side_by_side = {
        "kernel": kernel,
        "causal": step.kernel_call(causal=True)[0],
        "kernel_masked": step.kernel_call(causal=False, mask_every_tile=True)[0],
        "kernel_m64_gathered": step.kernel_call(causal=False, block_m=min(64, plan.block_m), gather_words=True)[0],
    }
    if plan.block_m in (128, 256) and plan.max_queries * plan.group > 128:  # the other of the two wide tiles
        other = 256 if plan.block_m == 128 else 128
        side_by_side["kernel_other_tile"] = step.kernel_call(causal=False, block_m=other)[0]
    row = {
        **asdict(step.case),
        "tree_size": step.tree.size,
        "computed_rows": sum(tr.num_nodes - tr.first_node for tr in step.rows),
        "plan_build_s": plan_s,
        "block_m": plan.block_m,
        "notes": [],
    }
    if step.sdpa_bytes() <= MEMORY_SHARE * free_bytes(device):
        side_by_side["sdpa"] = step.sdpa_call()
    else:
        row["notes"].append(f"sdpa skipped: its K/V copy needs {step.sdpa_bytes() / 2**30:.1f} GiB")
    row.update({f"{name}_s": seconds for name, seconds in time_side_by_side(side_by_side, device, **timing).items()})
    side_by_side.clear()  # the SDPA copy goes
    if not launches:
        launches.update(case=asdict(step.case), kernel=count_launches(kernel, device))
    need = step.torch_pass_bytes()
    for name, choice in (("engine", "triton"), ("torch", "torch")):
        if choice == "torch" and need > MEMORY_SHARE * free_bytes(device):
            row["notes"].append(f"torch pass skipped: needs ~{need / 2**30:.1f} GiB")
            continue
        with engine_path(choice):
            call = step.engine_call()
            _, row[f"{name}_first_call_s"] = time_host(call, device)  # builds the step's plan
            row[f"{name}_s"] = time_per_call(call, device, **timing)
            if name not in launches:
                launches[name] = count_launches(call, device)
    row["kernel_over_causal"] = row["kernel_s"] / row["causal_s"]
    row["m64_gathered_over_kernel"] = row["kernel_m64_gathered_s"] / row["kernel_s"]
    row["masked_over_kernel"] = row["kernel_masked_s"] / row["kernel_s"]
    if "kernel_other_tile_s" in row:
        row["other_tile_over_kernel"] = row["kernel_other_tile_s"] / row["kernel_s"]
    for name in ("engine", "torch", "sdpa"):
        if f"{name}_s" in row:
            row[f"{name}_over_kernel"] = row[f"{name}_s"] / row["kernel_s"]
    return row


def compaction_call(
    paged: PagedLayers, requests: int, context: int, moves: int, use_kernel: bool
) -> Callable[[], None]:
    """Moving each request's ``moves`` accepted nodes (positions ``context + moves + 1 ..``) down to
    ``context + 1 ..``, in every layer: the kernel's single launch or the torch loop."""
    device = paged.buffer.device
    depth = torch.arange(1, moves + 1, device=device)
    src = torch.cat([paged.slots(r, context + moves + depth) for r in range(requests)])
    dst = torch.cat([paged.slots(r, context + depth) for r in range(requests)])
    caches = paged.caches
    if use_kernel:
        offsets, addressing = kv_compaction.layer_offsets(caches), CacheAddressing.of(caches[0])
        return lambda: kv_compaction.move_slots(caches[0], offsets, addressing, src, dst)
    return lambda: kv.move_slots(caches, "FLASH_ATTN", src, dst)


def measure_compaction(
    grid: Grid, requests: int, dtype: torch.dtype, device: torch.device, timing: dict[str, int]
) -> dict[str, Any]:
    """Seconds per step of both compactions for ``requests`` requests x 5 moves."""
    context, moves = 200, 5
    hkv, d = grid.compaction_shape
    paged = PagedLayers.allocate(grid.compaction_layers, requests, context + 2 * moves + 1, hkv, d, dtype, device)
    kernel = compaction_call(paged, requests, context, moves, True)
    torch_loop = compaction_call(paged, requests, context, moves, False)
    row = {
        "layers": grid.compaction_layers,
        "kv_heads": hkv,
        "head_size": d,
        "requests": requests,
        "moves": requests * moves,
        "kernel_s": time_per_call(kernel, device, **timing),
        "torch_s": time_per_call(torch_loop, device, **timing),
        "kernel_launches": count_launches(kernel, device),
        "torch_launches": count_launches(torch_loop, device),
    }
    row["torch_over_kernel"] = row["torch_s"] / row["kernel_s"]
    return row


def run(settings: Settings, part: Part) -> None:
    """Part b's attention cases, one cache per (context, requests) shared by its cases."""
    grid, device = Grid.of(settings.smoke, settings.quick), settings.device
    gen = torch.Generator(device).manual_seed(0)
    launches: dict[str, Any] = part.data.setdefault("launches", {})
    longest = max(grid.draft_rows) + 1
    for ctx, reqs, cases in grid.groups():
        caches: dict[tuple[int, int], PagedLayers] = {}

        def step_of(case: LayerCase, caches=caches, reqs=reqs, ctx=ctx) -> LayerStep:
            key = (case.kv_heads, case.head_size)
            if key not in caches:
                caches.clear()
                caches[key] = PagedLayers.allocate(1, reqs, ctx + longest, *key, settings.model_dtype, device)
            return LayerStep.build(case, caches[key], gen)

        for case in cases:
            part.record(
                "layer",
                asdict(case),
                lambda case=case: measure_case(step_of(case), device, launches, settings.timing),
                _brief_layer,
            )
        caches.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def run_compaction(settings: Settings, part: Part) -> None:
    """Part b's compaction cases: 1 / 8 / 32 requests (the grid's request counts) x 5 moves."""
    grid = Grid.of(settings.smoke, settings.quick)
    for reqs in grid.requests:
        part.record(
            "compaction",
            {"requests": reqs},
            lambda reqs=reqs: measure_compaction(grid, reqs, settings.model_dtype, settings.device, settings.timing),
            lambda r: (
                f"compaction {r['requests']} requests x 5 moves x {r['layers']} layers: kernel "
                f"{r['kernel_s'] * 1e6:.1f} us, torch {r['torch_s'] * 1e6:.1f} us"
            ),
        )


def _brief_layer(r: dict[str, Any]) -> str:
    us = {
        k: f"{r[k + '_s'] * 1e6:.1f}" if k + "_s" in r else "-" for k in ("kernel", "engine", "causal", "sdpa", "torch")
    }
    return (
        f"layer {r['heads']}/{r['kv_heads']} ctx {r['context']} x {r['requests']} req, {r['draft_rows']} drafts: "
        + ", ".join(f"{k} {v} us" for k, v in us.items())
    )


def markdown(data: dict[str, Any]) -> list[str]:
    """Part b's attention table and launch counts."""

    def us(key: str) -> Callable[[dict], str]:
        return lambda r: cell(r, key, 1e6, 4)

    columns = [
        ("heads", lambda r: f"{r['heads']}/{r['kv_heads']}"),
        ("context", lambda r: str(r["context"])),
        ("requests", lambda r: str(r["requests"])),
        ("drafts", lambda r: str(r["draft_rows"])),
        ("rows computed", lambda r: str(r["computed_rows"])),
        ("kernel us", us("kernel_s")),
        ("engine (kernel) us", us("engine_s")),
        ("causal us", us("causal_s")),
        ("SDPA us", us("sdpa_s")),
        ("torch pass us", us("torch_s")),
        ("kernel/causal", lambda r: cell(r, "kernel_over_causal")),
        ("every tile masked/kernel", lambda r: cell(r, "masked_over_kernel")),
        ("m64+gathered/kernel", lambda r: cell(r, "m64_gathered_over_kernel")),
        ("tile rows", lambda r: cell(r, "block_m")),
        ("other tile (128 / 256 rows)/kernel", lambda r: cell(r, "other_tile_over_kernel")),
        ("torch/kernel", lambda r: cell(r, "torch_over_kernel")),
        ("SDPA/kernel", lambda r: cell(r, "sdpa_over_kernel")),
        ("plan build us", us("plan_build_s")),
        ("notes", lambda r: "; ".join(r.get("notes", []))),
    ]
    launches = data.get("launches", {})
    counted = (
        "device operations per layer, counted with torch.profiler on the first case: kernel "
        f"{launches.get('kernel')}, engine with the kernel {launches.get('engine')}, torch pass "
        f"{launches.get('torch')}"
        if launches.get("kernel") is not None
        else "launches per layer (not counted off CUDA): kernel 1 (one Triton launch, splits combined in it)"
    )
    rows = data.get("tables", {}).get("layer", [])
    return ["### Tree rows of one attention layer", "", counted, ""] + md_table(rows, columns)


def markdown_compaction(data: dict[str, Any]) -> list[str]:
    """Part b's compaction table."""
    columns = [
        ("layers", lambda r: str(r["layers"])),
        ("KV heads x head", lambda r: f"{r['kv_heads']}x{r['head_size']}"),
        ("requests", lambda r: str(r["requests"])),
        ("moves", lambda r: str(r["moves"])),
        ("kernel us", lambda r: cell(r, "kernel_s", 1e6, 4)),
        ("torch us", lambda r: cell(r, "torch_s", 1e6, 4)),
        ("torch/kernel", lambda r: cell(r, "torch_over_kernel")),
        ("launches kernel / torch", lambda r: f"{cell(r, 'kernel_launches')} / {cell(r, 'torch_launches')}"),
    ]
    rows = data.get("tables", {}).get("compaction", [])
    return ["### KV compaction of one step, every layer", ""] + md_table(rows, columns)
