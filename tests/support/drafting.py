"""One request's draft as the engine's step builds it, for the unit tests of the per-request state."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_lookahead.core.draft_rule import lead_floor
from vllm_lookahead.core.drafting import DraftRequest, draft_step
from vllm_lookahead.core.request import RequestLookahead, StepDraft
from vllm_lookahead.core.step_cost import StepCost


def draft_one(
    state: RequestLookahead,
    root: int,
    recent: Sequence[int] = (),
    budget: int | None = None,
    window: bool = True,
    max_candidates: int | None = None,
    merge: bool | None = None,
    cost: StepCost | None = None,
) -> StepDraft:
    """``state``'s tree below ``root`` through :func:`~vllm_lookahead.core.drafting.draft_step`
    as a batch of one: with ``cost``, planned by the draft rule (lead floor included, as the
    engine); without, full trees within ``budget`` draft nodes (None: no limit).  ``window=False``:
    the verification branch only; ``max_candidates``: at most this many candidates."""
    room = (1 << 30) if budget is None else budget
    floor = lead_floor(cost, 1, state.config.lead_tokens) if cost is not None else 0.0
    cands = state.step_candidates(root, recent, budget, max_candidates, min_gain=floor)
    (draft,) = draft_step([DraftRequest(state, cands, room, window=window, merge=merge)], cost)
    return draft
