"""One decode step's drafts for the requests that draft: the draft rule's plan for the whole
batch, then each request's tree -- the step the engine runs (engine/runner.py) and the replay
models (benchmarks/replay.py), written once.

A request drafts from its :class:`~.request.StepCandidates` (the lead and further candidates
below its last token, :meth:`~.request.RequestLookahead.step_candidates`) and its Jacobi window.
Under ``max_tokens_per_step: "auto"`` the cost-aware rule (:func:`~.draft_rule.plan_step`) chooses,
for every request at once, the lead length, further candidates and window columns that maximise
the step's expected tokens per second under the forward-cost model; under a fixed cap each
request gets full trees within its room (candidates whole and in order, then the whole window
if it fits).  Output tokens never depend on what is drafted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .draft_rule import StepOptions
from .request import RequestLookahead, StepCandidates, StepDraft
from .step_cost import StepCost


# not frozen: made per request and step, where a frozen dataclass's init costs 2-3x (design.md, "A step's records")
@dataclass(slots=True)
class DraftRequest:
    """One request's part of a step: its state, its candidates and what bounds its tree."""

    state: RequestLookahead
    candidates: StepCandidates
    room: int  # at most this many draft nodes
    window: bool = True  # False: the verification branch only
    merge: bool | None = None  # trie-merge candidates sharing a prefix (None: the config's ablation setting)
    verify_seconds: float = 0.0  # what verifying its tree costs, whatever its size (the draft rule's price)
    token_seconds: float = 0.0  # what each accepted token costs beyond its rows (sampling the next one)


def draft_step(
    requests: Sequence[DraftRequest], cost: StepCost | None, base_tokens: int | None = None
) -> list[StepDraft]:
    """Each request's tree for the next forward, in order.  ``cost``: plan with the draft rule
    under this forward-cost model (:attr:`~vllm_lookahead.config.DraftMode.AUTO`), the forward
    carrying ``base_tokens`` tokens without drafts (default: one per request); None: full trees
    within each request's room."""
    if cost is None:
        return [
            r.state.build(
                r.candidates, candidates=None, window_columns=None if r.window else 0, merge=r.merge, budget=r.room
            )
            for r in requests
        ]
    if not requests:
        return []
    options = StepOptions()
    for r in requests:
        r.state.lay_out_options(options, r.candidates, r.window, r.verify_seconds, r.token_seconds)
    leads, cands, cols = options.plan(cost, base_tokens)
    return [
        r.state.build(r.candidates, lead=lead, candidates=c, window_columns=w, merge=r.merge, budget=r.room)
        for r, lead, c, w in zip(requests, leads, cands, cols)
    ]
