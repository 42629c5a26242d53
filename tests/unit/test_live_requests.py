"""The worker's per-request records (engine/propose/live_requests.py): one record per request, changed
only through the lifecycle operations."""

from __future__ import annotations

from types import SimpleNamespace

from vllm_lookahead.engine.propose.live_requests import LiveRequests


def test_a_request_lives_from_its_first_state_until_it_is_forgotten():
    live = LiveRequests()
    state, draft, outcome = SimpleNamespace(name="state"), SimpleNamespace(name="draft"), SimpleNamespace(name="out")
    assert len(live) == 0 and live.state("a") is None and live.draft("a") is None and live.take_outcome("a") is None
    live.add_state("a", state)
    live.set_draft("a", draft)
    assert len(live) == 1 and live.draft("a") is draft and list(live.states()) == [state]
    live.set_outcome("a", outcome)
    assert live.take_outcome("a") is outcome
    assert live.take_outcome("a") is None and live.draft("a") is None  # taken once, the verified draft with it
    assert live.state("a") is state  # the pools stay
    live.forget(["a", "never-seen"])
    assert len(live) == 0 and live.state("a") is None


def test_a_new_step_drops_outcomes_no_proposal_observed_and_preemption_voids_drafts():
    live = LiveRequests()
    for req_id in ("a", "b", "c"):
        live.add_state(req_id, SimpleNamespace(name=req_id))
        live.set_draft(req_id, SimpleNamespace())
        live.set_outcome(req_id, SimpleNamespace())
    assert live.take_outcome("a") is not None
    live.new_step()
    assert live.draft("c") is not None  # c's tree is still what vLLM holds
    assert live.take_outcome("c") is None  # its outcome went with the step
    assert live.preempted("b").name == "b"
    assert live.draft("b") is None and live.take_outcome("b") is None and live.state("b") is not None
    assert live.preempted("unknown") is None
    assert len(live) == 3


def test_a_request_offered_for_nothing_rests_longer_each_time_and_a_draft_ends_it():
    live = LiveRequests()
    rests = []
    for _ in range(6):
        live.offered("a", drafted=False, max_rest=8)
        skipped = 0
        while live.resting("a"):
            skipped += 1
        rests.append(skipped)
    assert rests == [0, 1, 2, 4, 8, 8]
    live.offered("a", drafted=True, max_rest=8)
    live.offered("a", drafted=False, max_rest=8)
    assert not live.resting("a")  # one proposal for nothing after a draft: no rest yet
    live.offered("a", drafted=False, max_rest=0)
    assert not live.resting("a")  # where rests do not pay: none
    live.offered("a", drafted=False, max_rest=8)
    live.set_outcome("a", SimpleNamespace())
    assert not live.resting("a")  # an outcome to observe is never skipped
