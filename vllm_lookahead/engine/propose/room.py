"""Per-request rules of the proposal step (what vLLM's ``propose`` call asks for).

:meth:`~vllm_lookahead.engine.runner.RunnerLookahead.propose` walks the batch;
these helpers decide, for one request, how many draft nodes it may get and how
its Jacobi window is seeded.  No state here.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np


def draft_room(sp: Any, num_output_tokens: int, num_tokens: int, max_model_len: int, budget: int | None) -> int:
    """Draft nodes one request may carry next step (0 = none).

    ``num_tokens``: the sequence length now; the next step runs the root plus the
    drafts, which must fit before ``max_model_len``.  The step after this one
    yields at least one token, so a request one token short of ``max_tokens`` is
    not drafted for (it would only cost compute: vLLM truncates at max_tokens).
    ``budget``: the per-request share of the step cap (None = no cap).
    """
    room = max_model_len - num_tokens - 1
    if sp is not None and sp.max_tokens is not None and num_output_tokens >= sp.max_tokens - 1:
        room = 0
    if budget is not None:
        room = min(room, budget)
    return max(room, 0)


def window_seed(config_seed: int, prompt_token_ids: Sequence[int]) -> int:
    """Window RNG seed: a function of the config seed and the prompt only.

    Not of vLLM's request id, which carries a random suffix: the same prompt gets the
    same initial window in every run (reproducible MAT) and on every tensor-parallel rank.
    """
    digest = zlib.crc32(np.asarray(prompt_token_ids, dtype=np.int64).tobytes())
    return (config_seed * 1_000_003 + digest) & 0x7FFFFFFF
