"""A step's logits rows laid out in one compiled loop (for :func:`~.tree_batch.build_tree_batch`).

Laying out the logits rows of a step's trees among vLLM's flattened token rows takes numpy some
thirty calls, each a few microseconds on a host whose caches the forward has left cold; the loop
below makes the same three arrays in one call, whatever the number of trees.  Compiled by
:func:`load` on first use (numba, ``cache=True``; numba is not imported before, see
:func:`vllm_lookahead.core.ngram_table.load`), at start-up by :func:`compile_layout`.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def logits_layout(query_start_loc, num_scheduled, trees, sizes, nodes, roots_first):
    """``(logits_rows, sample_rows, tree_rows)`` of a step (:class:`~.tree_batch.TreeBatch`'s
    ``logits_indices``, ``sample_rows`` and ``tree_logit_rows``).

    ``query_start_loc``: each of the ``n`` requests' first token row (``n + 1`` entries);
    ``num_scheduled``: its rows; ``trees``: the batch indices of the requests with trees,
    ascending; ``sizes``: each tree's logit nodes; ``nodes``: those nodes (ids within the tree,
    the root 0 first), tree after tree.  A request without a tree has one logits row, its last
    token's; a tree's logit node ``j`` reads token row ``query_start_loc[i] + j``.
    ``roots_first``: every request's root (or last) row first, in batch order, then each tree's
    other rows; else each request's rows together."""
    n = len(num_scheduled)
    num_trees = len(trees)
    total = n + len(nodes) - num_trees
    logits_rows = np.empty(total, dtype=np.int64)
    sample_rows = np.empty(n, dtype=np.int64)
    tree_rows = np.empty(len(nodes), dtype=np.int64)
    if roots_first:
        for i in range(n):
            logits_rows[i] = query_start_loc[i] + num_scheduled[i] - 1
            sample_rows[i] = i
        at, out = 0, n
        for r in range(num_trees):
            i = trees[r]
            start = query_start_loc[i]
            logits_rows[i] = start + nodes[at]
            tree_rows[at] = i
            for j in range(at + 1, at + sizes[r]):
                logits_rows[out] = start + nodes[j]
                tree_rows[j] = out
                out += 1
            at += sizes[r]
        return logits_rows, sample_rows, tree_rows
    rows = np.ones(n, dtype=np.int64)
    for r in range(num_trees):
        rows[trees[r]] = sizes[r]
    row = 0
    for i in range(n):
        sample_rows[i] = row
        last = query_start_loc[i] + num_scheduled[i] - 1
        for j in range(rows[i]):
            logits_rows[row + j] = last
        row += rows[i]
    at = 0
    for r in range(num_trees):
        i = trees[r]
        base, start = sample_rows[i], query_start_loc[i]
        for j in range(sizes[r]):
            tree_rows[at + j] = base + j
            logits_rows[base + j] = start + nodes[at + j]
        at += sizes[r]
    return logits_rows, sample_rows, tree_rows


LOOPS = ("logits_layout",)
loops = SimpleNamespace()  # the compiled LOOPS, once load() ran


def load() -> SimpleNamespace:
    """The compiled loop (numba, ``cache=True``), made on first use."""
    if not vars(loops):
        from numba import njit

        module = globals()
        for name in LOOPS:
            module[name] = njit(cache=True)(module[name])
            setattr(loops, name, module[name])
    return loops


def compile_layout() -> None:
    """Compile the loop for the engine's arrays (vLLM's int32 row counts) before the first step."""
    starts = np.array([0, 1, 3], dtype=np.int32)
    one = np.ones(1, dtype=np.int64)
    for roots_first in (True, False):
        load().logits_layout(starts, np.diff(starts), one, 2 * one, np.arange(2, dtype=np.int64), roots_first)
