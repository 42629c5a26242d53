"""The noise of ``q[i].exponential_(generator=g_i)`` for many generators' rows in one Triton launch.

vLLM's ``random_sample`` draws a seeded request's noise as one ``exponential_`` call per row,
from the request's CUDA generator: one launch per seeded row and position, which the step's
sampled walks multiply.  torch's CUDA ``exponential_`` (``ATen/native/cuda/DistributionTemplates.h``)
is counter-based: for a row of ``V`` elements, at most one thread per element
(``V <= SMs x max threads per SM``), element ``j`` is the first word of Philox4x32-10 with key
the generator's seed and counter ``(offset / 4, j)`` (``curand_init(seed, j, offset)``), made
uniform on (0, 1] as curand does (``x * 2^-32 + 2^-33``) and turned into ``-log(u)`` by the fast
``__logf`` (with ``u`` at 1 mapped to the float's ``epsilon / 2``); the generator's offset then
moves on by 4.  So the seeded rows of a step are one launch, given each generator's seed and
offset, each offset advanced on the host exactly as the per-row call advances it.  Measured on an
H200 with torch 2.11 (``docs/bench/2026-11-28-gpu-batches/fused-noise``): bit for bit torch's rows
at 49k and 128k vocabularies (the accurate ``logf`` and Triton's own ``log`` are not), 0.12-0.20 ms
for 32 rows against 0.32-0.54 ms for 32 calls.  The engine checks the bits against torch itself on its
device before it uses the kernel (:func:`matches_torch`), and keeps torch's calls where they differ.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

_TWO_POW_M32 = tl.constexpr(2.3283064365386963e-10)  # CURAND_2POW32_INV
_HALF_EPS = tl.constexpr(5.960464477539063e-08)  # std::numeric_limits<float>::epsilon() / 2


@triton.jit
def _exponential_rows_kernel(
    out_ptr, rows_ptr, seeds_ptr, offsets_ptr, vocab, stride, BLOCK: tl.constexpr, FAST_LOG: tl.constexpr
):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + i)
    seed = tl.load(seeds_ptr + i)
    counter = tl.load(offsets_ptr + i) // 4
    zero = tl.zeros([BLOCK], dtype=tl.uint32)
    c0 = zero + (counter & 0xFFFFFFFF).to(tl.uint32)
    c1 = zero + ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32)
    x, _, _, _ = tl.philox(seed, c0, c1, cols.to(tl.uint32), zero)
    u = x.to(tl.float32) * _TWO_POW_M32 + _TWO_POW_M32 * 0.5
    if FAST_LOG:
        log = libdevice.fast_logf(u)  # torch's __logf
    else:
        log = tl.log(u)  # Triton's interpreter has no libdevice (the CPU tests)
    log = tl.where(u >= 1.0 - _HALF_EPS, -_HALF_EPS, log)
    tl.store(out_ptr + row * stride + cols, -log, mask=cols < vocab)


def exponential_rows(
    out: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, fast_log: bool = True
) -> None:
    """Row ``rows[i]`` of ``out`` (float32 ``[R, V]``, rows contiguous) filled with the noise torch's
    ``exponential_`` draws for a row of ``V`` from a generator of seed ``seeds[i]`` at offset
    ``offsets[i]`` (int64 tensors on ``out``'s device)."""
    vocab = out.shape[1]
    block = 1024
    _exponential_rows_kernel[(len(rows), triton.cdiv(vocab, block))](
        out, rows, seeds, offsets, vocab, out.stride(0), BLOCK=block, FAST_LOG=fast_log
    )


def take_offsets(generators: Sequence[torch.Generator], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(seeds, offsets) of ``generators`` for one row each, every generator advanced past its row
    as its own ``exponential_`` call would advance it (its offset by 4)."""
    seeds, offsets = [], []
    for g in generators:
        offset = g.get_offset()
        seed = g.initial_seed()  # a uint64: as the int64 of the same bits
        seeds.append(seed - (1 << 64) if seed >= 1 << 63 else seed)
        offsets.append(offset)
        g.set_offset(offset + 4)
    return _on(seeds, device), _on(offsets, device)


def _on(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def fits(vocab: int, device: torch.device) -> bool:
    """Whether a row of ``vocab`` is one element per thread in torch's launch on ``device`` (the
    layout this kernel reproduces)."""
    props = torch.cuda.get_device_properties(device)
    return vocab <= props.multi_processor_count * props.max_threads_per_multi_processor


def matches_torch(vocab: int, device: torch.device, rows: int = 8) -> bool:
    """Whether this kernel's rows equal torch's ``exponential_`` bit for bit on ``device`` for
    ``rows`` generators at assorted offsets, every generator left where torch's call leaves it."""
    if device.type != "cuda" or not fits(vocab, device):
        return False
    theirs = [torch.Generator(device).manual_seed(1000 + i) for i in range(rows)]
    ours = [torch.Generator(device).manual_seed(1000 + i) for i in range(rows)]
    for i in range(rows):  # assorted offsets: a few earlier draws of assorted sizes
        for size in range(i % 3):
            torch.empty(vocab * (size + 1), device=device).exponential_(generator=theirs[i])
            torch.empty(vocab * (size + 1), device=device).exponential_(generator=ours[i])
    expected = torch.empty((rows, vocab), device=device)
    for i, g in enumerate(theirs):
        expected[i].exponential_(generator=g)
    got = torch.full_like(expected, -1.0)
    exponential_rows(got, _on(list(range(rows)), device), *take_offsets(ours, device))
    states = all(a.get_offset() == b.get_offset() for a, b in zip(theirs, ours, strict=True))
    return bool(torch.equal(got, expected)) and states


@functools.cache
def usable(vocab: int, device: torch.device) -> bool:
    """:func:`matches_torch`, checked once per vocabulary and device (any failure: not usable)."""
    try:
        return matches_torch(vocab, device)
    except Exception:  # noqa: BLE001 -- a Triton or torch that cannot run it: torch's calls stay
        return False
