"""A batch step's drafts from arrays (:func:`~vllm_lookahead.core.batch_step.draft_batch`) against
the per-request records they stand for -- each request's candidates
(:meth:`~vllm_lookahead.core.pool_batch.PoolBatch.step_candidates`) as
:class:`~vllm_lookahead.core.drafting.DraftRequest` s, planned and built by
:func:`~vllm_lookahead.core.drafting.draft_step`: the same trees, sources, shadow tokens and
evidence, for requests with windows at every fill, their own acceptance records, candidate
limits, rooms, trie merging and prices, under forward costs that draft chains, trees or nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from support import make_config
from vllm_lookahead.core.batch_step import StepAsk, draft_batch
from vllm_lookahead.core.draft_rule import LeadEvidence, PooledConfidence
from vllm_lookahead.core.drafting import DraftRequest, draft_step
from vllm_lookahead.core.pool_batch import PoolBatch
from vllm_lookahead.core.request import RequestLookahead, StepDraft
from vllm_lookahead.core.step_cost import StepCost

TOKENS = st.integers(0, 5)
WIDTH = 300  # token array columns
COSTS = {  # a GPU at small batch (trees pay), a dearer forward (chains), one where little pays
    "cheap": StepCost.linear(0.010, 1e-6, tree_row=1e-6),
    "chains": StepCost.linear(0.010, 2e-4, tree_row=5e-3),
    "dear": StepCost.linear(0.010, 5e-2, tree_row=2e-2),
}


def _drafted(draft: StepDraft) -> tuple:
    tree = draft.tree
    return (
        tree.token_list,
        tree.parents.tolist(),
        tree.logits.tolist(),
        draft.window_nodes.tolist(),
        draft.num_candidates,
        draft.lead_tokens,
        None if draft.sources is None else draft.sources.tolist(),
        draft.window_start,
        draft.shadow_token,
        draft.lead_evidence,
        draft.window_sourced,
    )


def _request(config, prompt: list[int], k: int, rng: np.random.Generator) -> RequestLookahead:
    """A request whose records and window differ from the others'."""
    state = RequestLookahead(config, prompt, seed=k, pooled=PooledConfidence())
    for tried, accepted in ((3, 2), (1, 0), (6, 6))[: k % 4]:
        state.acceptance.lead.observe(LeadEvidence(1 + k % 3, 1 + k), tried, accepted)
    state.acceptance.candidate.add(k % 3, 1 + k % 2)
    state.acceptance.window_column.add(0.5 * (k % 3), 1)
    window = state.window
    if window is not None:  # filled to a level of its own
        for _ in range(k % window.num_levels):
            window.levels.append(rng.integers(0, 6, window.window_size))
    return state


ASKS = st.lists(
    st.tuples(
        st.booleans(),  # the text ends with its root
        st.integers(0, 12),  # room
        st.booleans(),  # one candidate (structured output)
        st.booleans(),  # greedy (sampled: tries merged)
        st.sampled_from([0.0, 1e-4]),  # verification price
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(
    prompts=st.lists(st.lists(TOKENS, max_size=30), min_size=5, max_size=5),
    steps=st.lists(st.tuples(st.lists(st.lists(TOKENS, max_size=6), min_size=5, max_size=5), ASKS), max_size=6),
    ngram_size=st.integers(2, 4),
    guess_set_size=st.integers(1, 3),
    lookup_context=st.integers(1, 3),
    window_size=st.integers(0, 3),
    max_lead_tokens=st.integers(1, 10),
    cost=st.sampled_from(sorted(COSTS)),
    floor=st.sampled_from([0.0, 0.2]),
)
def test_a_batch_step_drafts_what_each_requests_own_records_draft(
    prompts, steps, ngram_size, guess_set_size, lookup_context, window_size, max_lead_tokens, cost, floor
):
    config = make_config(
        ngram_size=ngram_size,
        guess_set_size=guess_set_size,
        lookup_context=lookup_context,
        window_size=window_size,
        max_lead_tokens=max_lead_tokens,
    )
    rng = np.random.default_rng(0)
    batch = PoolBatch(config)
    tokens = np.zeros((len(prompts), WIDTH), dtype=np.int32)
    states = [_request(config, prompt, k, rng) for k, prompt in enumerate(prompts)]
    lengths = [len(prompt) for prompt in prompts]
    for k, (state, prompt) in enumerate(zip(states, prompts)):
        assert batch.add(state.text)
        tokens[k, : len(prompt)] = prompt
    for new_tokens, asks in steps:
        for k, new in enumerate(new_tokens):  # every request learns its new tokens
            tokens[k, lengths[k] : lengths[k] + len(new)] = new
            start, lengths[k] = lengths[k], lengths[k] + len(new)
            states[k].text.known = lengths[k]
            batch.learn([states[k].text], tokens, [k], [start], [lengths[k]])
        step = []
        for k, (at_end, room, one, greedy, verify) in enumerate(asks):
            last = int(tokens[k, lengths[k] - 1]) if lengths[k] else 0
            root = last if at_end else (last + 1) % 6
            limit = 1 if one else None
            step.append(
                StepAsk(states[k], k, lengths[k], root, room, limit, not one, None if greedy else True, verify, 1e-5)
            )
        found = batch.step_candidates([(*ask[:6], floor) for ask in step], tokens)
        requests = [
            DraftRequest(a.state, c, a.room, a.window, a.merge, a.verify_seconds, a.token_seconds)
            for a, c in zip(step, found)
        ]
        expected = [_drafted(d) for d in draft_step(requests, COSTS[cost], base_tokens=8)]
        unsent = [a.state._unsent for a in step]
        drafted = [_drafted(d) for d in draft_batch(batch, step, tokens, floor, COSTS[cost], base_tokens=8)]
        assert drafted == expected
        for a, before in zip(step, unsent):  # the draft a later step checks the shadow token of
            assert (a.state._unsent is None) == (before is None)


def test_drafts_of_every_kind_are_made():
    """The property above covers the plan's every outcome: on one batch, the cheap forward drafts
    trees with candidates and window columns, a dearer one chains, the dearest no draft token."""
    config = make_config(ngram_size=3, guess_set_size=3, window_size=3, max_lead_tokens=6)
    rng = np.random.default_rng(0)
    text = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 3, 1, 2]
    batch = PoolBatch(config)
    tokens = np.zeros((4, WIDTH), dtype=np.int32)
    states = []
    for k in range(4):
        states.append(_request(config, text, k, rng))
        assert batch.add(states[-1].text)
        tokens[k, : len(text)] = text
    step = [StepAsk(s, k, len(text), 2, 12, None) for k, s in enumerate(states)]
    kinds = {}
    for name, cost in COSTS.items():
        drafts = draft_batch(batch, step, tokens, 0.0, cost, base_tokens=4)
        kinds[name] = {(d.num_candidates > 1, d.window_start is not None, d.tree.size > 1) for d in drafts}
    assert (True, True, True) in kinds["cheap"]
    assert (False, False, True) in kinds["chains"]
    assert {tree for *_, tree in kinds["dear"]} == {False}
