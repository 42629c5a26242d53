"""A ratio of two exponentially decayed sums: what the engine's clocks learn host prices with.

Each observation adds ``(amount, units)`` after the past was multiplied by ``decay``, so the ratio
is a mean per unit over roughly the last ``1 / (1 - decay)`` observations (seconds per request
proposed for, per tree verified, ...), following a lasting change within a few dozen.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecayedRatio:
    """``sum(decay^age * amount) / sum(decay^age * units)``; None until ``units`` were added."""

    decay: float
    amount: float = 0.0
    units: float = 0.0

    def add(self, amount: float, units: float = 1.0) -> None:
        self.amount = self.decay * self.amount + amount
        self.units = self.decay * self.units + units

    @property
    def ratio(self) -> float | None:
        return self.amount / self.units if self.units > 0 else None
