"""GPU kernels of the tree path, written in Triton: torch, numpy and triton only, no vLLM.

* :mod:`.tree_attention` -- tree-masked attention of draft rows read in place from vLLM's
  paged KV cache (one launch per layer for every tree request of the step, the context
  split across programs flash-decoding style, the splits combined in the same launch);
* :mod:`.kv_compaction` -- the accepted path's K/V moved to its final slots, every layer
  in one launch;
* :mod:`.exponential_noise` -- the noise torch's ``exponential_`` draws for the seeded rows of a
  sampled walk's position, every generator's row in one launch, bit for bit.

The engine uses them on CUDA (:mod:`vllm_lookahead.engine.step.attention`,
:func:`vllm_lookahead.engine.step.kv.move_slots`); the torch pass stays the CPU path and the
reference.  On a CPU they run under Triton's interpreter (``TRITON_INTERPRET=1``), which is
how the tests check them (tests/kernels/).  Nothing here imports vLLM, so the GPU check
(:mod:`benchmarks.gpu.check`) runs them where vLLM is not installed.
"""

from __future__ import annotations

import os
from importlib.util import find_spec

import torch


def triton_available() -> bool:
    """Whether Triton can be imported (it can compile for CUDA only where a GPU is present)."""
    return find_spec("triton") is not None


def use_kernel(x: torch.Tensor) -> bool:
    """Whether the Triton kernels do the tree path's work on ``x``'s device: on CUDA where Triton
    is installed, unless ``VLLM_LOOKAHEAD_TREE_KERNEL=torch``; ``=triton`` forces them (on a CPU:
    Triton's interpreter, ``TRITON_INTERPRET=1``, as the tests run them)."""
    choice = os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL", "auto")
    if choice == "torch":
        return False
    return choice == "triton" or (x.is_cuda and triton_available())
