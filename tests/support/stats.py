"""Two-sample chi-square tests for "same output distribution", as the sampling tests use them.

Given token sequences sampled with speculation and without it (same prompt, same
sampling parameters), :func:`sequence_histograms` counts the token at each position
and the 2-token prefix; :func:`compare_samples` runs one chi-square test of
homogeneity per histogram (2 x K contingency table; categories with fewer than
``min_expected`` expected counts in either sample are pooled into one "other" cell)
and applies a Bonferroni correction over the tests: the pair passes when no
p-value is below ``alpha / number of tests``.  :func:`compare_to_exact` does the same
against exactly known probabilities (chi-square goodness of fit; a token outside the
support fails it).

No SciPy: the chi-square survival function is the regularized upper incomplete
gamma function, computed by series / continued fraction (Numerical Recipes,
Sec. 6.2), accurate to ~1e-12 for the sizes used here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square(dof)."""
    if dof <= 0:
        raise ValueError("dof must be positive")
    if x <= 0:
        return 1.0
    return _gamma_q(dof / 2.0, x / 2.0)


def _gamma_q(a: float, x: float) -> float:
    if x < a + 1.0:  # series for P, Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a)))
    # continued fraction for Q (modified Lentz)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def sequence_histograms(sequences: Sequence[Sequence[int]], length: int) -> dict[str, Counter]:
    """Counts of the token at positions 0..length-1 and of the first two tokens."""
    hists: dict[str, Counter] = {f"position {i}": Counter() for i in range(length)}
    if length >= 2:
        hists["first two tokens"] = Counter()
    for seq in sequences:
        if len(seq) < length:
            raise ValueError(f"a sample has {len(seq)} tokens, fewer than {length}")
        for i in range(length):
            hists[f"position {i}"][int(seq[i])] += 1
        if length >= 2:
            hists["first two tokens"][(int(seq[0]), int(seq[1]))] += 1
    return hists


@dataclass
class Homogeneity:
    name: str
    statistic: float
    dof: int
    p_value: float
    categories: int


@dataclass
class Comparison:
    tests: list[Homogeneity]
    alpha: float
    threshold: float  # alpha / number of tests (Bonferroni)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(t.p_value >= self.threshold for t in self.tests)

    def summary(self) -> str:
        lines = [
            f"Bonferroni: each p-value must be >= {self.threshold:.2e} (alpha {self.alpha} / {len(self.tests)} tests)"
        ]
        for t in self.tests:
            flag = "" if t.p_value >= self.threshold else "  <-- differs"
            lines.append(
                f"  {t.name}: chi2 {t.statistic:.1f}, dof {t.dof}, {t.categories} cells, p {t.p_value:.3g}{flag}"
            )
        return "\n".join(lines + self.notes)


def homogeneity_test(name: str, a: Counter, b: Counter, min_expected: float = 5.0) -> Homogeneity:
    """Chi-square test that two samples' category counts come from one distribution."""
    n_a, n_b = sum(a.values()), sum(b.values())
    if not n_a or not n_b:
        raise ValueError(f"{name}: an empty sample")
    n = n_a + n_b
    cells: list[tuple[int, int]] = []
    other_a = other_b = 0
    for key in set(a) | set(b):
        ca, cb = a.get(key, 0), b.get(key, 0)
        total = ca + cb
        if min(total * n_a / n, total * n_b / n) < min_expected:
            other_a, other_b = other_a + ca, other_b + cb
        else:
            cells.append((ca, cb))
    if other_a + other_b:
        cells.append((other_a, other_b))
    if len(cells) < 2:
        return Homogeneity(name, 0.0, 0, 1.0, len(cells))
    stat = 0.0
    for ca, cb in cells:
        total = ca + cb
        for observed, size in ((ca, n_a), (cb, n_b)):
            expected = total * size / n
            stat += (observed - expected) ** 2 / expected
    dof = len(cells) - 1
    return Homogeneity(name, stat, dof, chi2_sf(stat, dof), len(cells))


def compare_samples(reference: dict[str, Counter], candidate: dict[str, Counter], alpha: float = 1e-3) -> Comparison:
    """One homogeneity test per histogram, Bonferroni-corrected (see the module docstring)."""
    if set(reference) != set(candidate):
        raise ValueError("the two samples were counted differently")
    tests = [homogeneity_test(name, reference[name], candidate[name]) for name in sorted(reference)]
    return Comparison(tests, alpha, alpha / len(tests))


def goodness_of_fit(name: str, counts: Counter, probs: dict, min_expected: float = 5.0) -> Homogeneity:
    """Chi-square test that ``counts`` were drawn from ``probs`` (category -> probability)."""
    n = sum(counts.values())
    if not n:
        raise ValueError(f"{name}: an empty sample")
    cells: list[tuple[float, float]] = []
    other_observed, other_expected = 0, 0.0
    for key, p in probs.items():
        expected, observed = n * p, counts.get(key, 0)
        if expected < min_expected:
            other_observed, other_expected = other_observed + observed, other_expected + expected
        else:
            cells.append((observed, expected))
    other_observed += sum(c for key, c in counts.items() if key not in probs)
    other_expected += max(0.0, n - n * sum(probs.values()))  # mass outside the listed support
    if other_observed or other_expected:
        cells.append((other_observed, max(other_expected, 1e-9)))  # nothing expected: any count fails
    if len(cells) < 2:
        return Homogeneity(name, 0.0, 0, 1.0, len(cells))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    return Homogeneity(name, stat, dof, chi2_sf(stat, dof), len(cells))


def compare_to_exact(observed: dict[str, Counter], exact: dict[str, dict], alpha: float = 1e-3) -> Comparison:
    """One goodness-of-fit test per histogram against exact probabilities, Bonferroni-corrected."""
    if set(observed) != set(exact):
        raise ValueError("the sample and the distribution were counted differently")
    tests = [goodness_of_fit(name, observed[name], exact[name]) for name in sorted(observed)]
    return Comparison(tests, alpha, alpha / len(tests))
