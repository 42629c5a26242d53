"""What the GPU check (:mod:`.gpu_check`) builds its cases from: draft trees of the shapes a
lookahead step sends, paged KV caches laid out as vLLM's GPU backends lay them out, the engine's
tree pass over them (torch or Triton, as chosen), timers and Markdown tables.

torch, numpy and the engine-free modules of the package only (no vLLM, no pydantic): the GPU
machine has neither.  The caches follow vLLM 0.32's logical per-layer shape ``[blocks,
kv_heads, block_size, 2 * head_size]`` (K | V in the last dimension, as FLASH_ATTN, TRITON_ATTN
and FLASHINFER keep them) in one of its physical orders (``KVCacheLayout``: layers, blocks,
heads, slots, content), with several layers in one buffer as vLLM allocates them, and block
tables that are random permutations of the blocks.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from vllm_lookahead.core.tree import DraftTree, TreeBuilder
from vllm_lookahead.engine.step import attention, kv
from vllm_lookahead.engine.step.tree_batch import TreeBatch, TreeRequest

# vLLM's physical orders of the logical [layers, blocks, kv_heads, slots, K|V] cache, by their
# KVCacheLayout names: physical axis j holds logical axis order[j].
LAYOUTS = {
    "LBHNC": (0, 1, 2, 3, 4),  # head-major blocks, layers outermost (one contiguous tensor per layer)
    "LBNHC": (0, 1, 3, 2, 4),  # token-major blocks (a token's heads side by side)
    "BLNHC": (1, 0, 3, 2, 4),  # token-major, the layers of one block side by side
}
CANDIDATE_TOKENS = 4  # tokens per n-gram candidate of the trees below (lookahead's N - 1 at N = 5)


# -- trees -------------------------------------------------------------------------------------
def chain_tree(nodes: int) -> DraftTree:
    """The root and ``nodes - 1`` drafts in one chain (tree mask = causal mask)."""
    return DraftTree.chain(list(range(nodes)))


def add_window(builder: TreeBuilder, columns: int, levels: int) -> None:
    """A Jacobi window below the root as :meth:`~vllm_lookahead.core.window.JacobiWindow.add_to_tree`
    lays it out: the first level a chain of ``columns - 1`` nodes, every later level one node per
    column below that column's previous node (``columns * levels - 1`` nodes)."""
    previous = [0]
    for _ in range(1, columns):
        previous.append(builder.add(previous[-1], builder.size, False))
    for level in range(1, levels):
        previous = [builder.add(p, builder.size, level == levels - 1) for p in previous]


def lookahead_tree(candidates: int, length: int, columns: int, levels: int) -> DraftTree:
    """A lookahead step's full tree: ``candidates`` n-gram chains of ``length`` tokens below the
    root (the verification branch), then a window of ``columns x levels`` (the lookahead branch)."""
    builder = TreeBuilder(0)
    for c in range(candidates):
        builder.add_chain(0, [100 + c] * length, True)
    add_window(builder, columns, levels)
    return builder.build()


def branching_tree(draft_rows: int) -> DraftTree:
    """A realistic branching tree of ``draft_rows`` draft nodes: a two-level window of
    ``max(2, draft_rows // 4)`` columns, the rest n-gram candidates of :data:`CANDIDATE_TOKENS`
    tokens (the last one cut short); under 5 drafts, two candidates (1 draft: a chain)."""
    builder = TreeBuilder(0)
    if draft_rows < 5:
        lead = -(-draft_rows // 2)
        builder.add_chain(0, [100] * lead, True)
        if draft_rows > lead:
            builder.add_chain(0, [101] * (draft_rows - lead), True)
        return builder.build()
    columns = max(2, draft_rows // 4)
    rest = draft_rows - (2 * columns - 1)
    for c in range(-(-rest // CANDIDATE_TOKENS)):
        builder.add_chain(0, [100 + c] * min(CANDIDATE_TOKENS, rest - c * CANDIDATE_TOKENS), True)
    add_window(builder, columns, 2)
    return builder.build()


def random_tree(rng: np.random.Generator, nodes: int) -> DraftTree:
    """A leading chain of random length, then nodes under random earlier nodes."""
    builder = TreeBuilder(0)
    builder.add_chain(0, rng.integers(0, 50, size=int(rng.integers(0, nodes // 2 + 1))).tolist(), True)
    while builder.size < nodes:
        builder.add(int(rng.integers(0, builder.size)), int(rng.integers(0, 50)), bool(rng.integers(0, 2)))
    return builder.build()


def make_tree(spec: str, rng: np.random.Generator) -> DraftTree:
    """A tree by name, ``n`` its draft rows: ``chain<n>``, ``random<n>``, ``branching<n>``
    (:func:`branching_tree`) or ``lookahead`` (3 candidates of 3 tokens and a 5 x 3 window:
    W=5, N=4, G=3; 23 drafts)."""
    if spec == "lookahead":
        return lookahead_tree(3, 3, 5, 3)
    builders = {
        "chain": lambda n: chain_tree(n + 1),
        "random": lambda n: random_tree(rng, n + 1),
        "branching": branching_tree,
    }
    for kind, build in builders.items():
        if spec.startswith(kind):
            return build(int(spec[len(kind) :]))
    raise ValueError(f"unknown tree {spec!r}")


# -- paged caches ------------------------------------------------------------------------------
@dataclass
class PagedLayers:
    """``layers`` layer caches in one buffer, and a block table of ``requests`` rows.

    ``caches[l]`` is layer ``l``'s logical ``[blocks, kv_heads, block_size, 2 * head_size]``
    view (strides as ``layout`` orders the buffer); request ``r`` owns the blocks of row ``r``
    of ``block_table`` (int32), enough for ``tokens`` positions, drawn from a random permutation
    of all blocks (a few spare blocks stay unowned).
    """

    buffer: torch.Tensor
    caches: list[torch.Tensor]
    block_table: torch.Tensor
    block_size: int
    head_size: int

    @classmethod
    def allocate(
        cls,
        layers: int,
        requests: int,
        tokens: int,
        kv_heads: int,
        head_size: int,
        dtype: torch.dtype,
        device: torch.device,
        layout: str = "LBNHC",
        block_size: int = 16,
        seed: int = 0,
    ) -> PagedLayers:
        """Random normal K and V everywhere (the context of every request)."""
        per_request = -(-tokens // block_size)
        blocks = requests * per_request + 3
        logical = (layers, blocks, kv_heads, block_size, 2 * head_size)
        order = LAYOUTS[layout]
        gen = torch.Generator(device).manual_seed(seed)
        physical = torch.empty([logical[i] for i in order], dtype=dtype, device=device).normal_(generator=gen)
        buffer = physical.permute([order.index(i) for i in range(5)])
        perm = torch.randperm(blocks, generator=gen, device=device)[: requests * per_request]
        table = perm.view(requests, per_request).to(torch.int32)
        return cls(physical, [buffer[layer] for layer in range(layers)], table, block_size, head_size)

    def slots(self, request: int, positions: torch.Tensor) -> torch.Tensor:
        """int64 cache slots (``block * block_size + offset``) of ``request``'s ``positions``."""
        row = self.block_table[request].to(torch.long)
        return row[positions // self.block_size] * self.block_size + positions % self.block_size

    def write(self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write ``key``/``value`` (``[tokens, kv_heads, head_size]``) at ``slots`` of ``layer``, as
        the backends' cache update does (slot -> block ``slot // block_size``, offset ``slot % block_size``)."""
        d = self.head_size
        cache = self.caches[layer]
        blocks, offsets = slots // self.block_size, slots % self.block_size
        cache[..., :d][blocks, :, offsets] = key.to(cache.dtype)
        cache[..., d:][blocks, :, offsets] = value.to(cache.dtype)

    def read(self, layer: int, request: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``request``'s first ``length`` positions, ``[kv_heads, length, head_size]`` each
        (a contiguous copy)."""
        d = self.head_size
        slots = self.slots(request, torch.arange(length, device=self.buffer.device))
        rows = self.caches[layer][slots // self.block_size, :, slots % self.block_size]  # [length, kv_heads, 2d]
        rows = rows.transpose(0, 1)
        return rows[..., :d].contiguous(), rows[..., d:].contiguous()


def strided_query(
    tokens: int,
    heads: int,
    kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> torch.Tensor:
    """Random normal queries ``[tokens, heads, head_size]`` as a view of a fused QKV projection's
    output (token stride ``(heads + 2 * kv_heads) * head_size``), as attention receives them."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_size, generator=gen, device=device).to(dtype)
    return qkv[:, : heads * head_size].view(tokens, heads, head_size)


# -- the engine's tree pass --------------------------------------------------------------------
@contextmanager
def engine_path(choice: str) -> Iterator[None]:
    """Run the engine's tree path as ``choice`` says (``torch``: the torch pass, ``triton``: the
    Triton kernels, even on a CPU under the interpreter): ``VLLM_LOOKAHEAD_TREE_KERNEL`` for the block."""
    name = "VLLM_LOOKAHEAD_TREE_KERNEL"
    before = os.environ.get(name)
    os.environ[name] = choice
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def engine_call(
    paged: PagedLayers, requests: list[TreeRequest], heads: int, query: torch.Tensor, output: torch.Tensor
) -> Callable[[], None]:
    """One layer of :func:`~vllm_lookahead.engine.step.attention.fix_draft_rows` over ``paged``'s layer 0
    for ``requests`` (``batch_index`` = block-table row), as a FLASH_ATTN step hands it over; the
    layout check of the first step is taken as done (the exactness part compares the rows)."""
    kv_heads, head_size = paged.caches[0].shape[1], paged.head_size
    batch = TreeBatch(
        requests,
        torch.zeros(0),
        torch.zeros(0),
        torch.zeros(0),
        block_table=paged.block_table,
        kv=kv.PagedKV("FLASH_ATTN", paged.caches, paged.block_size, layout_checked=True),
    )
    impl = SimpleNamespace(num_heads=heads, head_size=head_size, num_kv_heads=kv_heads, scale=head_size**-0.5)
    key = torch.zeros(query.shape[0], kv_heads * head_size, dtype=query.dtype, device=query.device)
    return lambda: attention.fix_draft_rows(impl, query, key, paged.caches[0], output, batch)


# -- timing ------------------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(
    fn: Callable[[], object],
    device: torch.device,
    calls: int = 10,
    samples: int = 5,
    warmup: int = 2,
    slow_s: float = 0.05,
) -> float:
    """Median seconds per call of ``fn`` over ``samples`` runs of ``calls`` back-to-back calls,
    after ``warmup`` calls; on CUDA between CUDA events (the GPU's time for a stream of calls,
    launch overhead included where a call is shorter than its launch), elsewhere wall time.
    A call slower than ``slow_s`` is timed one at a time (3 samples)."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    synchronize(device)
    if warmup and (time.perf_counter() - start) / warmup > slow_s:
        calls, samples = 1, 3
    run = _repeated(fn, calls)
    return statistics.median(_seconds(run, device) / calls for _ in range(samples))


def _seconds(body: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``body``: between CUDA events on CUDA, wall time elsewhere."""
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        body()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    body()
    return time.perf_counter() - t0


def time_side_by_side(
    fns: dict[str, Callable[[], object]], device: torch.device, calls: int = 10, samples: int = 7, warmup: int = 2
) -> dict[str, float]:
    """Median device seconds per call of each of ``fns``, their samples taken in turn (a clock or
    neighbour change during the run shifts all of them alike).  On CUDA each sample replays a
    CUDA graph of ``calls`` calls captured after ``warmup`` eager calls: the GPU's time for the
    calls without the host's launch cost, so a launch-bound call is timed by what it runs (a
    call that cannot be captured is timed eagerly, like :func:`time_per_call`); elsewhere wall
    time of eager calls."""
    runs: dict[str, Callable[[], object]] = {}  # each runs ``calls`` calls
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        synchronize(device)
        runs[name] = _captured(fn, calls) if device.type == "cuda" else _repeated(fn, calls)
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(samples):
        for name, run in runs.items():
            per_call[name].append(_seconds(run, device) / calls)
    return {name: statistics.median(values) for name, values in per_call.items()}


def _repeated(fn: Callable[[], object], calls: int) -> Callable[[], object]:
    return lambda: [fn() for _ in range(calls)]


def _captured(fn: Callable[[], object], calls: int) -> Callable[[], object]:
    """A callable replaying ``calls`` calls of ``fn`` from one CUDA graph, or ``calls`` eager
    calls where capture fails."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception:  # noqa: BLE001 -- e.g. a host synchronisation inside fn: timed eagerly
        torch.cuda.synchronize()
        return _repeated(fn, calls)
    return graph.replay


def time_host(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """``fn()`` and the wall seconds it took, the device's work included (one call)."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


def count_launches(fn: Callable[[], object], device: torch.device) -> int | None:
    """Device operations (kernels, copies, fills) one call of ``fn`` runs, counted with
    ``torch.profiler``; None off CUDA (there the number is stated from the code)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()  # compiled and warm before it is counted
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


# -- reports -----------------------------------------------------------------------------------
Column = tuple[str, Callable[[dict], str]]


def cell(row: dict, key: str, scale: float = 1.0, digits: int = 3) -> str:
    """``row[key] * scale`` to ``digits`` significant digits, ``-`` when absent."""
    value = row.get(key)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value * scale:.{digits}g}"
    return str(value)


def md_table(rows: list[dict], columns: list[Column]) -> list[str]:
    """Markdown lines of a table with one line per row (``columns``: header, cell function)."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(f(r) for _, f in columns) + " |" for r in rows]
    return lines
