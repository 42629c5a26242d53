"""A step that can admit every waiting request carries no drafts; a queue longer than the free slots
keeps them; a waiting request that a free slot does not admit stops the dropping until a running
request leaves."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_lookahead.engine.propose.admission import DraftFreeAdmission


@dataclass
class Req:
    spec_token_ids: list[int] = field(default_factory=list)


def running(*drafts: list[int]) -> list[Req]:
    return [Req(list(d)) for d in drafts]


def test_nothing_waits_or_a_queue_keeps_drafts():
    gate = DraftFreeAdmission()
    reqs = running([1, 2], [3])
    assert gate.before_schedule(reqs, num_waiting=0, max_running=4) == 0
    assert gate.before_schedule(reqs, num_waiting=3, max_running=2) == 0  # no slot free
    assert gate.before_schedule(reqs, num_waiting=3, max_running=4) == 0  # 3 wait for 2 slots
    assert [r.spec_token_ids for r in reqs] == [[1, 2], [3]]


def test_a_step_that_can_admit_drops_every_draft():
    gate = DraftFreeAdmission()
    reqs = running([1, 2], [], [3])
    assert gate.before_schedule(reqs, num_waiting=1, max_running=4) == 2  # 1 waits, 1 slot
    assert all(r.spec_token_ids == [] for r in reqs)
    gate.after_schedule(2, 3, admitted=1)
    assert gate.stuck_at is None


def test_a_waiting_request_not_admitted_stops_dropping_until_a_request_leaves():
    gate = DraftFreeAdmission()
    reqs = running([1], [2], [3])
    assert gate.before_schedule(reqs, num_waiting=1, max_running=8) == 3
    gate.after_schedule(3, len(reqs), admitted=0)  # the KV cache had no room for it
    assert gate.stuck_at == 3
    reqs = running([1], [2], [3])
    assert gate.before_schedule(reqs, num_waiting=1, max_running=8) == 0  # still stuck: drafts kept
    assert [r.spec_token_ids for r in reqs] == [[1], [2], [3]]
    gate.after_schedule(0, len(reqs), admitted=0)
    assert gate.stuck_at == 3
    reqs = running([1], [2])  # one left: a slot and its KV are free again
    assert gate.before_schedule(reqs, num_waiting=1, max_running=8) == 2
    gate.after_schedule(2, len(reqs), admitted=1)
    assert gate.stuck_at is None
