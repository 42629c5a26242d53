"""The forward-cost model of the running engine, profiled at start-up.

Once the KV cache exists (``initialize_kv_cache``, before the first request), the
runner times its own model with vLLM's ``_dummy_run`` -- the forward vLLM uses
for its memory profile and warm-up, on dummy token ids, through the same
CUDA-graph dispatch as real steps -- followed by the LM head over every row
(``compute_logits``: a chain step needs logits for each draft token, and on this
CPU that is ~0.2 ms of a ~1.2 ms per-token price), at :data:`PROFILE_SIZES` tokens
(up to the engine's ``max_num_batched_tokens``): one warm-up round over every size, then
:data:`REPEATS` rounds, each timing every size once, best per size.  Rounds rather than
one size after the other: a slow spell (the first calls after start-up, another process
on the cores) then slows every size alike instead of all repeats of one size.  Timing noise
only ever adds time, and a forward of fewer tokens is not slower than one of more, so each
size's time is the lowest measured at it or any larger size: one size timed slow in every
round (seen: 2 tokens at 5.7 ms beside 1.5 ms at 4, on a CPU shared with another process)
would otherwise be carried up to every larger size by the non-decreasing curve and make every
draft look four times dearer than it is.  That is the chain curve of :class:`~vllm_lookahead.core.step_cost.StepCost`;
what it leaves out (attention over real contexts, per-token work of real steps, sampling,
the tree pass) is learnt from the steps served (:meth:`StepCost.observe`, fed by
:class:`~vllm_lookahead.engine.runner.RunnerLookahead`).

Cost at start-up: 8 sizes x 4 forwards; on the project's 2-core CPU with the
bundled 135M model about 2 s (logged), for the toy test model 0.1 s; on a GPU a few ms.  If the dummy run
fails (a vLLM that changed it), the plugin logs why and uses
:data:`FALLBACK`, this CPU's measurement (``core/fitted.json``): the rule still works, less
well elsewhere.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

from vllm_lookahead.core.fitted import FITTED
from vllm_lookahead.core.step_cost import StepCost

logger = logging.getLogger("vllm.lookahead")

PROFILE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
REPEATS = 3

# SmolLM2-135M fp32 on the project's 2-core CPU (Intel Xeon, oneDNN), as this module profiled it
# (2026-11-25, forward + LM head), with the price of a tree row that day's benchmark measured; the
# numbers, the recording and how to refit them: core/fitted.json, cost_profile.FALLBACK.
_PROFILE = FITTED["cost_profile.FALLBACK"]
FALLBACK = StepCost(tuple(_PROFILE["tokens"]), tuple(_PROFILE["seconds"]), tree_row_prior=_PROFILE["tree_row_prior"])


def fallback_cost() -> StepCost:
    """A fresh copy of :data:`FALLBACK` (each engine refines its own)."""
    return dataclasses.replace(FALLBACK)


def profile_forward_cost(runner: Any) -> StepCost:
    """Time ``runner._dummy_run`` at each profiled size; :data:`FALLBACK` if it cannot run."""
    limit = int(getattr(runner.scheduler_config, "max_num_batched_tokens", 0) or PROFILE_SIZES[-1])
    sizes = [n for n in PROFILE_SIZES if n <= limit] or [1]
    t0 = time.perf_counter()
    seconds = [float("inf")] * len(sizes)
    try:
        for rep in range(REPEATS + 1):
            for i, n in enumerate(sizes):
                took = _timed_dummy_forward(runner, n)
                if rep:  # the first round warms up
                    seconds[i] = min(seconds[i], took)
    except Exception as exc:  # noqa: BLE001 -- any failure: fall back, say why
        logger.warning(
            "lookahead: forward-cost profile failed (%s: %s); using the bundled CPU profile", type(exc).__name__, exc
        )
        return fallback_cost()
    cost = StepCost(tuple(sizes), tuple(lower_envelope(seconds)))
    logger.info(
        "lookahead: forward cost profiled in %.1f s: %s",
        time.perf_counter() - t0,
        ", ".join(f"{n} tok {1e3 * s:.1f} ms" for n, s in zip(sizes, seconds)),
    )
    return cost


def lower_envelope(seconds: list[float]) -> list[float]:
    """Each size's time as the lowest measured at it or at any larger size (sizes ascending)."""
    out, low = [], float("inf")
    for sec in reversed(seconds):
        low = min(low, sec)
        out.append(low)
    return out[::-1]


def _timed_dummy_forward(runner: Any, tokens: int) -> float:
    """Seconds of one dummy forward of ``tokens`` tokens plus the LM head over every row."""
    _sync(runner.device)
    start = time.perf_counter()
    hidden, _ = runner._dummy_run(tokens)
    runner.model.compute_logits(hidden[:tokens])
    _sync(runner.device)
    return time.perf_counter() - start


def agree_across_ranks(cost: StepCost) -> tuple[StepCost, bool]:
    """``(cost model, shared)``: under tensor parallelism the same model on every rank.

    Each rank runs its own draft rule and every rank must build the very same trees (the
    scheduler sends one rank's draft tokens to all; each rank verifies and compacts its own
    tree), so the rule may not depend on per-rank timing.  With more than one rank the ranks'
    profiles are combined (the slowest rank's time per size, one all-reduce over vLLM's CPU
    group at start-up) and the caller freezes the model (no learning from local step times).
    """
    try:
        import torch.distributed as dist
        from vllm.distributed import get_tp_group

        group = get_tp_group()
    except Exception:  # noqa: BLE001 -- no distributed state (single process): nothing to agree on
        return cost, False
    if group.world_size <= 1:
        return cost, False
    values = torch.full((len(PROFILE_SIZES),), -1.0, dtype=torch.float64)
    for n, sec in zip(cost.tokens, cost.seconds):
        if n in PROFILE_SIZES:
            values[PROFILE_SIZES.index(n)] = sec
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group.cpu_group)
    sizes = [(n, float(v)) for n, v in zip(PROFILE_SIZES, values.tolist()) if v > 0]
    shared = StepCost(
        tuple(n for n, _ in sizes),
        tuple(v for _, v in sizes),
        tree_row_prior=cost.tree_row_prior,
        tree_step_seconds=cost.tree_step_seconds,
    )
    logger.info(
        "lookahead: %d tensor-parallel ranks share one forward-cost model (slowest rank per size), "
        "not refined by local step times",
        group.world_size,
    )
    return shared, True


def _sync(device: Any) -> None:
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)
