"""What one target forward costs: ``t(tokens, tree rows)``, for the draft rule.

Speculation pays only where the tokens it adds to a forward cost less than the
tokens they are expected to save, and that trade depends on the hardware: on
this project's 2-core CPU every token in a forward costs ~0.7 ms of GEMMs (a
135M model, 1 token 20 ms, 32 tokens 43 ms), on an A100 a 7B model's forward
is flat up to ~64-96 tokens (Medusa, Cai et al. 2024, Fig. 2; our roofline in
:mod:`vllm_lookahead.bench.projection`).  :class:`StepCost` is the model the
draft rule (:mod:`.draft_rule`) asks before every step:

* **chain forwards** -- ``scale * chain(tokens)``: ``chain`` is piecewise linear
  between profiled points (the engine times its own model at start-up,
  :mod:`vllm_lookahead.engine.cost_profile`; a file can supply them instead),
  extrapolated with the last segment's slope; ``scale`` is an exponentially
  decayed ratio of measured to predicted time over the real decode steps that
  carried no tree pass, so it follows what the profile leaves out (attention over
  a growing context, the sampler, a busy machine);
* **branching trees** add ``tree_step_seconds`` (a fixed price per step, given by a model
  such as the GPU projection's launch count; 0 when profiled) and ``tree_row_seconds`` per draft row recomputed with the
  tree mask (the eager tree-attention pass, :mod:`vllm_lookahead.engine.attention`,
  plus the logits rows such trees need): a decayed ratio of the measured extra
  time of tree steps over their tree rows.  It starts at ``tree_row_prior``; with
  the default prior 0 the first branching steps served are the tree pass's profile;
* **host work around drafts** -- a step that carries any draft also pays host work a
  forward without drafts does not: vLLM's speculative bookkeeping and our
  verification in place of its one-row sampler (a fixed price per step), and per
  drafted request the building and verifying of its tree.  At 32 requests in flight
  on this CPU that was ~9 ms of a ~150 ms step (docs/results.md, session 11) -- as
  much as a dozen draft tokens' GEMMs, so a rule that ignores it drafts where it
  does not pay.  :meth:`observe_host` learns both prices from the engine's real
  steps: the wall time from one decode step's start to the next's, less its
  forward, is fitted as ``c0 + c1 * requests + draft_step_seconds * [any drafted]
  + draft_request_seconds * drafted requests`` (decayed least squares; the
  per-request term keeps host work every request costs -- scheduling, output
  processing -- out of the drafting prices).  The two draft prices are pulled
  towards their priors (ridge) so that they stay there when the steps cannot tell
  them apart -- e.g. every step drafting -- and read as >= 0.

Pure Python; the numbers are seconds.  ``to_dict``/``from_dict`` write and read
the model as JSON (``bench --replay --replay-cost``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Sequence


HOST_MIN_STEPS = 20.0  # decayed count of observed steps before the host prices are read off the fit
HOST_RIDGE = 0.25  # pull of the coefficients towards their priors, in (typical) observations


@dataclass
class StepCost:
    """``forward(tokens, tree_rows)`` in seconds; refined by :meth:`observe` (see module docstring)."""

    tokens: tuple[int, ...]       # profiled forward sizes, ascending, >= 1
    seconds: tuple[float, ...]    # their measured time
    tree_row_prior: float = 0.0   # seconds per tree row before any tree step was measured
    tree_step_seconds: float = 0.0  # fixed cost of a step with any tree rows (a model's, not learnt)
    decay: float = 0.95           # weight of the past per observation (~20 steps of memory)
    _scale_num: float = field(default=0.0, repr=False)
    _scale_den: float = field(default=0.0, repr=False)
    _tree_extra: float = field(default=0.0, repr=False)
    _tree_rows: float = field(default=0.0, repr=False)
    draft_step_prior: float = 0.0     # host seconds of a step with any draft, before it is learnt
    draft_request_prior: float = 0.0  # host seconds per drafted request, before it is learnt
    host_decay: float = 0.99          # host times are noisier than forwards: a longer memory
    # host-time regression on (1, requests, any drafted, drafted requests): decayed X'X and X'y
    _host_xx: list = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)], repr=False)
    _host_xy: list = field(default_factory=lambda: [0.0] * 4, repr=False)
    _host_n: float = field(default=0.0, repr=False)

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
        """Profiled time of a forward of ``tokens`` tokens (no tree pass), before ``scale``."""
        xs, ys = self.tokens, self.seconds
        if len(xs) == 1:
            return ys[0] * max(tokens, 1) / xs[0] if tokens > xs[0] else ys[0]
        i = bisect.bisect_left(xs, tokens)
        if i == 0:
            return ys[0]
        i = min(i, len(xs) - 1)  # past the last point: the last segment's slope
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    @property
    def scale(self) -> float:
        """Measured / profiled time of real chain steps (1.0 until one is measured)."""
        return self._scale_num / self._scale_den if self._scale_den > 0 else 1.0

    @property
    def tree_row_seconds(self) -> float:
        """Extra seconds per draft row recomputed with the tree mask."""
        if self._tree_rows > 0:
            return max(0.0, self._tree_extra / self._tree_rows)
        return self.tree_row_prior

    def forward(self, tokens: float, tree_rows: float = 0) -> float:
        """Predicted seconds of a forward of ``tokens`` tokens, ``tree_rows`` of them in branching trees."""
        t = self.scale * self.chain(tokens)
        if tree_rows > 0:
            t += self.tree_step_seconds + self.tree_row_seconds * tree_rows
        return t

    def host_prices(self) -> tuple[float, float]:
        """(seconds per step with any draft, seconds per drafted request) of host work beyond a
        step without drafts (see the module docstring)."""
        if self._host_n < HOST_MIN_STEPS:
            return self.draft_step_prior, self.draft_request_prior
        xx = [row[:] for row in self._host_xx]
        xy = self._host_xy[:]
        # Ridge: each coefficient but the intercept is pulled to its prior with the weight of
        # HOST_RIDGE typical observations (so a constant column -- one batch size, every step
        # drafted -- leaves it at the prior instead of making the system singular).
        for k, prior in ((1, 0.0), (2, self.draft_step_prior), (3, self.draft_request_prior)):
            lam = HOST_RIDGE * max(self._host_xx[k][k] / self._host_n, 1.0)
            xx[k][k] += lam
            xy[k] += lam * prior
        w = _solve(xx, xy)
        if w is None:
            return self.draft_step_prior, self.draft_request_prior
        return max(0.0, w[2]), max(0.0, w[3])

    def draft_overhead(self, drafted_requests: int) -> float:
        """Host seconds a step with ``drafted_requests`` drafted requests pays beyond one without drafts."""
        if drafted_requests <= 0:
            return 0.0
        fixed, per_request = self.host_prices()
        return fixed + per_request * drafted_requests

    # -- learning from real steps --------------------------------------------------------
    def observe(self, tokens: int, tree_rows: int, seconds: float) -> None:
        """A decode step of ``tokens`` tokens (``tree_rows`` in branching trees) took ``seconds``."""
        if tokens < 1 or seconds <= 0:
            return
        d = self.decay
        if tree_rows <= 0:
            self._scale_num = d * self._scale_num + seconds
            self._scale_den = d * self._scale_den + self.chain(tokens)
        else:
            extra = seconds - self.scale * self.chain(tokens) - self.tree_step_seconds
            self._tree_extra = d * self._tree_extra + extra
            self._tree_rows = d * self._tree_rows + tree_rows

    def observe_host(self, requests: int, drafted_requests: int, seconds: float) -> None:
        """A decode step of ``requests`` requests, ``drafted_requests`` of them drafted, whose host
        time (its wall time less its forward) was ``seconds``."""
        if seconds < 0 or requests <= 0:
            return
        x = (1.0, float(requests), 1.0 if drafted_requests > 0 else 0.0, float(drafted_requests))
        d = self.host_decay
        for i in range(4):
            row = self._host_xx[i]
            for j in range(4):
                row[j] = d * row[j] + x[i] * x[j]
            self._host_xy[i] = d * self._host_xy[i] + x[i] * seconds
        self._host_n = d * self._host_n + 1.0

    # -- files -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The model as measured so far (profile, scale folded in, tree cost), JSON-ready."""
        return {
            "tokens": list(self.tokens),
            "seconds": [s * self.scale for s in self.seconds],
            "tree_row_seconds": self.tree_row_seconds,
            "tree_step_seconds": self.tree_step_seconds,
            "draft_step_seconds": self.host_prices()[0],
            "draft_request_seconds": self.host_prices()[1],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "StepCost":
        return cls(tuple(raw["tokens"]), tuple(raw["seconds"]), tree_row_prior=float(raw.get("tree_row_seconds", 0.0)),
                   tree_step_seconds=float(raw.get("tree_step_seconds", 0.0)),
                   draft_step_prior=float(raw.get("draft_step_seconds", 0.0)),
                   draft_request_prior=float(raw.get("draft_request_seconds", 0.0)))

    @classmethod
    def linear(cls, base: float, per_token: float, tree_row: float = 0.0, up_to: int = 256) -> "StepCost":
        """``base + per_token * tokens`` (tests, projections)."""
        return cls((1, up_to), (base + per_token, base + per_token * up_to), tree_row_prior=tree_row)

    def describe(self, sizes: Sequence[int] = (1, 8, 32)) -> str:
        parts = ", ".join(f"{n} tok {1e3 * self.forward(n):.1f} ms" for n in sizes)
        return (f"{parts}; trees +{1e3 * self.tree_step_seconds:.2f} ms per step "
                f"+{1e3 * self.tree_row_seconds:.2f} ms per row; drafts +{1e3 * self.host_prices()[0]:.2f} ms "
                f"per step +{1e3 * self.host_prices()[1]:.2f} ms per drafted request")


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``a x = b`` by Gaussian elimination with partial pivoting (a small dense system); None if singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x
