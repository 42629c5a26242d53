"""Part a of the GPU check: the Triton kernels against their references, at real shapes.

**Tree attention** (:func:`~vllm_lookahead.kernels.tree_attention.tree_attention`): each case is
one step of several tree requests (a plain decode request holds block-table row 0, so table rows
and batch rows differ) over a paged cache in one of vLLM's physical orders, with a random block
table, queries strided as a QKV split hands them over, and K/V drawn N(0, 1) (queries too).  The
kernel's rows are compared with :func:`~vllm_lookahead.kernels.tree_attention.dense_reference`,
computed in float32 from the K/V as written (already rounded to the case's dtype) -- so the error
is the kernel's arithmetic, not the cache's rounding.  Rows the plan does not cover must stay
untouched.  Row sets: ``branch`` (from each tree's first branch on: what the plugin recomputes),
``all`` (every row, ``TreeRows(first_node=0)``: what a forward with tree attention throughout
computes), ``causal`` (every row, ``causal=True``: the baseline of part b).  On the ``branch``
cases the engine's own path (:func:`~vllm_lookahead.engine.step.attention.fix_draft_rows`) runs too:
with the Triton kernel (``engine_err``, held to the same tolerance: the glue that builds the plan
from the step's tree batch) and as the torch pass (``torch_pass_err``, for information: it
computes the softmax in the cache's dtype).

Criterion, for every computed value: ``|out - ref| <= tol * (1 + |ref|)`` with ``tol`` = ``2e-2``
(bf16), ``4e-3`` (fp16), ``1e-4`` (fp32); recorded as ``scaled_err`` = max ``|out - ref| / (1 +
|ref|)``, next to the plain ``max_abs_err``.  bf16 keeps 8 significant bits (unit roundoff 2^-9 ~
2e-3): rounding the output costs up to 2^-9 x |out|, and the kernel also rounds the probabilities
to bf16 before the P.V product (up to 2^-9 x sum p |v|).  A row that sees one or two keys returns
about one value itself -- up to ~4.5 for N(0, 1) draws over the ~10^5 values of a case -- so the
bound grows with |ref| (the output's own rounding) and keeps an absolute floor for values near
zero.  2e-2 is ~10x bf16's unit roundoff (margin for accumulation order and exp2); fp16 has 3 more
bits (2e-2 / 8 = 2.5e-3, taken as 4e-3); fp32 runs IEEE dots (1e-4).
How much a wrong tree mask would move a row is recorded as ``mask_effect`` (the reference with
the causal mask against the tree mask): over a long context a mask error is diluted, which is
why the cases mix contexts of 1 and 500 with 3000 (the longest exercises paging and splits).

**KV compaction** (:func:`~vllm_lookahead.kernels.kv_compaction.move_slots`): the accepted paths
of random trees moved in every layer of one buffer, compared bit for bit over the whole buffer
with the torch :func:`vllm_lookahead.engine.step.kv.move_slots`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks.gpu.fixtures import (
    PagedLayers,
    cell,
    engine_call,
    engine_path,
    make_tree,
    md_table,
    random_tree,
    strided_query,
)
from vllm_lookahead.engine.step import kv
from vllm_lookahead.engine.step.tree_batch import TreeRequest
from vllm_lookahead.kernels import kv_compaction
from vllm_lookahead.kernels.tree_attention import (
    CacheAddressing,
    TreeAttentionPlan,
    TreeRows,
    dense_reference,
    tree_attention,
)

if TYPE_CHECKING:
    from benchmarks.gpu.record import Part, Settings

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
SENTINEL = 7.0  # rows a plan does not cover keep this value
BLOCK_SIZE = 16


@dataclass(frozen=True)
class AttentionCase:
    """One step of tree requests; ``requests``: (context length, tree spec of :func:`make_tree`)."""

    heads: int
    kv_heads: int
    head_size: int
    dtype: torch.dtype
    requests: tuple[tuple[int, str], ...]
    rows: str = "branch"  # branch | all | causal (see the module docstring)
    num_splits: int | None = None  # None: the plan's own choice
    layout: str = "LBNHC"

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["dtype"] = DTYPE_NAMES[self.dtype]
        d["requests"] = [f"{ctx}:{tree}" for ctx, tree in self.requests]
        return d


@dataclass(frozen=True)
class CompactionCase:
    layers: int
    kv_heads: int
    head_size: int
    dtype: torch.dtype
    requests: int
    layout: str


def attention_cases(smoke: bool, quick: bool, dtypes: tuple[torch.dtype, ...]) -> list[AttentionCase]:
    """The cases of part a: on a GPU 32/8 and 64/8 heads, head sizes 64/128/256, contexts 1, 500
    and 3000; tiny shapes for the CPU smoke run.  Every shape and dtype runs with one split and with
    several forced (the plan's own choice, several splits on a GPU, runs on the ``all`` rows)."""
    if smoke:
        reqs = ((1, "lookahead"), (40, "random8"), (100, "branching8"), (20, "chain3"))
        base, extra = (4, 2, 16), [(4, 1, 32)]
    else:
        reqs = ((1, "lookahead"), (500, "random12"), (3000, "branching64"), (500, "chain5"))
        base, extra = (32, 8, 128), [(64, 8, 128), (32, 8, 64), (32, 8, 256)]
    forced = 3 if smoke else 4
    cases = []
    for dt in dtypes:
        variants = [("branch", 1), ("branch", forced), ("all", None), ("causal", forced)]
        if dt is not dtypes[0] or quick:
            variants = variants[:2]
        cases += [
            AttentionCase(*base, dt, reqs, rows, splits, "LBNHC" if i % 2 else "LBHNC")
            for i, (rows, splits) in enumerate(variants)
        ]
    for shape in extra[:1] if quick else extra:
        cases += [AttentionCase(*shape, dtypes[0], reqs, "branch", splits, "BLNHC") for splits in (1, forced)]
    return cases


def compaction_cases(smoke: bool, dtypes: tuple[torch.dtype, ...]) -> list[CompactionCase]:
    """Accepted paths of 8 requests (some 30 moves: more than one chunk of the kernel) in every layer."""
    if smoke:
        return [CompactionCase(3, 2, 16, dtypes[0], 8, "BLNHC"), CompactionCase(2, 2, 32, dtypes[-1], 3, "LBHNC")]
    return [CompactionCase(32, 8, 128, dt, 8, layout) for dt, layout in zip(dtypes, ("LBNHC", "BLNHC", "LBHNC"))]


def _tree_rows(case: AttentionCase, trees: list, starts: list[int]) -> tuple[list[int], list[TreeRows]]:
    """The plan's requests and their indices in the case (table row ``r + 1``: row 0 is the
    plain request); ``branch`` leaves chains out (they need no tree pass)."""
    picked, rows = [], []
    for r, ((ctx, _), tree, start) in enumerate(zip(case.requests, trees, starts)):
        first = tree.first_branch_node if case.rows == "branch" else 0
        if first < tree.size:
            picked.append(r)
            rows.append(TreeRows(r + 1, start + first, first, tree.size, ctx, tree.ancestor_mask()))
    return picked, rows


def _step(case: AttentionCase, device: torch.device, seed: int):
    """The case's cache, trees, token starts, queries and the K/V of every request as written."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device).manual_seed(seed)
    trees = [make_tree(spec, rng) for _, spec in case.requests]
    longest = max(ctx + t.size for (ctx, _), t in zip(case.requests, trees))
    paged = PagedLayers.allocate(
        1, len(trees) + 1, longest, case.kv_heads, case.head_size, case.dtype, device, case.layout, BLOCK_SIZE, seed
    )
    keys, values, starts = [], [], []
    start = 1  # row 0: the plain decode request
    for r, ((ctx, _), tree) in enumerate(zip(case.requests, trees)):
        length = ctx + tree.size
        k = torch.randn(length, case.kv_heads, case.head_size, generator=gen, device=device).to(case.dtype)
        v = torch.randn(length, case.kv_heads, case.head_size, generator=gen, device=device).to(case.dtype)
        paged.write(0, paged.slots(r + 1, torch.arange(length, device=device)), k, v)
        keys.append(k)
        values.append(v)
        starts.append(start)
        start += tree.size
    query = strided_query(start, case.heads, case.kv_heads, case.head_size, case.dtype, device, gen)
    return paged, trees, starts, query, keys, values


def _compare(out: torch.Tensor, rows: list[TreeRows], ref: list[torch.Tensor]) -> dict[str, Any]:
    """Max abs and scaled error (``|out - ref| / (1 + |ref|)``) of the plan's rows (a NaN counts as
    infinite), and whether every other row kept the sentinel."""
    abs_err, scaled, covered = 0.0, 0.0, torch.zeros(out.shape[0], dtype=torch.bool, device=out.device)
    for tr, expected in zip(rows, ref):
        n = tr.num_nodes - tr.first_node
        diff = (out[tr.first_row : tr.first_row + n].float() - expected).abs().nan_to_num(nan=float("inf"))
        abs_err = max(abs_err, float(diff.max()))
        scaled = max(scaled, float((diff / (1 + expected.abs())).max()))
        covered[tr.first_row : tr.first_row + n] = True
    untouched = bool((out[~covered] == SENTINEL).all())
    return {"max_abs_err": abs_err, "scaled_err": scaled, "untouched_rows_kept": untouched}


def _engine_errors(case, paged, trees, starts, query, out_rows, ref) -> dict[str, float]:
    """Scaled error of the engine's path on the same ``branch`` rows, with the kernel
    (``engine_err``) and as the torch pass (``torch_pass_err``)."""
    requests = [
        TreeRequest(r + 1, f"r{r}", tree, None, start, ctx, tree.logit_rows())
        for r, ((ctx, _), tree, start) in enumerate(zip(case.requests, trees, starts))
    ]
    tokens, errors = query.shape[0], {}
    for name, choice in (("engine_err", "triton"), ("torch_pass_err", "torch")):
        output = torch.full((tokens, case.heads * case.head_size), SENTINEL, dtype=case.dtype, device=query.device)
        with engine_path(choice):
            engine_call(paged, requests, case.heads, query, output)()
        errors[name] = _compare(output.view(tokens, case.heads, case.head_size), out_rows, ref)["scaled_err"]
    return errors


def run_attention_case(case: AttentionCase, device: torch.device, seed: int) -> dict[str, Any]:
    """One case: the kernel's rows against the dense reference, on ``branch`` rows the engine's
    paths too (see the module docstring)."""
    paged, trees, starts, query, keys, values = _step(case, device, seed)
    picked, rows = _tree_rows(case, trees, starts)
    scale = 1 / math.sqrt(case.head_size)
    causal = case.rows == "causal"
    plan = TreeAttentionPlan.build(
        rows,
        paged.block_table,
        case.heads,
        case.kv_heads,
        case.head_size,
        causal=causal,
        num_splits=case.num_splits,
        cache_dtype=case.dtype,
    )
    out = torch.full_like(query, SENTINEL, memory_format=torch.contiguous_format)
    tree_attention(plan, query, paged.caches[0], out, CacheAddressing.of(paged.caches[0]), scale)
    keys, values = [keys[r] for r in picked], [values[r] for r in picked]
    ref = dense_reference(query, keys, values, rows, scale, causal)
    other = dense_reference(query, keys, values, rows, scale, not causal)
    errors = _compare(out, rows, ref)
    engine = _engine_errors(case, paged, trees, starts, query, rows, ref) if case.rows == "branch" else {}
    tol = TOLERANCE[case.dtype]
    passed = errors["scaled_err"] <= tol and errors["untouched_rows_kept"] and engine.get("engine_err", 0.0) <= tol
    return {
        **case.describe(),
        "num_splits_run": plan.num_splits,
        "block_m": plan.block_m,
        "computed_rows": sum(tr.num_nodes - tr.first_node for tr in rows),
        **errors,
        "tolerance": tol,
        "passed": passed,
        "mask_effect": max(float((a - b).abs().max()) for a, b in zip(ref, other)),
        **engine,
    }


def _accepted_moves(tree, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(node, depth) of the path to a random node after the tree's leading chain (so at least that
    node moves), by ascending depth, nodes off their slot only (:mod:`vllm_lookahead.engine.step.verification`
    lists the moves of a request this way)."""
    node, path = int(rng.integers(min(tree.first_branch_node, tree.size - 1), tree.size)), []
    while node > 0:
        path.append(node)
        node = int(tree.parents[node])
    return [(n, d) for d, n in enumerate(reversed(path), start=1) if n != d]


def compaction_moves(paged: PagedLayers, contexts: list[int], trees: list, rng: np.random.Generator):
    """int64 source and destination slots of every request's accepted path (request by request)."""
    src, dst = [], []
    device = paged.buffer.device
    for r, (ctx, tree) in enumerate(zip(contexts, trees)):
        moves = _accepted_moves(tree, rng)
        if moves:
            nodes, depths = zip(*moves)
            src.append(paged.slots(r, ctx + torch.tensor(nodes, device=device)))
            dst.append(paged.slots(r, ctx + torch.tensor(depths, device=device)))
    return torch.cat(src), torch.cat(dst)


def run_compaction_case(case: CompactionCase, device: torch.device, seed: int) -> dict[str, Any]:
    """Kernel against torch on clones of one buffer: bit-exact over the whole buffer."""
    rng = np.random.default_rng(seed)
    trees = [make_tree("lookahead", rng) if r % 2 else random_tree(rng, 24) for r in range(case.requests)]
    contexts = [int(c) for c in rng.integers(1, 200, size=case.requests)]
    paged = PagedLayers.allocate(
        case.layers,
        case.requests,
        max(contexts) + 24,
        case.kv_heads,
        case.head_size,
        case.dtype,
        device,
        case.layout,
        BLOCK_SIZE,
        seed,
    )
    src, dst = compaction_moves(paged, contexts, trees, rng)
    before = paged.buffer.clone()
    kv.move_slots(paged.caches, "FLASH_ATTN", src, dst)
    expected = paged.buffer.clone()
    paged.buffer.copy_(before)
    caches = paged.caches
    kv_compaction.move_slots(caches[0], kv_compaction.layer_offsets(caches), CacheAddressing.of(caches[0]), src, dst)
    exact = torch.equal(paged.buffer, expected)
    moved = not torch.equal(before, expected)
    return {
        "layers": case.layers,
        "kv_heads": case.kv_heads,
        "head_size": case.head_size,
        "dtype": DTYPE_NAMES[case.dtype],
        "layout": case.layout,
        "requests": case.requests,
        "moves": int(src.numel()),
        "bit_exact": exact,
        "passed": exact and moved,
    }


def run(settings: Settings, part: Part) -> None:
    """Part a: every attention case, then every compaction case (each recorded as it ends)."""
    dtypes = settings.exactness_dtypes
    for i, case in enumerate(attention_cases(settings.smoke, settings.quick, dtypes)):
        part.record(
            "attention",
            case.describe(),
            lambda case=case, i=i: run_attention_case(case, settings.device, i),
            _brief_attention,
        )
    for i, comp in enumerate(compaction_cases(settings.smoke, dtypes)):
        part.record(
            "compaction",
            {"dtype": DTYPE_NAMES[comp.dtype], "layout": comp.layout},
            lambda comp=comp, i=i: run_compaction_case(comp, settings.device, 100 + i),
            lambda r: (
                f"compaction {r['dtype']} {r['layout']} {r['moves']} moves x {r['layers']} layers: "
                f"{'bit-exact' if r['bit_exact'] else 'DIFFERS'}"
            ),
        )


def failures(data: dict[str, Any]) -> list[str]:
    """What failed in part a's record: cases out of tolerance, cases that raised."""
    bad = [
        f"{table} case {i}"
        for table in ("attention", "compaction")
        for i, row in enumerate(data.get("tables", {}).get(table, []))
        if not row["passed"]
    ]
    return bad + [f"error: {e['error']}" for e in data.get("errors", [])]


def _brief_attention(r: dict[str, Any]) -> str:
    return (
        f"{r['dtype']} {r['heads']}/{r['kv_heads']}x{r['head_size']} {r['rows']} rows, {r['num_splits_run']} "
        f"split(s), {r['layout']}: scaled err {r['scaled_err']:.2e} (abs {r['max_abs_err']:.2e})"
        + (f", engine {r['engine_err']:.2e}, torch pass {r['torch_pass_err']:.2e}" if "engine_err" in r else "")
        + f" (tol {r['tolerance']:.0e}) "
        f"{'ok' if r['passed'] else 'FAILED'}"
    )


def markdown(data: dict[str, Any]) -> list[str]:
    """Part a's tables."""
    tables = data.get("tables", {})
    attention_columns = [
        ("dtype", lambda r: r["dtype"]),
        ("heads", lambda r: f"{r['heads']}/{r['kv_heads']}"),
        ("head", lambda r: str(r["head_size"])),
        ("rows", lambda r: r["rows"]),
        ("splits", lambda r: str(r["num_splits_run"])),
        ("layout", lambda r: r["layout"]),
        ("requests (context:tree)", lambda r: " ".join(r["requests"])),
        ("computed rows", lambda r: str(r["computed_rows"])),
        ("max abs err", lambda r: f"{r['max_abs_err']:.2e}"),
        ("scaled err", lambda r: f"{r['scaled_err']:.2e}"),
        ("tolerance", lambda r: f"{r['tolerance']:.0e}"),
        ("mask effect", lambda r: cell(r, "mask_effect")),
        ("engine (kernel) scaled err", lambda r: cell(r, "engine_err")),
        ("torch pass scaled err", lambda r: cell(r, "torch_pass_err")),
        ("result", lambda r: "pass" if r["passed"] else "**FAIL**"),
    ]
    compaction_columns = [
        ("dtype", lambda r: r["dtype"]),
        ("layout", lambda r: r["layout"]),
        ("layers", lambda r: str(r["layers"])),
        ("KV heads x head", lambda r: f"{r['kv_heads']}x{r['head_size']}"),
        ("requests", lambda r: str(r["requests"])),
        ("moves", lambda r: str(r["moves"])),
        ("bit-exact vs torch", lambda r: cell(r, "bit_exact")),
        ("result", lambda r: "pass" if r["passed"] else "**FAIL**"),
    ]
    return (
        ["### Tree attention against the dense float32 reference", ""]
        + md_table(tables.get("attention", []), attention_columns)
        + ["", "### KV compaction against engine/step/kv.py's torch move_slots", ""]
        + md_table(tables.get("compaction", []), compaction_columns)
    )
