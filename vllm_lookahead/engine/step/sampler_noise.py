"""The noise vLLM's sampler draws for one sampled token, drawn the same way at a tree node.

vLLM 0.32 samples a random request's token as ``argmax(p / q)``, with per-token noise drawn
from the request's own generator when it has a seed (else the global one), in one of two
ways, by the sampler implementation the platform picked (``TopKTopPSampler``,
``vllm/v1/sample/ops/topk_topp_sampler.py``):

* ``"splitmix"`` -- ``forward_cpu`` (x86 / Arm CPUs): one seed per token,
  ``torch.randint(0, 2**31, (1,), generator=g)``, and the C++ op ``fused_gumbel_argmax``
  derives the Gumbel noise of every vocabulary entry from it;
* ``"exponential"`` -- ``random_sample`` (``forward_native``, CUDA with per-request
  generators, ``use_fp64_gumbel``): a vocabulary-sized vector ``q.exponential_(generator=g)``
  (float64 with ``use_fp64_gumbel``), the token ``argmax(p / q)``.

:meth:`SamplerNoise.sample` draws a seeded request's next noise the same way and samples with
it, so verification (:func:`vllm_lookahead.core.sampling.coupled_walk`) consumes the request's
generator exactly as sampling without speculation does and emits vLLM's own tokens;
:meth:`SamplerNoise.sample_rows` does it for the rows of several requests' walks in one pass (each
row with its own generator's next noise).  A request without a seed draws from the global stream,
whose draws no one can replay token for token, so its rows are sampled by the cheaper
:func:`inverse_cdf`: the same distribution, one uniform per row.  Other implementations (FlashInfer,
ROCm's aiter, XPU) have no per-token noise to mirror: :meth:`SamplerNoise.of` returns None
and verification keeps the SpecInfer rule (exact in distribution, not token for token).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class SamplerNoise:
    kind: str  # "splitmix" or "exponential"
    fp64: bool = False  # exponential noise in float64 (use_fp64_gumbel)

    @classmethod
    def of(cls, sampler: Any) -> SamplerNoise | None:
        """The noise of vLLM's ``Sampler`` ``sampler``, or None where it cannot be mirrored."""
        inner = getattr(sampler, "topk_topp_sampler", None)
        forward = getattr(getattr(inner, "forward", None), "__name__", "")
        fp64 = bool(getattr(inner, "use_fp64_gumbel", False))
        if forward == "forward_cpu":
            return cls("exponential", True) if fp64 else cls("splitmix")
        if forward in ("forward_native", "forward_cuda"):  # forward_cuda: native whenever a request has a generator
            return cls("exponential", fp64)
        return None

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """The token vLLM's sampler would draw from ``logits`` (``[1, vocab]``, after temperature
        and top-k/top-p), with the next noise of ``generator`` (None: the global stream)."""
        return self.sample_rows(logits, [generator])[0]

    def sample_rows(self, logits: torch.Tensor, generators: Sequence[torch.Generator | None]) -> list[int]:
        """:meth:`sample` for each row of ``logits`` (``[rows, vocab]``), in one pass and one
        read-back.  A seeded row (a generator of its own) is sampled with its generator's next
        noise, as vLLM's sampler draws it (:meth:`_seeded`), so each generator advances exactly
        as by that row's own :meth:`sample` and the token is vLLM's; the rows without a generator
        by :func:`inverse_cdf` (exact in distribution, one uniform each from the global stream:
        nothing there is reproducible token for token, and a vocabulary of noise per row costs
        14-30x the inverse CDF on CPU tensors: 32 rows of 7,854-49,152 tokens)."""
        free = [i for i, g in enumerate(generators) if g is None]
        if len(free) == len(generators):
            return inverse_cdf(logits).tolist()
        if not free:
            return self._seeded(logits, list(generators)).tolist()
        seeded = [i for i, g in enumerate(generators) if g is not None]
        device = logits.device
        free_rows, seeded_rows = (torch.tensor(rows, dtype=torch.int64).to(device) for rows in (free, seeded))
        tokens = torch.empty(len(generators), dtype=torch.int64, device=device)
        tokens[free_rows] = inverse_cdf(logits[free_rows])
        tokens[seeded_rows] = self._seeded(logits[seeded_rows], [generators[i] for i in seeded]).to(torch.int64)
        return tokens.tolist()

    def _seeded(self, logits: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """Each row's token with the next noise of its own generator, as vLLM's sampler draws a
        batch's noise: the seed / noise vector of each row from its generator (on a GPU the rows'
        noise in one launch where it equals torch's bit for bit, :func:`_fused_noise`), the
        argmax of every row at once."""
        if self.kind == "splitmix":
            drawn = [torch.randint(0, 2**31, (1,), generator=g, dtype=torch.long) for g in generators]
            return torch.ops._C.fused_gumbel_argmax(logits.to(torch.float32), torch.cat(drawn))
        from vllm.v1.sample.ops.topk_topp_sampler import empty_exponential_noise_like, sample_with_exponential_noise

        probs = logits.softmax(dim=-1, dtype=torch.float32)
        q = empty_exponential_noise_like(probs, self.fp64)
        if len(generators) > 1 and _fused_noise(q):
            from vllm_lookahead.kernels.exponential_noise import exponential_rows, take_offsets

            rows = torch.arange(len(generators), dtype=torch.int64, device=q.device)
            exponential_rows(q, rows, *take_offsets(generators, q.device))
        else:
            for i, g in enumerate(generators):
                q[i].exponential_(generator=g)
        return sample_with_exponential_noise(probs, q)


def inverse_cdf(logits: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits`` (``[rows, vocab]``, masked entries -inf), drawn from its
    softmax by inverse transform sampling: one uniform per row from the global stream, scaled to
    just below the row's total, and the first entry whose running sum (float64) exceeds it.  That
    entry always has mass -- the running sum rose there -- so a masked token is never drawn.  CPU
    tensors take the running sum in two levels (:func:`_blocked_draw`), others in one
    (:func:`_flat_draw`): the same draw up to float rounding."""
    u = torch.rand((logits.shape[0], 1), dtype=torch.float64, device=logits.device)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    return (_blocked_draw if logits.device.type == "cpu" else _flat_draw)(probs, u)


def _flat_draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf`'s token per row of ``probs`` for the uniforms ``u`` (``[rows, 1]``
    float64): the running sum over the whole vocabulary (few launches on a GPU)."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    below_total = cdf[:, -1:] * (1 - 2**-52)  # the largest float64 under the total, or the one below it
    return torch.searchsorted(cdf, u * below_total, right=True).view(-1)


_BLOCK = 256  # entries per block of :func:`_blocked_draw`


def _blocked_draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`_flat_draw` in two levels, for CPU tensors, where a float64 running sum over the
    vocabulary costs twice the softmax (32 rows after their softmax, 2-core Xeon: 0.026 against
    0.17 ms at 7,854 tokens, 0.16 against 0.92 ms at 49,152, 0.50 against 4-14 ms at 151,936,
    where one level's float64 sums outgrow glibc's mmap threshold): every whole block of
    :data:`_BLOCK` entries summed (float32, vectorised, one torch call), then per row in one
    compiled call (:func:`_pick`) the running sum over the blocks finds the block and the running
    sum within it the entry."""
    rows, vocab = probs.shape
    sums = probs.as_strided((rows, vocab // _BLOCK, _BLOCK), (probs.stride(0), _BLOCK, 1)).sum(dim=-1)
    return torch.from_numpy(_compiled_pick()(probs.numpy(), sums.numpy(), u.numpy().reshape(-1)))


def _pick(probs: np.ndarray, sums: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row of ``probs`` (float32 ``[rows, vocab]``): the first entry whose float64 running
    sum exceeds ``u`` (float64 per row) times just under the row's total, given ``sums``, the
    float32 sums of its whole blocks of :data:`_BLOCK` entries (the entries past the last whole
    block are summed here).  The total is the blocks' sums added in order, so the block reached is
    one whose sum passes the target, which has mass; where its entries, added one by one, round
    below the target, its last entry with mass is drawn."""
    rows, vocab = probs.shape
    full = sums.shape[1]
    last_block = full if vocab > full * _BLOCK else full - 1
    tokens = np.empty(rows, dtype=np.int64)
    for r in range(rows):
        total = 0.0
        for b in range(full):
            total += sums[r, b]
        for k in range(full * _BLOCK, vocab):
            total += probs[r, k]
        target = u[r] * (total * (1 - 2**-52))
        run, block = 0.0, 0
        while block < last_block and run + sums[r, block] <= target:
            run += sums[r, block]
            block += 1
        token = last = -1
        for k in range(block * _BLOCK, min(vocab, (block + 1) * _BLOCK)):
            if probs[r, k] > 0:
                last = k
                run += probs[r, k]
                if run > target:
                    token = k
                    break
        tokens[r] = token if token >= 0 else last
    return tokens


@functools.cache
def _compiled_pick() -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """:func:`_pick` compiled (numba, cached on disk after the first time); :func:`compile_draw`
    makes it at start-up."""
    from numba import njit

    return njit(cache=True)(_pick)


def compile_draw() -> None:
    """Compile :func:`_blocked_draw`'s loop at start-up, not in the first sampled step that needs it."""
    probs = torch.full((1, _BLOCK + 1), 1.0 / (_BLOCK + 1))
    _blocked_draw(probs, torch.zeros((1, 1), dtype=torch.float64))


def _fused_noise(q: torch.Tensor) -> bool:
    """Whether the seeded rows of ``q`` are drawn in one launch
    (:mod:`vllm_lookahead.kernels.exponential_noise`): float32 noise on a GPU with Triton (unless
    ``VLLM_LOOKAHEAD_TREE_KERNEL=torch``), where the kernel's rows were found equal to torch's
    ``exponential_`` bit for bit (checked once per vocabulary and device)."""
    from vllm_lookahead.kernels import use_kernel

    if q.dtype != torch.float32 or not q.is_cuda or not use_kernel(q):
        return False
    from vllm_lookahead.kernels.exponential_noise import usable

    return usable(q.shape[1], q.device)
