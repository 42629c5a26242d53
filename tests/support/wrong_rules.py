"""Deliberately wrong tree-acceptance rules: the statistical tests must reject each of them.

Same interface as :func:`vllm_lookahead.core.sampling.tree_speculative_sample`
(``rule(tree, probs, uniform) -> (path, last_token)`` with ``probs(node)`` the target
distribution at a node), so the tests can swap one in -- in a pure simulation or in
an in-process engine -- and check that the chi-square harness notices.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vllm_lookahead.core.sampling import children_with_logits, sample_from
from vllm_lookahead.core.tree import DraftTree

Probs = Callable[[int], np.ndarray]
Uniform = Callable[[], float]


def _walk(tree: DraftTree, probs: Probs, uniform: Uniform, pick) -> tuple[np.ndarray, int]:
    children = children_with_logits(tree)
    path: list[int] = []
    node = 0
    while True:
        p = np.asarray(probs(node), dtype=np.float64)
        chosen, residual = pick(tree, children[node], p, uniform)
        if chosen is None:
            return np.asarray(path, dtype=np.int64), sample_from(residual, float(residual.sum()), uniform())
        path.append(chosen)
        node = chosen


def accept_greedily(tree: DraftTree, probs: Probs, uniform: Uniform) -> tuple[np.ndarray, int]:
    """Wrong: accept a child iff its token is the argmax; otherwise sample from p."""

    def pick(tree, children, p, uniform):
        best = int(np.argmax(p))
        return next((c for c in children if int(tree.tokens[c]) == best), None), p

    return _walk(tree, probs, uniform, pick)


def accept_within_top_k(tree: DraftTree, probs: Probs, uniform: Uniform, k: int = 3) -> tuple[np.ndarray, int]:
    """Wrong: accept the first child whose token is among the k most likely; otherwise sample from p."""

    def pick(tree, children, p, uniform):
        top = set(np.argsort(-p)[:k].tolist())
        return next((c for c in children if int(tree.tokens[c]) in top and p[int(tree.tokens[c])] > 0), None), p

    return _walk(tree, probs, uniform, pick)


def forget_to_zero_rejected_siblings(tree: DraftTree, probs: Probs, uniform: Uniform) -> tuple[np.ndarray, int]:
    """Wrong: every child is tried against the full p (rejected siblings keep their mass), and the
    residual drops only the last rejected token."""

    def pick(tree, children, p, uniform):
        last = None
        for c in children:
            x = int(tree.tokens[c])
            if uniform() < p[x]:
                return c, p
            last = x
        r = p.copy()
        if last is not None:
            r[last] = 0.0
        return None, r

    return _walk(tree, probs, uniform, pick)


WRONG_RULES = {
    "accept greedily": accept_greedily,
    "accept within the top-k": accept_within_top_k,
    "forget to zero rejected siblings": forget_to_zero_rejected_siblings,
}
