"""Where vLLM, decoding without speculation, forces end-of-thinking tokens along an output.

Replays vLLM's own ``ThinkingBudgetStateHolder`` one token per step, as vLLM's sampler
drives it without speculation, over a given (or generated) output.  An output is consistent
with vLLM's thinking budget iff every forced position holds the forced token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace


def _holder(start: Sequence[int], end: Sequence[int], budget: int, prompt: Sequence[int]):
    import torch
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder

    reasoning = SimpleNamespace(reasoning_start_token_ids=list(start), reasoning_end_token_ids=list(end))
    holder = ThinkingBudgetStateHolder(reasoning, 1, 0, torch.device("cpu"), False)
    holder.sync_batch(
        BatchUpdate(
            batch_size=1,
            removed=[],
            moved=[],
            added=[(0, SimpleNamespace(thinking_token_budget=budget), list(prompt), [])],
        )
    )
    return holder


def _forced_token(holder, output: list[int], vocab: int) -> int | None:
    import torch

    holder.update_state([output], None)
    logits = holder.apply_to_logits(torch.zeros(1, vocab), False, None)
    row = logits[0]
    return int(row.argmax()) if bool((row > 1e8).any()) else None


def forced_tokens(
    start: Sequence[int], end: Sequence[int], budget: int, prompt: Sequence[int], output: Sequence[int]
) -> dict[int, int]:
    """{output index: token vLLM forces there} along ``output``."""
    holder = _holder(start, end, budget, prompt)
    vocab = max([*start, *end]) + 1
    forced = {}
    for m in range(len(output)):
        token = _forced_token(holder, [int(t) for t in output[:m]], vocab)
        if token is not None:
            forced[m] = token
    return forced


def random_decode(
    start: Sequence[int],
    end: Sequence[int],
    budget: int,
    prompt: Sequence[int],
    steps: int,
    vocab: int,
    rng: random.Random,
) -> tuple[list[int], dict[int, int], list[dict]]:
    """Decode ``steps`` tokens: random ones (markers often) except where vLLM forces one.

    Returns (output, forced {index: token}, the holder's per-request state after each step --
    what a proposer reads after that step)."""
    import copy

    holder = _holder(start, end, budget, prompt)
    output: list[int] = []
    forced, states = {}, []
    for _ in range(steps):
        token = _forced_token(holder, list(output), vocab)
        if token is not None:
            forced[len(output)] = token
        else:
            token = rng.choice([*range(vocab), *start, *start, *end])
        output.append(token)
        states.append(copy.deepcopy(holder._state))
    return output, forced, states
