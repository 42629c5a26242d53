"""The exponential-noise kernel (``kernels/exponential_noise.py``) under the interpreter against a
numpy rendering of what torch's CUDA ``exponential_`` computes per element: Philox4x32-10 (the
Random123 / curand rounds) keyed by the seed at counter ``(offset / 4, element)``, the first
word made uniform on (0, 1] and turned into ``-log(u)``.  That this equals torch's own bits is
only checkable on a GPU (``matches_torch``, run by the GPU check)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_lookahead.kernels.exponential_noise import exponential_rows

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = np.uint64(0xFFFFFFFF)


def philox_first_word(seed: int, counter: int, elements: np.ndarray) -> np.ndarray:
    """Word 0 of Philox4x32-10 at counter (counter lo, counter hi, element, 0), key (seed lo, seed hi)."""
    n = len(elements)
    c = [np.full(n, counter & 0xFFFFFFFF, np.uint64), np.full(n, counter >> 32, np.uint64)]
    c += [elements.astype(np.uint64), np.zeros(n, np.uint64)]
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]  # 64-bit products of 32-bit words
        c = [
            (p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0),
            p1 & MASK,
            (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
            p0 & MASK,
        ]
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return c[0].astype(np.uint32)


def reference(seed: int, offset: int, vocab: int) -> np.ndarray:
    x = philox_first_word(seed, offset // 4, np.arange(vocab))
    u = x.astype(np.float32) * np.float32(2.0**-32) + np.float32(2.0**-33)
    half_eps = np.float32(np.finfo(np.float32).eps / 2)
    return np.where(u >= np.float32(1) - half_eps, half_eps, -np.log(u))


@pytest.mark.parametrize("vocab", [1, 1000, 3000])
def test_rows_are_philox_at_each_generators_seed_and_offset(vocab):
    seeds = [7, 2**40 + 3, 123456789]
    offsets = [0, 4, 2**34 + 8]  # a counter past 32 bits too
    out = torch.empty((3, vocab), dtype=torch.float32)
    rows = torch.tensor([2, 0, 1])  # the rows each generator fills
    exponential_rows(out, rows, torch.tensor(seeds), torch.tensor(offsets), fast_log=False)  # no libdevice here
    for i in range(3):
        want = reference(seeds[i], offsets[i], vocab)
        assert np.allclose(out[int(rows[i])].numpy(), want, rtol=2e-7, atol=0), i
    assert (out > 0).all()
    assert len(set(out[:, 0].tolist())) == 3


def test_a_cpu_keeps_torchs_calls(monkeypatch):
    """Off a GPU (CPU generators are not Philox) verification never takes the kernel, even with
    the kernels forced."""
    from vllm_lookahead.engine.step.sampler_noise import _fused_noise

    monkeypatch.setenv("VLLM_LOOKAHEAD_TREE_KERNEL", "triton")
    assert not _fused_noise(torch.empty(2, 8))
