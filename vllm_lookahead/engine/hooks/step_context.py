"""Which lookahead state this worker process runs, for code that vLLM calls without a model runner.

Most of the patch table's hooks are model-runner methods and reach the runner's lookahead state
through the runner (:meth:`RunnerLookahead.of <vllm_lookahead.engine.runner.RunnerLookahead.of>`).
Two are not: the attention backend's ``forward`` and vLLM's ``apply_grammar_bitmask`` receive no
runner, yet need the trees of the step being executed; and the counters are read from outside
the engine (the benchmark, ``LLM.collective_rpc`` for tensor-parallel ranks: :func:`live_stats`,
:func:`rank_drafts`).  vLLM runs one model
runner per worker process, so there is one such state per process: it registers itself here when
it is created (:meth:`StepContext.register`, called from ``RunnerLookahead.of``) and those readers
ask :data:`STEP_CONTEXT`.

This object keeps no per-step state of its own: the step's
:class:`~vllm_lookahead.engine.step.tree_batch.TreeBatch` stays
the runner state's ``batch`` (set by ``_prepare_inputs``, taken by ``_sample``, dropped when the
next step starts), which :meth:`StepContext.tree_batch` reads -- one owner of per-step state
(``docs/design.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vllm_lookahead.engine.metrics.stats import LookaheadStats
    from vllm_lookahead.engine.step.tree_batch import TreeBatch


class WorkerLookahead(Protocol):
    """What readers here use of the worker's lookahead state (``RunnerLookahead``)."""

    batch: TreeBatch | None
    stats: LookaheadStats


class StepContext:
    """The lookahead state of this worker process, and what hooks outside the runner read of it."""

    def __init__(self) -> None:
        self._owner: WorkerLookahead | None = None

    def register(self, owner: WorkerLookahead) -> None:
        """``owner`` is this process's lookahead state from now on (a newer engine's replaces
        an older one's: one model runner per worker process)."""
        self._owner = owner

    def clear(self) -> None:
        """No lookahead state in this process (tests that build one by hand)."""
        self._owner = None

    @property
    def owner(self) -> WorkerLookahead | None:
        return self._owner

    def tree_batch(self) -> TreeBatch | None:
        """The trees of the step this process is executing (from ``_prepare_inputs`` to
        ``_sample``); None outside a lookahead tree step."""
        return self._owner.batch if self._owner is not None else None

    def stats(self) -> LookaheadStats | None:
        """The worker's counters (None before its first step, or without lookahead)."""
        return self._owner.stats if self._owner is not None else None


STEP_CONTEXT = StepContext()  # one per process: vLLM runs one model runner per worker process


def rank_drafts(worker=None) -> dict[str, int]:
    """What this worker process drafted (for ``LLM.collective_rpc``: every tensor-parallel rank
    must have built the very same trees, and run only its own)."""
    stats = live_stats()
    if stats is None:
        return {}
    return {
        "drafts": stats.drafts_proposed,
        "digest": stats.draft_digest,
        "foreign": stats.foreign_drafts,
        "steps": stats.steps,
        "window_steps": stats.window_steps,
        "accepted": stats.accepted_tokens,
    }


def live_stats() -> LookaheadStats | None:
    """The counters of this process's lookahead runner (None before the first step, or without lookahead)."""
    return STEP_CONTEXT.stats()


__all__ = ["STEP_CONTEXT", "StepContext", "WorkerLookahead", "live_stats", "rank_drafts"]
