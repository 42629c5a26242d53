"""Per-request Lookahead Decoding state, free of any inference engine.

One decode step of Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057,
Alg. 2) for one request is:

1. :meth:`RequestLookahead.propose` -- build the token tree from the last
   accepted token: the *verification branch* (up to ``G`` pool n-grams keyed
   by that token) first, then the *lookahead branch* (the Jacobi window).
2. The engine runs the tree in one target forward and accepts the longest
   greedily-matching path (see :func:`~vllm_lookahead.core.verify.greedy_verify`).
3. :meth:`RequestLookahead.observe` -- advance the window with the argmax at
   its output nodes, feed the n-grams it produced to the pool and (optionally)
   learn the n-grams of the newly accepted output.

The engine glue only moves tokens and argmax arrays in and out; all decisions
live here.  Per-step cost is bounded by the tree size and the number of new
tokens -- never by the pool size or the sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .pool import NgramPool
from .tree import DraftTree, TreeBuilder
from .window import SHIFT_MODES, JacobiWindow


@dataclass(frozen=True)
class LookaheadParams:
    window_size: int = 7  # W: Jacobi window columns
    ngram_size: int = 5  # N: n-gram length (window has N - 1 levels)
    guess_set_size: int = 7  # G: candidates verified per step
    pool_from_prompt: bool = True  # seed the pool with the prompt's n-grams
    pool_from_output: bool = True  # also learn the n-grams of accepted output
    window_shift: str = "one"  # "one" | "accepted"
    merge_candidates: bool = False  # trie-merge candidates sharing a prefix
    max_pool_keys: int = 65536

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError("window_size must be >= 1")
        if self.ngram_size < 2:
            raise ValueError("ngram_size must be >= 2")
        if self.guess_set_size < 0:
            raise ValueError("guess_set_size must be >= 0")
        if self.window_shift not in SHIFT_MODES:
            raise ValueError(f"window_shift must be one of {SHIFT_MODES}")
        if self.max_pool_keys < 1:
            raise ValueError("max_pool_keys must be >= 1")

    @property
    def max_draft_tokens(self) -> int:
        """Upper bound of ``DraftTree.size - 1`` for these parameters."""
        levels = self.ngram_size - 1
        return (self.window_size * levels - 1) + self.guess_set_size * levels


@dataclass(frozen=True, eq=False)
class StepDraft:
    tree: DraftTree
    window_nodes: np.ndarray  # (W,) output node ids of the window
    num_candidates: int  # pool n-grams put in the verification branch


class RequestLookahead:
    """Jacobi window + n-gram pool of one request, plus plain-int counters."""

    def __init__(
        self,
        params: LookaheadParams,
        prompt_token_ids: Sequence[int],
        seed: int,
    ) -> None:
        self.params = params
        self.rng = np.random.default_rng(seed)
        self.window = JacobiWindow(
            params.window_size,
            params.ngram_size,
            prompt_token_ids,
            self.rng,
            shift=params.window_shift,
        )
        self.pool = NgramPool(params.ngram_size, params.guess_set_size, params.max_pool_keys)
        if params.pool_from_prompt:
            self.pool.add_sequence(prompt_token_ids)
        self.num_steps = 0
        self.num_drafted_tokens = 0  # draft tokens actually run by the target
        self.num_accepted_draft_tokens = 0
        self.num_emitted_tokens = 0  # accepted drafts + bonus tokens

    @property
    def mean_tokens_per_step(self) -> float:
        return self.num_emitted_tokens / self.num_steps if self.num_steps else 0.0

    def propose(self, root_token: int) -> StepDraft:
        """Build this step's tree below ``root_token`` (the last accepted token)."""
        params = self.params
        builder = TreeBuilder(root_token)
        candidates = self.pool.get(root_token, params.guess_set_size)
        for continuation in candidates:
            builder.add_chain(0, continuation, needs_logits=True, merge=params.merge_candidates)
        window_nodes = self.window.add_to_tree(builder, root=0)
        return StepDraft(
            tree=builder.build(),
            window_nodes=window_nodes,
            num_candidates=len(candidates),
        )

    def observe(
        self,
        draft: StepDraft,
        num_nodes_run: int,
        argmax: np.ndarray,
        accepted_tokens: Sequence[int],
        history: Sequence[int],
    ) -> None:
        """Learn from the target forward of ``draft`` (see module docstring).

        ``num_nodes_run``: nodes of ``draft.tree`` actually run (a prefix, >= 1);
        ``argmax``: (num_nodes_run,) argmax per run node, -1 without logits;
        ``accepted_tokens``: tokens appended this step (drafts + bonus, >= 1);
        ``history``: the full sequence after this step (only its tail is read).
        """
        if not 1 <= num_nodes_run <= draft.tree.size:
            raise ValueError(f"num_nodes_run {num_nodes_run} outside [1, {draft.tree.size}]")
        argmax = np.asarray(argmax, dtype=np.int64)
        if argmax.shape != (num_nodes_run,):
            raise ValueError(f"argmax has shape {argmax.shape}, expected ({num_nodes_run},)")
        num_new = len(accepted_tokens)
        if num_new < 1:
            raise ValueError("at least the bonus token is accepted each step")
        n = self.params.ngram_size
        tail_length = min(len(history), num_new + n - 1)
        tail = [int(t) for t in history[len(history) - tail_length :]]

        window_nodes = draft.window_nodes
        was_run = window_nodes < num_nodes_run
        outputs = np.full(window_nodes.shape, -1, dtype=np.int64)
        outputs[was_run] = argmax[window_nodes[was_run]]
        for ngram in self.window.update(outputs, num_new - 1, tail):
            self.pool.add(ngram)
        if self.params.pool_from_output:
            self.pool.add_sequence(tail, start=tail_length - num_new)

        self.num_steps += 1
        self.num_drafted_tokens += num_nodes_run - 1
        self.num_accepted_draft_tokens += num_new - 1
        self.num_emitted_tokens += num_new

    def reset(self, prompt_token_ids: Sequence[int]) -> None:
        """After preemption: re-initialise the window, keep the pool."""
        self.window.reset(prompt_token_ids)

    def learn(self, accepted_tokens: Sequence[int], history: Sequence[int]) -> None:
        """A step that carried no tree (first decode, fallback): the pool still learns."""
        if not self.params.pool_from_output or not accepted_tokens:
            return
        num_new = len(accepted_tokens)
        tail_length = min(len(history), num_new + self.params.ngram_size - 1)
        tail = [int(t) for t in history[len(history) - tail_length :]]
        self.pool.add_sequence(tail, start=tail_length - num_new)
