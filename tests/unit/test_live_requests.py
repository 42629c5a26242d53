"""The worker's per-request records (engine/propose/live_requests.py): one record per request, changed
only through the lifecycle operations."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vllm_lookahead.engine.propose.live_requests import COUNT_EVERY, LiveRequest, LiveRequests, first_rest_shift


def _state(name: str, pool_ngrams: int = 0) -> SimpleNamespace:
    return SimpleNamespace(name=name, text=SimpleNamespace(pool_ngrams=pool_ngrams))


def test_a_request_lives_from_its_first_state_until_it_is_forgotten():
    live = LiveRequests()
    state, draft, outcome = _state("state"), SimpleNamespace(name="draft"), SimpleNamespace(name="out")
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
        live.add_state(req_id, _state(req_id))
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


class _Steps(LiveRequests):
    """Records stepped as the runner steps them: each request's text grows by its new tokens at
    each proposal, and is read where an offer or an arrival takes its length."""

    def __init__(self) -> None:
        super().__init__()
        self.length: dict[str, int] = {}

    def proposing(self, req_ids: list[str], sampled: list[list[int]]) -> list[int]:  # type: ignore[override]
        for req_id, tokens in zip(req_ids, sampled):
            self.length[req_id] = self.length.get(req_id, 0) + len(tokens)
        return super().proposing(req_ids, sampled, np.array([self.length.get(r, 0) for r in req_ids]))

    def offered(self, req_id: str, drafted: bool, max_rest: int) -> None:  # type: ignore[override]
        super().offered(req_id, drafted, max_rest, self.length.get(req_id, 0))

    def arrive(self, req_id: str, max_rest: int) -> None:  # type: ignore[override]
        super().arrive(req_id, max_rest, self.length.get(req_id, 0))

    def rest(self, req_id: str) -> int:
        """Proposals with new tokens the request still skips."""
        wake = self._waking.get(req_id, 0)
        return max(0, wake - self.length.get(req_id, 0) - 1) if wake else 0


def _resting(live: _Steps, req_id: str) -> bool:
    return live.proposing([req_id], [[1]]) == []


def test_a_request_offered_for_nothing_rests_longer_each_time_and_a_draft_ends_it():
    live = _Steps()
    rests = []
    for _ in range(6):
        live.offered("a", drafted=False, max_rest=8)
        skipped = 0
        while _resting(live, "a"):
            skipped += 1
        rests.append(skipped)
    assert rests == [0, 1, 2, 4, 8, 8]
    long, first = [], _Steps()  # its first record: a phase of 0, no rest cut
    for _ in range(7):  # where rests are long, the first is already a sixteenth of the longest
        first.offered("b", drafted=False, max_rest=128)
        skipped = 0
        while _resting(first, "b"):
            skipped += 1
        long.append(skipped)
    assert long == [0, 8, 16, 32, 64, 128, 128]
    live.offered("a", drafted=True, max_rest=8)
    live.offered("a", drafted=False, max_rest=8)
    assert not _resting(live, "a")  # one proposal for nothing after a draft: no rest yet
    live.offered("a", drafted=False, max_rest=0)
    assert not _resting(live, "a")  # where rests do not pay: none
    live.offered("a", drafted=False, max_rest=8)
    live.set_outcome("a", SimpleNamespace())
    assert not _resting(live, "a")  # an outcome to observe is never skipped


def test_a_step_proposes_for_every_request_but_those_resting():
    live = _Steps()
    for req_id in ("idle", "no tokens", "outcome"):
        for _ in range(2):  # two proposals for nothing: a rest of one
            live.offered(req_id, drafted=False, max_rest=8)
    live.set_outcome("outcome", SimpleNamespace())
    ids = ["new", "idle", "no tokens", "outcome", "past the sampled"]
    assert live.proposing(ids, [[1], [2], [], [3]]) == [0, 3, 4]  # nothing to observe without new tokens either
    assert live.proposing(ids, [[1], [2], [], [3]]) == [0, 1, 3, 4]  # "idle" rested its one proposal
    assert live.proposing(["no tokens"], [[4]]) == []  # its rest was not spent while it had no tokens
    assert live.proposing(["no tokens"], [[5]]) == [0]


def test_the_pool_count_follows_the_requests_counted_again():
    live = LiveRequests()
    a, b = _state("a", 5), _state("b", 7)
    live.add_state("a", a)
    live.add_state("b", b)
    assert live.pool_ngrams == 12
    a.text.pool_ngrams = 9  # a learnt; b's pools changed too but are not counted again yet
    b.text.pool_ngrams = 8
    live.count_pools("a")
    assert live.pool_ngrams == 16
    live.forget(["b"])
    assert live.pool_ngrams == 9
    live.forget(["a"])
    assert live.pool_ngrams == 0


def test_the_pools_that_learnt_are_counted_every_few_steps():
    """The gauge follows the requests that learnt, counted together every COUNT_EVERY steps (a
    request gone meanwhile is not counted; an idle engine reads 0)."""
    live = LiveRequests()
    a, b = _state("a", 5), _state("b", 7)
    live.add_state("a", a)
    live.add_state("b", b)
    a.text.pool_ngrams, b.text.pool_ngrams = 9, 8
    live.learnt(["a", "b"])
    live.forget(["b"])
    for _ in range(COUNT_EVERY - 1):
        live.new_step()
        assert live.pool_ngrams == 5
    live.new_step()
    assert live.pool_ngrams == 9
    a.text.pool_ngrams = 11  # not said to have learnt: not counted again
    for _ in range(COUNT_EVERY):
        live.new_step()
    assert live.pool_ngrams == 9
    live.forget(["a"])
    assert live.pool_ngrams == 0


def test_requests_idle_together_wake_on_different_steps():
    """Requests that go idle on the same proposals rest as long cut by their phase: a cohort
    proposes again spread over half the rest, never all on one step."""
    live = _Steps()
    cohort = [f"r{i}" for i in range(64)]
    for _ in range(8):  # idle long enough to reach the longest rest
        for req_id in cohort:
            live.offered(req_id, drafted=False, max_rest=32)
    rests = [live.rest(r) for r in cohort]
    assert max(rests) == 32 and min(rests) >= 16 and len(set(rests)) >= 14
    assert max(rests.count(r) for r in set(rests)) <= 8


def test_a_new_request_rests_longer_at_once_where_the_engines_offers_hardly_draft():
    """The first rest is a sixteenth of the longest while one offer in ten or more drafts, a fourth
    once the engine's recent offers (about the last hundred) have drafted next to nothing."""

    def first_rest(live: _Steps, req_id: str) -> int:
        live._records[req_id] = LiveRequest(phase=0.0)  # no rest cut
        for _ in range(2):
            live.offered(req_id, drafted=False, max_rest=128)
        skipped = 0
        while _resting(live, req_id):
            skipped += 1
        return skipped

    busy = _Steps()
    for i in range(300):  # one offer in three drafts
        busy.offered(f"x{i}", drafted=i % 3 == 0, max_rest=128)
    assert busy.draft_yield > 0.1 and first_rest(busy, "new") == 8
    idle = _Steps()
    for i in range(500):
        idle.offered(f"x{i}", drafted=False, max_rest=128)
    assert idle.draft_yield < 0.02 and first_rest(idle, "new") == 32
    assert [first_rest_shift(y) for y in (1.0, 0.1, 0.05, 0.02, 0.01, 0.0)] == [4, 4, 3, 3, 2, 2]


def test_where_hardly_any_offer_drafts_new_requests_start_resting_spread_over_the_first_rest():
    """A wave of arrivals proposes spread over its first rest where the engine's offers hardly
    draft, and from its first decode step where they do; a request already known is left alone."""

    def first_proposals(live: _Steps, wave: list[str], max_rest: int) -> list[int]:
        for req_id in wave:
            live.arrive(req_id, max_rest)
        proposed_at = {}
        for step in range(2 * max_rest + 1):
            for i in live.proposing(wave, [[1]] * len(wave)):
                proposed_at.setdefault(wave[i], step)
        return [proposed_at[r] for r in wave]

    idle = _Steps()
    for i in range(500):
        idle.offered(f"x{i}", drafted=False, max_rest=128)
    idle.forget(f"x{i}" for i in range(500))
    wave = [f"new{i}" for i in range(64)]
    at = first_proposals(idle, wave, max_rest=128)
    assert min(at) >= 16 and max(at) == 32 and len(set(at)) >= 14  # a fourth of 128, cut by up to half
    assert max(at.count(s) for s in set(at)) <= 8
    busy = _Steps()
    for i in range(300):
        busy.offered(f"x{i}", drafted=i % 3 == 0, max_rest=128)
    assert first_proposals(busy, wave, max_rest=128) == [0] * len(wave)
    assert first_proposals(_Steps(), ["a"], max_rest=0) == [0]  # no rests: nothing measured, batch 1
    idle.add_state("known", _state("known"))
    idle.arrive("known", 128)
    assert idle.proposing(["known"], [[1]]) == [0]


def test_in_a_step_none_may_draft_only_the_requests_with_an_outcome_observe():
    live = LiveRequests()
    for req_id in ("a", "b", "c"):
        live.add_state(req_id, _state(req_id))
    assert live.observing(["a", "b", "c"]) == []
    live.set_outcome("c", SimpleNamespace())
    live.set_outcome("a", SimpleNamespace())
    assert live.observing(["c", "b", "a", "gone"]) == [0, 2]  # in the batch's order
    live.take_outcome("c")
    assert live.observing(["c", "b", "a"]) == [2]
    live.new_step()  # outcomes nobody observed are dropped with the step
    assert live.observing(["c", "b", "a"]) == []


def _proposing_by_rest(rests: dict[str, int], req_ids: list[str], sampled: list[list[int]]) -> list[int]:
    """The definition of who proposes: a request resting (``rests``: proposals it still skips)
    skips, and spends one of them where it has new tokens."""
    out = []
    for i, req_id in enumerate(req_ids):
        if rests.get(req_id, 0) > 0:
            rests[req_id] -= bool(sampled[i])
        else:
            out.append(i)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["offer", "offer", "offer", "draft", "arrive", "outcome", "step", "forget", "propose"]),
            st.integers(0, 3),  # a request
            st.lists(st.sampled_from([None, [], [1]]), min_size=4, max_size=4),  # a step: each one's tokens
        ),
        max_size=80,
    ),
    st.sampled_from([0, 1, 4, 16, 128]),
)
@example(  # a resting request forgotten, then proposing under the same id
    [("offer", 0, []), ("offer", 0, []), ("forget", 0, []), ("propose", 0, [[1], None, None, None])], 16
)
@example(  # its rest spent, then a step without new tokens
    [
        ("offer", 1, []),
        ("offer", 1, []),
        ("propose", 0, [None, [1], None, None]),
        ("propose", 0, [None, [], None, None]),
    ],
    1,
)
def test_a_rest_runs_out_as_the_text_grows_one_token_a_step(ops, max_rest):
    """Whatever the lifecycle, the requests with new tokens that propose are those the rests say, a
    rest spent one proposal at a time, each with new tokens (the records keep a wake length
    instead); one without new tokens has nothing to observe, proposing or not."""
    live, rests = _Steps(), {}
    for op, r, batch in ops:
        req_id = f"r{r}"
        if op in ("offer", "draft"):
            live.offered(req_id, drafted=op == "draft", max_rest=max_rest)
        elif op == "arrive":
            live.draft_yield = 0.0
            live.arrive(req_id, max_rest)
        elif op == "outcome":
            live.set_outcome(req_id, SimpleNamespace())
        elif op == "step":
            live.new_step()
        elif op == "forget":
            live.forget([req_id])
            live.length.pop(req_id, None)
        if op in ("offer", "draft", "arrive", "outcome", "forget"):
            rests[req_id] = live.rest(req_id) if req_id in live._records else 0
        if op == "propose":
            ids = [f"r{k}" for k, tokens in enumerate(batch) if tokens is not None]  # None: not in the batch
            sampled = [tokens for tokens in batch if tokens is not None]
            got, want = live.proposing(ids, sampled), _proposing_by_rest(rests, ids, sampled)
            observing = {i for i, tokens in enumerate(sampled) if tokens}
            assert [i for i in got if i in observing] == [i for i in want if i in observing]
