"""How many tokens a request's lead candidate may draft this step.

The paper's verification branch drafts pool n-grams of ``N - 1`` tokens.  When a
request repeats itself (quotes its prompt, restates a list, loops), a whole
``N - 1``-token candidate is accepted step after step and the step count is
bounded by ``N - 1`` tokens per forward, although the pool could say more: the
text after the candidate can be looked up again (see
:meth:`~vllm_lookahead.core.request.RequestLookahead.step_candidates`).  This controller
decides how far: the lead candidate's length doubles while it is accepted in
full and falls back to ``N - 1`` at the first miss, within ``[N - 1, maximum]``.
A miss therefore costs what the paper's draft costs, and a long run of
repetition is drafted in O(log) steps.  Suffix decoding (Oliaro et al., 2024,
arXiv:2411.04975) likewise drafts longer where its matched pattern is longer;
here the evidence is the request's own acceptance history.

On the default model's 512-token benchmark (``docs/results.md``) this raised
batch-1 MAT from 2.39 to 2.81 on MT-bench and from 2.89 to 3.96 on code, for 1-2
more draft tokens per step on average.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DraftLength:
    """Per-request lead-candidate length: ``floor`` .. ``maximum``, doubling while fully accepted."""

    floor: int  # N - 1: the paper's candidate length, never less
    maximum: int  # the longest lead candidate (>= floor)
    current: int = 0

    def __post_init__(self) -> None:
        self.maximum = max(self.maximum, self.floor)
        self.current = self.floor

    def update(self, drafted: int, accepted: int) -> None:
        """After a step whose lead candidate had ``drafted`` tokens of which ``accepted`` were accepted.

        ``accepted`` is the step's accepted draft tokens (its path may run
        through another branch; only a path at least as long as the lead
        candidate counts as "accepted in full").  A step without a lead
        candidate (``drafted == 0``) changes nothing; nor does a lead shorter
        than ``current`` (cut by the step budget, or the pool had no more) that
        was accepted in full.
        """
        if drafted <= 0:
            return
        if accepted < drafted:
            self.current = self.floor
        elif drafted >= self.current:  # a lead cut short (budget, pool ran out) proves nothing longer
            self.current = min(self.maximum, self.current * 2)
