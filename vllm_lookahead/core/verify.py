"""Greedy verification of a draft tree.

Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057, Sec. 3.3 and Alg. 2)
verifies the n-gram candidates in the same forward pass that runs the Jacobi
window.  Under greedy decoding a draft token is accepted iff it equals the
target model's argmax at its parent and the parent itself was accepted; the
longest accepted root-to-node path wins and the argmax at its end is a free
"bonus" token.

Off-by-one note: a candidate n-gram keyed by the root contributes ``N - 1``
draft tokens, so a fully matched candidate yields ``N - 1`` accepted drafts
plus the bonus = ``N`` new tokens per step (LADE's reference code counts the
key token as part of the n-gram, which is easy to misread as ``N - 1``).
"""

from __future__ import annotations

import numpy as np

from .tree import DraftTree


def greedy_verify(tree: DraftTree, argmax: np.ndarray) -> tuple[np.ndarray, int]:
    """Longest greedily-accepted path of ``tree``.

    ``argmax``: int64 (n,) target argmax token at each node, -1 where the node
    has no logits.  A node ``i > 0`` is valid iff ``tree.logits[i]``, its parent
    is valid (the root is valid) and ``tree.tokens[i] == argmax[parents[i]]``.
    The valid node with the greatest depth (ties: smallest index) is chosen.

    Returns ``(path, bonus)``: ``path`` = int64 node ids from depth 1 down to
    the chosen node (empty if none is valid), ``bonus`` = argmax at that node
    (``argmax[0]`` when the path is empty).  The tokens appended this step are
    ``tree.tokens[path]`` followed by ``bonus``.
    """
    argmax = np.asarray(argmax, dtype=np.int64)
    n = tree.size
    if argmax.shape != (n,):
        raise ValueError(f"argmax has shape {argmax.shape}, expected ({n},)")
    if tree.first_branch_node == n:  # a chain below the root: the accepted path is its matching prefix
        # (a few nodes: a walk over lists costs less than the numpy passes)
        tokens, logits, said = tree.token_list, tree.logits.tolist(), argmax.tolist()
        k = 0
        while k < n - 1 and logits[k + 1] and tokens[k + 1] == said[k]:
            k += 1
        return np.arange(1, k + 1, dtype=np.int64), said[k]
    parents = tree.parents
    # Local (non-recursive) condition, vectorised; validity then propagates in
    # topological order in one pass.
    matches_parent = np.zeros(n, dtype=bool)
    if n > 1:
        matches_parent[1:] = tree.logits[1:] & (tree.tokens[1:] == argmax[parents[1:]])
    valid = np.zeros(n, dtype=bool)
    valid[0] = True
    for i in np.flatnonzero(matches_parent).tolist():
        valid[i] = valid[parents[i]]
    depths = np.where(valid, tree.depths, -1)
    best = int(np.argmax(depths))  # first occurrence = smallest index among ties
    path: list[int] = []
    node = best
    while node > 0:
        path.append(node)
        node = int(parents[node])
    path.reverse()
    return np.asarray(path, dtype=np.int64), int(argmax[best])
