"""The draft rule's acceptance records as plain Python objects: the arithmetic that
:func:`vllm_lookahead.core.acceptance_rows.observe_rows` must reproduce float for float."""

from __future__ import annotations

import math

from vllm_lookahead.core.draft_rule import (
    DECAY,
    LEAD_FIRST_LOGIT,
    LEAD_NEXT_LOGIT,
    POOLED_DECAY,
    POOLED_PRIOR_WEIGHT,
    PRIOR_WEIGHT,
    PRIORS,
    SHARED_FIRST_LOGIT,
    SHARED_NEXT_LOGIT,
    SHARED_SUPPORT_SLOPE,
    SUPPORT_SLOPE,
)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -30 else 0.0


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _by_context(table, context):
    return table[min(max(context, 1), len(table)) - 1]


class Calibration:
    def __init__(self, decay: float = DECAY, prior_weight: float = PRIOR_WEIGHT) -> None:
        self.tries = self.hits = self.expected = 0.0
        self.decay, self.prior_weight = decay, prior_weight

    @property
    def shift(self) -> float:
        if self.tries <= 0:
            return 0.0
        predicted = self.expected / self.tries
        observed = (self.hits + self.prior_weight * predicted) / (self.tries + self.prior_weight)
        return _logit(observed) - _logit(predicted)

    def add(self, tries, hits, expected) -> None:
        d = self.decay
        self.tries = d * self.tries + tries
        self.hits = d * self.hits + hits
        self.expected = d * self.expected + expected

    def age(self, decay: float) -> None:
        self.tries, self.hits, self.expected = decay * self.tries, decay * self.hits, decay * self.expected


class Rate:
    def __init__(self, prior: float, cap: float = float("inf")) -> None:
        self.cap, self.hits, self.tries = cap, prior * PRIOR_WEIGHT, PRIOR_WEIGHT

    @property
    def value(self) -> float:
        return min(self.cap, self.hits / self.tries) if self.tries > 0 else self.cap

    def add(self, hits, tries) -> None:
        if tries > 0 or hits > 0:
            self.hits = DECAY * self.hits + hits
            self.tries = DECAY * self.tries + tries


class Pooled:
    def __init__(self) -> None:
        self.first = Calibration(1.0, POOLED_PRIOR_WEIGHT)
        self.next = Calibration(1.0, POOLED_PRIOR_WEIGHT)

    def age(self) -> None:
        self.first.age(POOLED_DECAY)
        self.next.age(POOLED_DECAY)


class Acceptance:
    """LeadConfidence's records and the two rates of one request, observed as Acceptance.observe."""

    def __init__(self, pooled: Pooled | None = None) -> None:
        self.pooled = pooled
        self.first_record, self.next_record = Calibration(), Calibration()
        self.candidate = Rate(PRIORS["candidate"])
        self.window_column = Rate(PRIORS["window_column"], cap=1.0)

    def shifts(self) -> tuple[float, float]:
        first, next_shift = self.first_record.shift, self.next_record.shift
        if self.pooled is not None:
            first += self.pooled.first.shift
            next_shift += self.pooled.next.shift
        return first, next_shift

    def observe(self, lead, lead_accepted, candidates, accepted, columns, columns_accepted, *evidence) -> None:
        context, support, shared, drafted = evidence
        if lead > 0:
            nexts = min(lead - 1, lead_accepted)
            shared_table = (SHARED_FIRST_LOGIT, SHARED_SUPPORT_SLOPE)
            first_table, slope = shared_table if shared else (LEAD_FIRST_LOGIT, SUPPORT_SLOPE)
            first = _by_context(first_table, context) + slope * math.log(max(support, 1))
            following = _by_context(SHARED_NEXT_LOGIT if shared else LEAD_NEXT_LOGIT, context) if nexts > 0 else 0.0
            if drafted and self.pooled is not None:
                self.pooled.first.add(1, int(lead_accepted > 0), _sigmoid(first + self.first_record.shift))
                if nexts > 0:
                    expected = nexts * _sigmoid(following + self.next_record.shift)
                    self.pooled.next.add(nexts, lead_accepted - 1, expected)
            self.first_record.add(1, int(lead_accepted > 0), _sigmoid(first))
            if nexts > 0:
                self.next_record.add(nexts, lead_accepted - 1, nexts * _sigmoid(following))
        if candidates > 0:
            self.candidate.add(max(0, accepted - lead_accepted), candidates)
        self.window_column.add(columns_accepted, columns)
