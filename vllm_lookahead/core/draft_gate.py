"""Whether drafting pays at all at this batch size, measured: the no-harm gate over the draft rule.

The draft rule (:mod:`.draft_rule`) prices a draft by the forward it adds and the tokens it is
expected to return.  What it cannot see is the work a drafting engine does whether or not a
step's drafts are accepted: every request's pools and window updated and looked up on the host
each step, vLLM's speculative bookkeeping, verification in place of a one-row sampler.  At many
requests in flight these cost a few per cent of a step (measured on a 2-core CPU at 32 in flight:
propose 1.8-2.8 ms and verification +1.3 ms of a 60-90 ms step), enough that an engine whose drafts
are accepted can still emit fewer tokens per second than one that does not draft.

So the engine measures both.  Decode-only steps are timed from one proposal to the next (the
whole step as the server sees it: scheduling, forward, sampling and verification, the next
proposal) and grouped by the batch's size (powers of two: 1, 2-3, 4-7, ...); per group and per
policy -- drafting by the rule, or not drafting -- the gate keeps a decayed rate of tokens emitted
per request per second.  Time runs in phases of :data:`PHASE_STEPS` steps; a phase drafts when
that group's drafting rate is at least its not-drafting rate, and every few phases it runs the
other policy to keep both rates current (more often while the two are close).  A group that has
not yet been measured both ways is measured both ways first, starting with the policy that won in
the nearest group measured both ways (drafting pays less as the batch grows).  The cost is the
exploration: at a 1.4x gain, one phase in :data:`EXPLORE_EVERY`'s longest period run without
drafts.

Decisions are deterministic (no random draws): the same step timings give the same phases.
They rest on one process's timings, so the engine does not use the gate under tensor parallelism,
where every rank must build the same trees (its rule then runs on the ranks' shared cost model).
Per-step work is O(1).  Like every speed decision of the plugin it changes which tokens are
drafted, never which tokens are emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PHASE_STEPS = 8  # steps per phase (one policy each)
MIN_STEPS = 6.0  # decayed observations a policy needs in a group before its rate is trusted
DECAY = 0.98  # weight of the past per observation (a memory of ~50 steps per group and policy)
MAX_STEP_SECONDS = 2.0  # longer gaps between proposals are not steps (idle server, a stall)
# (relative difference between the two rates, explore the other policy every n-th phase): closer
# rates are re-measured more often, a clear winner rarely.
EXPLORE_EVERY = ((0.10, 5), (0.25, 10), (float("inf"), 25))


def batch_group(batch: int) -> int:
    """The group of a batch of ``batch`` decoding requests: floor(log2(batch))."""
    return max(1, batch).bit_length() - 1


@dataclass
class _PolicyRate:
    """Decayed tokens per request-second of one policy in one group."""

    tokens: float = 0.0
    request_seconds: float = 0.0
    steps: float = 0.0

    @property
    def rate(self) -> float:
        return self.tokens / self.request_seconds if self.request_seconds > 0 else 0.0

    def add(self, tokens: int, request_seconds: float) -> None:
        self.tokens = DECAY * self.tokens + tokens
        self.request_seconds = DECAY * self.request_seconds + request_seconds
        self.steps = DECAY * self.steps + 1.0


@dataclass
class DraftGate:
    """The measured on/off decision over the draft rule, one per engine (see the module docstring)."""

    rates: dict[tuple[int, bool], _PolicyRate] = field(default_factory=dict)
    phases: dict[int, int] = field(default_factory=dict)  # phases chosen per group
    drafting: bool = True  # the current phase's policy
    phase_left: int = 0

    def allow(self, batch: int) -> bool:
        """Whether the next step (``batch`` decoding requests) may draft."""
        if self.phase_left <= 0:
            self.drafting = self._choose(batch_group(batch))
            self.phase_left = PHASE_STEPS
        self.phase_left -= 1
        return self.drafting

    def observe(self, batch: int, tokens: int, seconds: float, drafting: bool) -> None:
        """One decode-only step: ``batch`` requests emitted ``tokens`` tokens in ``seconds`` (from
        the proposal before it to the one after), run under policy ``drafting``."""
        if batch <= 0 or tokens <= 0 or not 0 < seconds <= MAX_STEP_SECONDS:
            return
        key = (batch_group(batch), drafting)
        self.rates.setdefault(key, _PolicyRate()).add(tokens, batch * seconds)

    def ratio(self, batch: int) -> float | None:
        """Drafting's measured rate over not drafting's for this batch size (None: not yet both)."""
        on, off = self._trusted(batch_group(batch), True), self._trusted(batch_group(batch), False)
        return on.rate / off.rate if on is not None and off is not None and off.rate > 0 else None

    def describe(self) -> str:
        """Drafting's measured rate over not drafting's per batch group, e.g. ``1: 1.32x, 16-31: 0.96x``."""
        parts = []
        for group in sorted({g for g, _ in self.rates}):
            low = 1 << group
            ratio = self.ratio(low)
            label = str(low) if group == 0 else f"{low}-{2 * low - 1}"
            parts.append(f"{label}: " + (f"{ratio:.2f}x" if ratio is not None else "measuring"))
        return ", ".join(parts) or "no decode steps yet"

    def _trusted(self, group: int, drafting: bool) -> _PolicyRate | None:
        r = self.rates.get((group, drafting))
        return r if r is not None and r.steps >= MIN_STEPS else None

    def _choose(self, group: int) -> bool:
        on, off = self._trusted(group, True), self._trusted(group, False)
        if on is None and off is None:
            return self._neighbour_choice(group)
        if on is None:
            return True
        if off is None or off.rate <= 0:
            return False
        k = self.phases.get(group, 0) + 1
        self.phases[group] = k
        best = on.rate >= off.rate
        gap = abs(on.rate / off.rate - 1.0)
        every = next(n for limit, n in EXPLORE_EVERY if gap < limit)
        return best if k % every else not best

    def _neighbour_choice(self, group: int) -> bool:
        """The better policy of the nearest group measured both ways (the smaller one first);
        drafting where none is."""
        groups = {g for g, _ in self.rates}
        for distance in range(1, max(groups, default=0) + group + 2):
            for near in (group - distance, group + distance):
                ratio = self.ratio(1 << near) if near >= 0 and near in groups else None
                if ratio is not None:
                    return ratio >= 1.0
        return True
