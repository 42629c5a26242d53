"""Lookahead's own counters (per worker), logged periodically.

vLLM's scheduler already turns every step's (drafted, accepted) pair into the
``vllm:spec_decode_*`` Prometheus counters (drafted = tree size, accepted =
verified path length), because the runner patches return accepted tokens the
way vLLM's rejection sampler would.  These counters add what only the plugin
knows: how the draft tree was made up and how long verification took.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format


@dataclass
class LookaheadStats:
    steps: int = 0               # target forwards that carried a tree
    draft_tokens: int = 0        # tree nodes sent (root excluded)
    candidate_ngrams: int = 0    # pool n-grams put in the verification branch
    accepted_tokens: int = 0     # accepted draft tokens (bonus excluded)
    verify_seconds: float = 0.0  # plugin CPU time in verification + KV compaction
    propose_seconds: float = 0.0
    log_interval_s: float = 30.0
    _last_log: float = field(default_factory=time.monotonic)

    def on_propose(self, draft) -> None:
        self.candidate_ngrams += int(draft.num_candidates)

    def on_verified(self, num_drafts: int, num_accepted: int) -> None:
        self.steps += 1
        self.draft_tokens += num_drafts
        self.accepted_tokens += num_accepted

    @property
    def mean_accepted_per_step(self) -> float:
        """Tokens produced per tree-carrying forward: accepted drafts + 1 bonus."""
        return 1.0 + self.accepted_tokens / self.steps if self.steps else 0.0

    def maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_interval_s or not self.steps:
            return
        self._last_log = now
        logger.info(
            "lookahead: %d tree steps, %.2f tokens/step, %.1f draft tokens/step, "
            "%.1f candidates/step, verify %.2f ms/step, propose %.2f ms/step",
            self.steps,
            self.mean_accepted_per_step,
            self.draft_tokens / self.steps,
            self.candidate_ngrams / self.steps,
            1e3 * self.verify_seconds / self.steps,
            1e3 * self.propose_seconds / self.steps,
        )
