"""A step that admits a waiting request carries no drafts (scheduler side).

vLLM's scheduler fills a step with the requests it runs -- their draft tokens included -- and then
admits waiting requests into what is left.  On the step that admits one, the newcomer's prompt
shares the forward with every running request's drafts: each draft token lengthens the step that
ends in the newcomer's first token, and nothing the newcomer does gains from it.  So before vLLM
schedules a step that can admit every waiting request (the free running slots outnumber them),
the running requests' drafts are dropped: that step runs as without speculation; drafting resumes
on the next.  The worker sees requests scheduled without their drafts, as when vLLM's token budget
cuts them, and its pools catch up on the step's token as after any undrafted step.  With more
requests waiting than slots free -- a queue, the server saturated -- drafts stay: there a request
waits for slots to free, which drafting speeds up.

A waiting request that a free slot does not admit (the KV cache is full) would drop drafts on every
step while it waits; after such a step nothing is dropped again until a running request leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DraftFreeAdmission:
    """One scheduler's record: the running count at which a draft-free step admitted nothing."""

    stuck_at: int | None = None

    def before_schedule(self, running: list[Any], num_waiting: int, max_running: int) -> int:
        """Drop the running requests' drafts if this step can admit every waiting request; the
        number of requests whose drafts were dropped."""
        if not num_waiting or num_waiting > max_running - len(running):
            return 0
        if self.stuck_at is not None and len(running) >= self.stuck_at:
            return 0
        dropped = 0
        for request in running:
            if request.spec_token_ids:
                request.spec_token_ids = []
                dropped += 1
        return dropped

    def after_schedule(self, dropped: int, num_running_before: int, admitted: int) -> None:
        """Record whether the draft-free step admitted anything."""
        if admitted:
            self.stuck_at = None
        elif dropped:
            self.stuck_at = num_running_before
