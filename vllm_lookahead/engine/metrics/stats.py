"""Lookahead's own counters (per worker), logged periodically.

vLLM's scheduler already turns every step's (drafted, accepted) pair into the
``vllm:spec_decode_*`` Prometheus counters (drafted = tree size, accepted =
verified path length), because the runner patches return accepted tokens the
way vLLM's rejection sampler would.  These counters add what only the plugin
knows: how the draft tree was made up (candidates, whether the Jacobi window ran),
where the accepted tokens came from (:mod:`vllm_lookahead.core.source`: prompt,
output or window n-grams) and how long proposing and verification took.

:func:`vllm_lookahead.engine.hooks.step_context.live_stats` finds the counters of this process's runner; the benchmark,
whose engine runs in-process, reads them around each run (:meth:`LookaheadStats.snapshot`).

:class:`StepReport` is what one step tells the scheduler (the worker may live in another
process: it rides on vLLM's ``ModelRunnerOutput``, in a field the patch table declares): per verified tree its
depth, size,
candidates, whether the window ran and the sources of its accepted path; per request left
without a draft, why; propose/verify time and the pools' size.  The scheduler side
(:mod:`.spec_metrics`) cuts accepted tokens to what the request really emitted and passes the
result on to the API server's stat logger (:mod:`.prometheus`).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from vllm_lookahead.core.source import SOURCE_NAMES, Source

_SOURCE_NAME = {int(Source[name.upper()]): name for name in SOURCE_NAMES}  # a node's Source -> its counter

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format


@dataclass
class LookaheadStats:
    steps: int = 0  # target forwards that carried a tree
    draft_tokens: int = 0  # tree nodes sent (root excluded)
    candidate_ngrams: int = 0  # pool n-grams put in the verification branch
    accepted_tokens: int = 0  # accepted draft tokens (bonus excluded)
    window_steps: int = 0  # verified trees that carried the lookahead branch (Jacobi window)
    window_tokens: int = 0  # draft nodes of those lookahead branches
    accepted_by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES, 0))
    verify_seconds: float = 0.0  # plugin CPU time in verification + KV compaction
    propose_seconds: float = 0.0
    drafts_proposed: int = 0  # trees handed to vLLM
    draft_digest: int = 0  # CRC-32 of every tree proposed (tokens and parents), in order
    foreign_drafts: int = 0  # scheduled drafts that were not this worker's own tree (run as chains)
    log_interval_s: float = 30.0
    _last_log: float = field(default_factory=time.monotonic)

    def on_propose(self, draft, sent: int) -> None:
        """A tree proposed, of which the first ``sent`` draft tokens went to vLLM."""
        self.candidate_ngrams += int(draft.num_candidates)
        self.drafts_proposed += 1
        tree = draft.tree
        self.draft_digest = zlib.crc32(
            tree.parents[: sent + 1].tobytes(), zlib.crc32(tree.tokens[: sent + 1].tobytes(), self.draft_digest)
        )

    def add_time(self, propose_seconds: float, verify_seconds: float) -> None:
        """A step's plugin time (from its :class:`StepReport`, where the runner counts it)."""
        self.propose_seconds += propose_seconds
        self.verify_seconds += verify_seconds

    def on_verified(self, num_drafts: int, num_accepted: int, draft=None, path_sources: Sequence[int] = ()) -> None:
        """One tree verified: ``num_drafts`` nodes run (root excluded), ``num_accepted`` accepted.
        ``draft`` (a :class:`~vllm_lookahead.core.StepDraft`; None: a chain the plugin did not
        draft) and ``path_sources`` (the :class:`~vllm_lookahead.core.Source` of each accepted
        node) attribute the accepted tokens to their sources."""
        self.steps += 1
        self.draft_tokens += num_drafts
        self.accepted_tokens += num_accepted
        if draft is None:
            return
        start = draft.window_start
        if start is not None and start <= num_drafts:  # nodes 0..num_drafts ran
            self.window_steps += 1
            self.window_tokens += num_drafts + 1 - start
        for source in path_sources:
            name = _SOURCE_NAME.get(source)
            if name is not None:
                self.accepted_by_source[name] += 1

    @property
    def mean_accepted_per_step(self) -> float:
        """Tokens produced per tree-carrying forward: accepted drafts + 1 bonus."""
        return 1.0 + self.accepted_tokens / self.steps if self.steps else 0.0

    def snapshot(self) -> dict[str, float]:
        """Flat counters (``lookahead_<name>``); differences of two snapshots are a run's."""
        out = {
            "lookahead_steps": float(self.steps),
            "lookahead_draft_tokens": float(self.draft_tokens),
            "lookahead_candidates": float(self.candidate_ngrams),
            "lookahead_accepted_tokens": float(self.accepted_tokens),
            "lookahead_window_steps": float(self.window_steps),
            "lookahead_window_tokens": float(self.window_tokens),
            "lookahead_propose_s": self.propose_seconds,
            "lookahead_verify_s": self.verify_seconds,
        }
        for name, n in self.accepted_by_source.items():
            out[f"lookahead_accepted_{name}"] = float(n)
        return out

    def maybe_log(self) -> bool:
        """Log the running totals if ``log_interval_s`` has passed; whether it did."""
        now = time.monotonic()
        if now - self._last_log < self.log_interval_s or not self.steps:
            return False
        self._last_log = now
        accepted = max(1, self.accepted_tokens)
        logger.info(
            "lookahead: %d tree steps, %.2f tokens/step, %.1f draft tokens/step, "
            "%.1f candidates/step, window on %.0f%% of steps, accepted from prompt/output/window "
            "%s, verify %.2f ms/step, propose %.2f ms/step",
            self.steps,
            self.mean_accepted_per_step,
            self.draft_tokens / self.steps,
            self.candidate_ngrams / self.steps,
            100.0 * self.window_steps / self.steps,
            "/".join(f"{100.0 * self.accepted_by_source[n] / accepted:.0f}%" for n in SOURCE_NAMES),
            1e3 * self.verify_seconds / self.steps,
            1e3 * self.propose_seconds / self.steps,
        )
        return True


@dataclass
class StepReport:
    """One step's lookahead facts for the scheduler (see the module docstring)."""

    # req_id -> (depth, nodes, candidates, window ran 0/1, sources of the accepted path, in path order)
    trees: dict[str, tuple[int, int, int, int, list[int]]] = field(default_factory=dict)
    undrafted: dict[str, str] = field(default_factory=dict)  # req_id -> reason its next step has no draft
    propose_seconds: float = 0.0
    verify_seconds: float = 0.0
    pool_ngrams: int = -1  # n-grams held by the live requests' pools (+ the shared pool); -1: not measured
    request_states: int = -1  # requests the worker holds lookahead state for; -1: not measured

    def on_verified(self, req_id: str, outcome) -> None:
        """A verified tree (:class:`~vllm_lookahead.engine.step.verification.StepOutcome`)."""
        draft = outcome.draft
        n = int(outcome.num_nodes)
        if draft is None:  # a foreign chain: depth = nodes
            self.trees[req_id] = (n - 1, n - 1, 0, 0, [0] * outcome.num_accepted)
            return
        tree = draft.tree
        depth = n - 1 if tree.first_branch_node >= n else int(tree.depths[:n].max())  # a chain: n - 1
        start = draft.window_start
        window = int(start is not None and start < n)
        self.trees[req_id] = (depth, n - 1, int(draft.num_candidates), window, list(outcome.path_sources))

    def payload(self) -> dict:
        """Plain Python containers (pickled to the scheduler's process with vLLM's output)."""
        return {
            "trees": self.trees,
            "undrafted": self.undrafted,
            "propose_seconds": self.propose_seconds,
            "verify_seconds": self.verify_seconds,
            "pool_ngrams": self.pool_ngrams,
            "request_states": self.request_states,
        }
