"""Exact speculative sampling over a token tree of one-hot drafts.

The multi-candidate rule of SpecInfer (Miao et al., 2024, arXiv:2305.09781,
Alg. 2 with deterministic drafts), which LADE's sampling mode also follows
(Fu et al., 2024, arXiv:2402.02057, Sec. 3.4).  With ``p_v`` the target
distribution at node ``v`` -- everything the engine applies when it samples
without speculation (temperature, top-k/top-p, penalties, masks) -- one step is::

    v = root
    loop:
        r = p_v
        for each child c of v with logits, in node order (fixed before p is seen):
            with probability r[c] / sum(r): emit token(c); v = c; continue the loop
            otherwise r[token(c)] = 0
        emit a sample of r / sum(r); stop        (v a leaf: r = p_v, the bonus token)

Each emitted token is distributed exactly as sampling from ``p`` would give it:
accepting ``x`` with probability ``r(x)/sum(r)`` or else sampling from ``r``
with ``x`` removed is, marginally, a sample of ``r / sum(r)`` (the one-hot
case of speculative sampling); by induction over the tried children, the
token emitted at ``v`` is a sample of ``p_v``.  Children with the same token
are allowed but useless: after the first is rejected the second has ``r = 0``.
A child without logits cannot be continued from and is not tried.

Greedy requests are the limit ``p_v`` = one-hot at the argmax; they use
:func:`~vllm_lookahead.core.verify.greedy_verify`, which also finds the
deepest match when several children carry the argmax token.

**Coupled to the sampler's noise** (:func:`coupled_walk`).  A sampler that draws a token as
``argmax(p / q)`` with ``q`` fresh noise per generated token (the Gumbel-max trick; vLLM's
``random_sample`` and its CPU ``fused_gumbel_argmax``) decides every position by its noise
alone.  Drawing, at each node the walk reaches, the noise the sampler would draw for that
output position -- from the same generator, one draw per emitted token, in order -- and
accepting the child whose token is the one so sampled, emits exactly the tokens sampling
without speculation emits with that generator: a seeded request reproduces vLLM's own
output.  A one-hot draft ``x`` is accepted with probability ``p(x)``, as under the rule
above, and the emitted tokens are autoregressive samples of ``p`` (each position's noise is
independent of the draft, which was fixed before it was drawn).  :func:`coupled_walks` takes
several requests' walks a position at a time, so that each position's sampling is one call over
the rows of every walk still going (on a GPU one read-back per position instead of one per
request and position).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace

import numpy as np

from .tree import DraftTree

Uniform = Callable[[], float]  # one U[0, 1) draw (the request's own generator if seeded)


def children_with_logits(tree: DraftTree) -> list[list[int]]:
    """Per node, its children that have logits, in node order."""
    children: list[list[int]] = [[] for _ in range(tree.size)]
    parents, logits = tree.parents, tree.logits
    for node in range(1, tree.size):
        if logits[node]:
            children[int(parents[node])].append(node)
    return children


def child_carrying(tree: DraftTree, node: int, token: int) -> int | None:
    """The first child of ``node`` (node order) with logits whose token is ``token``, or None:
    one vectorised pass over the tree, for the nodes a walk reaches only."""
    hits = np.flatnonzero((tree.parents == node) & (tree.tokens == token) & tree.logits)
    return int(hits[0]) if hits.size else None


def sample_from(r: np.ndarray, total: float, u: float) -> int:
    """Inverse-CDF sample of ``r / total`` with one uniform draw ``u``."""
    cdf = np.cumsum(r)
    index = int(np.searchsorted(cdf, u * total, side="right"))
    index = min(index, len(r) - 1)
    while r[index] <= 0 and index > 0:  # u * total landed on the end of the support (rounding)
        index -= 1
    return index


def tree_speculative_sample(
    tree: DraftTree, probs: Mapping[int, np.ndarray] | Callable[[int], np.ndarray], uniform: Uniform
) -> tuple[np.ndarray, int]:
    """``(path, final_token)``: accepted node ids from depth 1 down, then the token emitted
    after them (a residual sample, or the bonus token after a leaf).

    ``probs``: node -> target distribution over the vocabulary at that node (float64,
    sums to 1), asked only for the nodes the walk reaches; ``uniform``: U[0, 1) draws.
    """
    get = probs if callable(probs) else probs.__getitem__
    children = children_with_logits(tree)
    tokens = tree.tokens
    path: list[int] = []
    node = 0
    while True:
        r = np.array(get(node), dtype=np.float64, copy=True)
        total = float(r.sum())
        accepted = None
        for child in children[node]:
            x = int(tokens[child])
            mass = r[x]
            if mass <= 0.0:
                continue  # impossible under p (or a sibling with the same token was rejected)
            if uniform() * total < mass:
                accepted = child
                break
            r[x] = 0.0
            total -= mass
        if accepted is None:
            if total <= 0.0:  # every remaining token was rejected: cannot happen with sum(p) = 1
                raise ValueError(f"no probability mass left at node {node}")
            return np.asarray(path, dtype=np.int64), sample_from(r, total, uniform())
        path.append(accepted)
        node = accepted


def coupled_walk(tree: DraftTree, first_token: int, sample_after: Callable[[int], int]) -> tuple[np.ndarray, int]:
    """``(path, final_token)`` of the walk coupled to the sampler's noise (module docstring).

    ``first_token`` is the token sampled after the root (by the engine's own sampler);
    ``sample_after(node)`` samples the token after ``node`` with the next position's noise and
    is called once per accepted node, in order -- so the sampler's stream advances by exactly
    one draw per emitted token.  A child is accepted when its token is the sampled one and it
    has logits (the first such child in node order).
    """
    [(path, token)] = coupled_walks([(tree, first_token)], lambda reached: [sample_after(node) for _, node in reached])
    return path, token


def coupled_walks(
    walks: Sequence[tuple[DraftTree, int]],
    sample_after: Callable[[list[tuple[int, int]]], Sequence[int]],
    forest: Forest | None = None,
    drawn: np.ndarray | None = None,
) -> list[tuple[np.ndarray, int]]:
    """:func:`coupled_walk` of several trees (``(tree, first_token)`` each) taken a position at
    a time: each round, every walk still going moves to its child carrying its token, and the
    tokens after the nodes so reached come from one call ``sample_after([(walk, node), ...])``
    (walks in order).  Each walk's calls are those of :func:`coupled_walk`, in the same order, so
    a walk whose noise comes from its own generator advances it exactly as alone; the rounds
    let the walks of a step share each sampling call (one pass over their rows, one read-back),
    and a round's children are looked up for every walk at once (:meth:`Forest.first_children`).

    ``drawn`` (over ``forest``: the walks' trees end to end, in walk order; -1 where none): tokens
    sampled before the walks at some nodes, each from that node's distribution with a draw of its
    own; a walk reaching such a node takes its token instead of asking ``sample_after``.  Exact in
    distribution where the draws are independent and identically distributed -- a reached node's
    token is a fresh sample of its distribution whatever was drawn elsewhere -- so not for a walk
    whose draws must come from its own generator, one per emitted token in order (a seeded request).
    """
    forest = forest if forest is not None else Forest([tree for tree, _ in walks])
    tokens = np.fromiter((int(first) for _, first in walks), dtype=np.int64, count=len(walks))
    nodes = np.zeros(len(walks), dtype=np.int64)
    paths: list[list[int]] = [[] for _ in walks]
    going = np.arange(len(walks))
    while going.size:
        child = forest.first_children(going, nodes[going], tokens[going])
        found = child >= 0
        going, child = going[found], child[found]
        if not going.size:
            break
        nodes[going] = child
        for w, node in zip(going.tolist(), child.tolist()):
            paths[w].append(node)
        ask = going
        if drawn is not None:
            known = drawn[forest.offsets[going] + child]
            tokens[going] = known
            ask, child = going[known < 0], child[known < 0]
        if ask.size:
            tokens[ask] = sample_after(list(zip(ask.tolist(), child.tolist())))
    return [(np.asarray(path, dtype=np.int64), int(token)) for path, token in zip(paths, tokens.tolist())]


class Forest:
    """Several trees as one set of arrays: node ``i`` of tree ``w`` at ``offsets[w] + i``; a walk
    over them (:meth:`followed`, :meth:`first_children`) is one compiled loop (:func:`_loops`)."""

    def __init__(self, trees: Sequence[DraftTree]) -> None:
        self.sizes = np.fromiter((t.size for t in trees), dtype=np.int64, count=len(trees))
        self.offsets = np.cumsum(self.sizes) - self.sizes
        total = int(self.offsets[-1] + self.sizes[-1]) if trees else 0
        self.walk = np.empty(total, dtype=np.int64)  # each node's tree
        self.node = np.empty(total, dtype=np.int64)  # its id there
        _loops().index(self.sizes, self.walk, self.node)
        empty = np.zeros(0, dtype=np.int64)
        self.parents = np.concatenate([t.parents for t in trees]).astype(np.int64) if trees else empty
        self.tokens = np.concatenate([t.tokens for t in trees]) if trees else empty
        self.logits = np.concatenate([t.logits for t in trees]) if trees else empty.astype(bool)

    @property
    def size(self) -> int:
        return int(self.node.shape[0])

    def followed(self, next_token: np.ndarray) -> np.ndarray:
        """bool per node: reached from its root through nodes with logits, each carrying its
        parent's ``next_token`` (per node; for instance the target's argmax, a root's the token
        sampled after it) -- the nodes a walk reaches while the token drawn at every node it
        reaches is that node's ``next_token``.  Roots included."""
        reached = np.empty(self.size, dtype=bool)
        forest = (self.offsets, self.walk, self.node, self.parents, self.tokens, self.logits)
        _loops().followed(*forest, np.asarray(next_token, dtype=np.int64), reached)
        return reached

    def first_children(self, walk: np.ndarray, node: np.ndarray, token: np.ndarray) -> np.ndarray:
        """Per ``(walk, node, token)``: the first child of ``node`` with logits carrying ``token``
        in that walk's tree (:func:`child_carrying`), or -1 -- for all of a round's walks in one
        call, each a scan of its tree's nodes after ``node`` (a child comes after its parent)."""
        out = np.empty(len(walk), dtype=np.int64)
        _loops().children(
            self.offsets,
            self.sizes,
            self.parents,
            self.tokens,
            self.logits,
            np.asarray(walk, dtype=np.int64),
            np.asarray(node, dtype=np.int64),
            np.asarray(token, dtype=np.int64),
            out,
        )
        return out


def _index_loop(sizes, walk, node):
    """Each node's tree and its id there, the trees of ``sizes`` end to end."""
    k = 0
    for w in range(len(sizes)):
        for i in range(sizes[w]):
            walk[k] = w
            node[k] = i
            k += 1


def _followed_loop(offsets, walk, node, parents, tokens, logits, next_token, reached):
    """:meth:`Forest.followed` node by node: a parent comes before its children."""
    for k in range(len(node)):
        if node[k] == 0:
            reached[k] = True
        else:
            p = offsets[walk[k]] + parents[k]
            reached[k] = logits[k] and reached[p] and tokens[k] == next_token[p]


def _children_loop(offsets, sizes, parents, tokens, logits, walk, node, token, out):
    """:meth:`Forest.first_children`."""
    for q in range(len(walk)):
        base, parent = offsets[walk[q]], node[q]
        out[q] = -1
        for i in range(parent + 1, sizes[walk[q]]):
            k = base + i
            if parents[k] == parent and logits[k] and tokens[k] == token[q]:
                out[q] = i
                break


@functools.lru_cache(maxsize=1)
def _loops() -> SimpleNamespace:
    """The forest's compiled loops (numba, ``cache=True``), made on first use: see
    :func:`.ngram_table.load`; :func:`compile_walks` makes them at start-up."""
    from numba import njit

    return SimpleNamespace(
        index=njit(cache=True)(_index_loop),
        followed=njit(cache=True)(_followed_loop),
        children=njit(cache=True)(_children_loop),
    )


def compile_walks() -> None:
    """Compile the forest's loops before the first sampled step that walks a tree."""
    forest = Forest([DraftTree.chain([0, 1, 2])])
    forest.followed(np.array([1, 2, 3], dtype=np.int64))
    forest.first_children(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64))
