"""What one target forward costs: ``t(tokens, tree rows)``, for the draft rule.

Speculation pays only where the tokens it adds to a forward cost less than the
tokens they are expected to save, and that trade depends on the hardware: on
this project's 2-core CPU every token in a forward costs ~0.7 ms of GEMMs (a
135M model, 1 token 20 ms, 32 tokens 43 ms), on an A100 a 7B model's forward
is flat up to ~64-96 tokens (Medusa, Cai et al. 2024, Fig. 2; our roofline in
:mod:`benchmarks.projection`).  :class:`StepCost` is the model the
draft rule (:mod:`.draft_rule`) asks before every step:

* **chain forwards** -- ``scale * chain(tokens) + token_seconds * (tokens - 1)``:
  ``chain`` is piecewise linear between profiled points (the engine times its own
  model at start-up, :mod:`vllm_lookahead.engine.propose.cost_profile`; a file can supply
  them instead), extrapolated with the last segment's slope; ``scale`` and
  ``token_seconds`` are fitted to the real decode steps that carried no tree pass,
  timed through sampling and verification (exponentially decayed least squares with a
  prior that fades stale evidence back to the profile, :class:`_ChainFit`; each step
  counted at most :data:`OUTLIER_RATIO` times its prediction), so they follow what the profile leaves out:
  ``scale`` what every
  step pays beyond it (inputs, sampling, a busy machine), ``token_seconds`` what each
  further token of a real step pays beyond it (attention over a real context, its
  logits row verified).  The profile alone can call tokens free: its dummy forward runs
  no attention and on this project's CPU takes the same ~20 ms for 1 to 4 tokens, while
  a real decode step pays 0.5-1.7 ms for each further token (measured on two 2-core
  machines), and a scale alone keeps a flat curve flat;
* **branching trees** add ``tree_step_seconds`` (a fixed price per step, given by a model
  such as the GPU projection's launch count; 0 when profiled) and ``tree_row_seconds`` per draft row recomputed with the
  tree mask (the eager tree-attention pass, :mod:`vllm_lookahead.engine.step.attention`,
  plus the logits rows such trees need and their verification): a decayed ratio of the measured extra
  time of tree steps over their tree rows.  It starts at ``tree_row_prior``; with
  the default prior 0 the first branching steps served are the tree pass's profile.

Pure Python (:meth:`StepCost.terms` hands the model to the compiled plan); the numbers are
seconds.  ``to_dict``/``from_dict`` write and read the model as JSON (``bench --replay --replay-cost``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A step counts at most this many times what the model predicts for it: one slow step (a code
# path's first call, another process taking the core) moves the model no further than a step
# 3x its prediction would, while a lasting change is followed within a few steps (each one may
# triple the prediction).  Without it one 20 ms step among 0.6 ms ones (the toy test model's first
# tree step) priced every later tree out, and nothing then measured trees again.
OUTLIER_RATIO = 3.0
# The per-token price beyond the profile is told apart from the scale only by steps of different
# sizes; at batch 1 those are the drafted steps alone, so once drafts are priced out no new
# evidence comes and an estimate pushed up by a few slow drafted steps would stay for good.  A
# prior that the price is the profile's (0 beyond it), weighted like one 2- to 3-token step, lets the
# decayed evidence fade back to the profile: some 30-100 undrafted steps later a draft is priced in
# again and measured afresh.  Against steady evidence (drafted steps or batches of several
# requests) it shifts the estimate by ~2 %.
PER_TOKEN_PRIOR_WEIGHT = 2.0  # squared extra tokens
_CHAIN_MEMO = 1 << 16  # forward sizes whose profiled time chain() keeps


@dataclass
class StepCost:
    """``forward(tokens, tree_rows)`` in seconds; refined by :meth:`observe` (see module docstring)."""

    tokens: tuple[int, ...]  # profiled forward sizes, ascending, >= 1
    seconds: tuple[float, ...]  # their measured time
    tree_row_prior: float = 0.0  # seconds per tree row before any tree step was measured
    tree_step_seconds: float = 0.0  # fixed cost of a step with any tree rows (a model's, not learnt)
    decay: float = 0.95  # weight of the past per observation (~20 steps of memory)
    _fit: _ChainFit = field(default_factory=lambda: _ChainFit(), init=False, repr=False, compare=False)
    _tree_extra: float = field(default=0.0, repr=False)
    _tree_rows: float = field(default=0.0, repr=False)
    _cheapest: dict[tuple[int, int], float] = field(default_factory=dict, repr=False, compare=False)
    _chains: dict[float, float] = field(default_factory=dict, init=False, repr=False, compare=False)  # chain() by size
    _profile: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.seconds) or not self.tokens:
            raise ValueError("StepCost needs one time per profiled size, at least one")
        pairs = sorted(zip(self.tokens, self.seconds))
        self.tokens = tuple(int(t) for t, _ in pairs)
        # A forward never gets cheaper with more tokens: timing noise between nearby small
        # sizes (best-of-few) must not make the rule believe a draft saves time.
        monotone, top = [], 0.0
        for _, sec in pairs:
            top = max(top, float(sec))
            monotone.append(top)
        self.seconds = tuple(monotone)
        if self.tokens[0] < 1 or len(set(self.tokens)) != len(self.tokens):
            raise ValueError(f"profiled sizes must be distinct and >= 1, got {self.tokens}")

    # -- the model ------------------------------------------------------------------
    def chain(self, tokens: float) -> float:
        """Profiled time of a forward of ``tokens`` tokens (no tree pass), before ``scale``
        (worked out once per size: the profile never changes, and the draft rule asks a few
        hundred times a step)."""
        hit = self._chains.get(tokens)
        if hit is None:
            if len(self._chains) >= _CHAIN_MEMO:
                self._chains.clear()
            hit = self._chains[tokens] = self._interpolated(tokens)
        return hit

    def _interpolated(self, tokens: float) -> float:
        xs, ys = self.tokens, self.seconds
        if len(xs) == 1:
            return ys[0] * max(tokens, 1) / xs[0] if tokens > xs[0] else ys[0]
        i = bisect.bisect_left(xs, tokens)
        if i == 0:
            return ys[0]
        i = min(i, len(xs) - 1)  # past the last point: the last segment's slope
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    def cheapest_token(self, start: int, count: int) -> float:
        """The least time one more token adds to a chain forward of ``start`` .. ``start + count``
        tokens, as profiled (before ``scale``; the profile never changes, so each range is worked
        out once: the draft rule asks every step)."""
        key = (int(start), int(count))
        hit = self._cheapest.get(key)
        if hit is None:
            times = [self.chain(start + i) for i in range(count + 1)]
            hit = self._cheapest[key] = min((b - a for a, b in zip(times, times[1:])), default=0.0)
        return hit

    @property
    def scale(self) -> float:
        """Real / profiled time of chain steps, beyond :attr:`token_seconds` (1.0 until one is measured)."""
        return self._fit.scale

    @property
    def token_seconds(self) -> float:
        """What each token of a real chain step after the first costs beyond the scaled profile
        (0 until steps of different sizes were measured)."""
        return self._fit.per_token

    def chain_forward(self, tokens: float) -> float:
        """Predicted seconds of a forward of ``tokens`` tokens without a tree pass."""
        return self._fit.scale * self.chain(tokens) + self._fit.per_token * max(tokens - 1.0, 0.0)

    @property
    def tree_row_seconds(self) -> float:
        """Extra seconds per draft row recomputed with the tree mask."""
        if self._tree_rows > 0:
            return max(0.0, self._tree_extra / self._tree_rows)
        return self.tree_row_prior

    def forward(self, tokens: float, tree_rows: float = 0) -> float:
        """Predicted seconds of a forward of ``tokens`` tokens, ``tree_rows`` of them in branching trees."""
        fit = self._fit
        chain = self._chains.get(tokens)
        if chain is None:
            chain = self.chain(tokens)
        t = fit.scale * chain + fit.per_token * (tokens - 1.0 if tokens > 1.0 else 0.0)  # chain_forward
        if tree_rows > 0:
            t += self.tree_step_seconds + self.tree_row_seconds * tree_rows
        return t

    def terms(self) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float, float]]:
        """The model as the compiled plan reads it (:mod:`.plan_loop`): the profiled sizes and
        their times (float64, made once), and ``(scale, token_seconds, tree_step_seconds,
        tree_row_seconds)``."""
        if self._profile is None:
            self._profile = (np.array(self.tokens, dtype=np.float64), np.array(self.seconds, dtype=np.float64))
        fit = self._fit
        return (*self._profile, (fit.scale, fit.per_token, self.tree_step_seconds, self.tree_row_seconds))

    # -- learning from real steps --------------------------------------------------------
    def observe(self, tokens: int, tree_rows: int, seconds: float) -> None:
        """A decode step of ``tokens`` tokens (``tree_rows`` in branching trees) took ``seconds``."""
        if tokens < 1 or seconds <= 0:
            return
        seconds = min(seconds, OUTLIER_RATIO * self.forward(tokens, tree_rows))
        d = self.decay
        if tree_rows <= 0:
            self._fit.add(self.chain(tokens), tokens - 1, seconds, d)
        else:
            extra = seconds - self.chain_forward(tokens) - self.tree_step_seconds
            self._tree_extra = d * self._tree_extra + extra
            self._tree_rows = d * self._tree_rows + tree_rows

    # -- files -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The model as measured so far (profile with the fitted scale and per-token price folded
        in, tree cost), JSON-ready."""
        return {
            "tokens": list(self.tokens),
            "seconds": [self.chain_forward(n) for n in self.tokens],
            "tree_row_seconds": self.tree_row_seconds,
            "tree_step_seconds": self.tree_step_seconds,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> StepCost:
        return cls(
            tuple(raw["tokens"]),
            tuple(raw["seconds"]),
            tree_row_prior=float(raw.get("tree_row_seconds", 0.0)),
            tree_step_seconds=float(raw.get("tree_step_seconds", 0.0)),
        )

    @classmethod
    def linear(cls, base: float, per_token: float, tree_row: float = 0.0, up_to: int = 256) -> StepCost:
        """``base + per_token * tokens`` (tests, projections)."""
        return cls((1, up_to), (base + per_token, base + per_token * up_to), tree_row_prior=tree_row)

    def describe(self, sizes: Sequence[int] = (1, 8, 32)) -> str:
        parts = ", ".join(f"{n} tok {1e3 * self.forward(n):.1f} ms" for n in sizes)
        return (
            f"{parts} (profile x{self.scale:.2f} +{1e3 * self.token_seconds:.2f} ms per further token); "
            f"trees +{1e3 * self.tree_step_seconds:.2f} ms per step "
            f"+{1e3 * self.tree_row_seconds:.2f} ms per row"
        )


@dataclass
class _ChainFit:
    """Real chain-step times on the profile: ``seconds ~ scale * chain + per_token * extra``
    (``extra`` = tokens after the first), by least squares over exponentially decayed sums,
    with ``per_token >= 0`` and ``scale > 0`` and a prior ``per_token = 0`` of weight
    :data:`PER_TOKEN_PRIOR_WEIGHT` (ridge regression).  Until steps of different sizes tell the two
    apart (or when the unconstrained fit breaks a bound) ``per_token`` is 0 and ``scale`` the
    ratio of measured to profiled time, as a scale-only model would have it."""

    cc: float = 0.0  # sum of chain^2
    ce: float = 0.0  # sum of chain * extra
    ee: float = 0.0  # sum of extra^2
    yc: float = 0.0  # sum of seconds * chain
    ye: float = 0.0  # sum of seconds * extra
    scale: float = 1.0
    per_token: float = 0.0

    def add(self, chain: float, extra: float, seconds: float, decay: float) -> None:
        """One chain step: profiled time ``chain``, ``extra`` tokens after the first, ``seconds`` measured."""
        self.cc = decay * self.cc + chain * chain
        self.ce = decay * self.ce + chain * extra
        self.ee = decay * self.ee + extra * extra
        self.yc = decay * self.yc + seconds * chain
        self.ye = decay * self.ye + seconds * extra
        self.scale, self.per_token = self._solve()

    def _solve(self) -> tuple[float, float]:
        if self.cc <= 0:
            return 1.0, 0.0
        ee = self.ee + PER_TOKEN_PRIOR_WEIGHT  # the prior per_token = 0 (ridge)
        det = self.cc * ee - self.ce * self.ce
        if self.ee > 0 and det > 1e-9 * self.cc * ee:  # sizes varied enough to separate the two
            per_token = (self.cc * self.ye - self.ce * self.yc) / det
            scale = (self.yc - per_token * self.ce) / self.cc
            if per_token >= 0 and scale > 0:
                return scale, per_token
        return self.yc / self.cc, 0.0
