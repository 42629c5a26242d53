"""The acceptance records as table rows (core/acceptance_rows.py): the same floats as the records'
definitions (tests/support/acceptance_reference.py) over any order of observations, pooled ages
and reads; slots handed out again only once their holder's observations are applied."""

from __future__ import annotations

import gc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import acceptance_reference as ref
from vllm_lookahead.core.draft_rule import Acceptance, LeadConfidence, LeadEvidence, PooledConfidence, acceptance_rows

_observation = st.tuples(
    st.integers(0, 9),  # lead tokens tried
    st.integers(0, 9),  # of which accepted (cut below)
    st.integers(0, 4),  # further candidates
    st.integers(0, 12),  # accepted draft tokens
    st.integers(0, 5),  # window columns
    st.integers(0, 4),  # window-only tokens accepted
    st.integers(0, 5),  # context
    st.integers(0, 40),  # support
    st.booleans(),  # shared
    st.booleans(),  # drafted
)
_step = st.one_of(
    st.tuples(st.just("observe"), st.integers(0, 5), _observation),
    st.tuples(st.just("age"), st.integers(0, 1), st.none()),
    st.tuples(st.just("read"), st.integers(0, 5), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, max_size=60))
def test_rows_give_the_records_floats(steps):
    rows = acceptance_rows(2)
    pooled = [PooledConfidence(rows, 0), PooledConfidence(rows, 1)]
    ref_pooled = [ref.Pooled(), ref.Pooled()]
    kinds = [0, 1, None, 0, 1, None]  # six requests: greedy, sampled, none pooled
    table = [Acceptance(LeadConfidence(pooled[k] if k is not None else None)) for k in kinds]
    # a request with no pooled record has a table of its own: the others share the engine's
    reference = [ref.Acceptance(ref_pooled[k] if k is not None else None) for k in kinds]
    for what, who, numbers in steps:
        if what == "observe":
            lead, hit, cands, accepted, cols, col_hits, context, support, shared, drafted = numbers
            hit = min(hit, lead)
            table[who].observe(
                lead=lead,
                lead_accepted=hit,
                candidates=cands,
                accepted=accepted,
                window_columns=cols,
                window_accepted=col_hits,
                evidence=LeadEvidence(context, support, shared),
                lead_drafted=drafted,
            )
            reference[who].observe(lead, hit, cands, accepted, cols, col_hits, context, support, shared, drafted)
        elif what == "age":
            pooled[who].age()
            ref_pooled[who].age()
        else:
            _same(table[who], reference[who])
    for mine, theirs in zip(table, reference):
        _same(mine, theirs)
    for k in (0, 1):
        assert pooled[k].first.shift == ref_pooled[k].first.shift and pooled[k].next.shift == ref_pooled[k].next.shift


def _same(mine: Acceptance, theirs: ref.Acceptance) -> None:
    assert mine.lead.shifts() == theirs.shifts()
    assert mine.candidate.value == theirs.candidate.value
    assert mine.window_column.value == theirs.window_column.value
    assert mine.lead.first_record.hits == theirs.first_record.hits
    assert mine.lead.next_record.expected == theirs.next_record.expected
    at = mine.lead.rows.gather([mine.lead.slot])[0].tolist()
    assert at == [*theirs.shifts(), theirs.candidate.value, theirs.window_column.value]


def test_a_freed_slot_is_handed_out_after_its_observations_are_applied():
    rows = acceptance_rows(1)
    pooled = PooledConfidence(rows, 0)
    gone = LeadConfidence(pooled)
    slot = gone.slot
    gone.observe(LeadEvidence(3, 9), tried=5, accepted=0)  # pending
    del gone
    gc.collect()
    fresh = LeadConfidence(pooled)
    assert fresh.slot != slot  # the pending observation is still the old holder's
    assert fresh.shifts() == (pooled.first.shift, pooled.next.shift)  # applied now: the old row, and the pooled record
    assert LeadConfidence(pooled).slot == slot  # free from that application on
    model = LeadConfidence(pooled)
    assert model.first_record.tries == 0.0 and model.shifts() == (pooled.first.shift, pooled.next.shift)


def test_a_table_grows_and_keeps_its_rows():
    rows = acceptance_rows(1)
    pooled = PooledConfidence(rows, 0)
    held = [Acceptance(LeadConfidence(pooled)) for _ in range(3)]
    for k, acc in enumerate(held):
        acc.observe(lead=k + 1, lead_accepted=k, candidates=1, accepted=k + 1, window_columns=1, window_accepted=1)
    before = [(acc.lead.shifts(), acc.candidate.value) for acc in held]
    more = [LeadConfidence(pooled) for _ in range(3 * len(rows))]  # past the arrays' size
    assert len(rows) >= len(more) + len(held)
    assert [(acc.lead.shifts(), acc.candidate.value) for acc in held] == before
    assert np.all(rows.kinds[[m.slot for m in more]] == 0)
