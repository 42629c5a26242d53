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

from collections.abc import Sequence
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
    tensors of :data:`_BLOCKED_FROM` entries or more take the running sum in two levels
    (:func:`_blocked_draw`), others in one (:func:`_flat_draw`): the same draw up to float rounding."""
    u = torch.rand((logits.shape[0], 1), dtype=torch.float64, device=logits.device)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    blocked = logits.device.type == "cpu" and logits.numel() >= _BLOCKED_FROM
    return (_blocked_draw if blocked else _flat_draw)(probs, u)


def _flat_draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf`'s token per row of ``probs`` for the uniforms ``u`` (``[rows, 1]``
    float64): the running sum over the whole vocabulary (few launches on a GPU)."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    below_total = cdf[:, -1:] * (1 - 2**-52)  # the largest float64 under the total, or the one below it
    return torch.searchsorted(cdf, u * below_total, right=True).view(-1)


_BLOCK = 256  # entries per block of :func:`_blocked_draw`
# Rows x vocabulary from which the two levels cost less on a CPU: one level costs ~0.6 ns an entry,
# two ~0.13 ns an entry and ~75 us of calls (2-core Xeon; 32 rows: 0.16 against 0.11 ms at 7,854
# tokens, 0.97 against 0.31 ms at 49,152, 14 against 0.62 ms at 151,936, where the float64 sums
# outgrow glibc's mmap threshold; 8 rows of 7,854: 0.040 against 0.057 ms).
_BLOCKED_FROM = 2**17


def _blocked_draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`_flat_draw` in two levels, for CPU tensors, where a float64 running sum over the
    vocabulary costs twice the softmax: each block of :data:`_BLOCK` entries summed (float32,
    vectorised), the running sum over the blocks finds the block, and the running sum (float64)
    within that block alone the entry -- the few dozen numbers past the block sums in numpy, whose
    calls on them cost a fraction of torch's.  Where a block's float32 sum rounds above its entries'
    float64 sum and the target falls between the two, its last entry with mass is drawn."""
    rows, vocab = probs.shape
    full = vocab // _BLOCK
    blocks = probs.as_strided((rows, full, _BLOCK), (probs.stride(0), _BLOCK, 1)).sum(dim=-1)
    if vocab > full * _BLOCK:
        blocks = torch.cat([blocks, probs[:, full * _BLOCK :].sum(dim=-1, keepdim=True)], dim=1)
    cum = blocks.cumsum(dim=-1, dtype=torch.float64).numpy()
    target = u.numpy() * (cum[:, -1:] * (1 - 2**-52))
    block = np.minimum((cum <= target).sum(axis=1), cum.shape[1] - 1)  # the first block whose running sum passes it
    before = np.where(block > 0, cum[np.arange(rows), block - 1], 0.0)
    column = block[:, None] * _BLOCK + np.arange(_BLOCK)
    local = probs.gather(1, torch.from_numpy(np.minimum(column, vocab - 1))).numpy()
    local[column >= vocab] = 0.0
    running = torch.from_numpy(local).cumsum(dim=-1, dtype=torch.float64).numpy()
    at = (running + before[:, None] <= target).sum(axis=1)
    last = _BLOCK - 1 - (local[:, ::-1] > 0).argmax(axis=1)
    return torch.from_numpy(block * _BLOCK + np.minimum(at, last))


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
