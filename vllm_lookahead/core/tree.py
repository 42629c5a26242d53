"""Token trees: the draft of one lookahead decode step.

Lookahead Decoding (Fu et al., 2024, "Break the Sequential Dependency of LLM
Inference Using Lookahead Decoding", arXiv:2402.02057, Sec. 3.3) runs the
*lookahead branch* (the 2D Jacobi window) and the *verification branch* (n-gram
candidates from the pool) in a single forward pass of the target model.  Both
branches hang off the last accepted token, so together they form a token tree:
every node attends to itself and its ancestors only (the special attention mask
of Fig. 4 in the paper) and is placed at RoPE position ``root + depth``.

A :class:`DraftTree` stores that tree as flat arrays in topological order
(parent index < child index).  Any prefix of the node list is therefore again a
valid tree, which matters because vLLM's scheduler may truncate a request's
draft token list to a prefix.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace

import numpy as np


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


_ROOT_PARENTS = _readonly(np.array([-1], dtype=np.int32))
_ROOT_DEPTHS = _readonly(np.array([0], dtype=np.int32))
_ROOT_LOGITS = _readonly(np.array([True]))


def _words_loop(parents, words):
    """Each node's ancestors and itself as bits of ``words`` (uint32 rows, zeros on entry): its
    parent's row (an earlier node: parents come first) and its own bit."""
    for i in range(len(parents)):
        p = parents[i]
        if p >= 0:
            for w in range(words.shape[1]):
                words[i, w] = words[p, w]
        words[i, i >> 5] |= np.uint32(1) << np.uint32(i & 31)


def _chains_loop(data, root, merge, room, out_tokens, out_parents, out_depths, out_logits, out_sources):
    """Chains below node 0, ``root``, as :meth:`TreeBuilder.add_chain` adds them one by
    one, every node with logits.  ``data``: the number of chains ``C``, their lengths, all their
    tokens, then all their tokens' sources.  With ``merge`` a chain goes down the first child of
    each node that carries its next token (a trie; the child keeps its source) before it adds
    nodes.  Every chain after the first is added only while the tree's draft nodes plus its
    tokens stay within ``room`` (the first that does not fit ends the tree).  The nodes go to
    ``out_*`` after the root's; returns the tree's size and the chains added."""
    out_tokens[0], out_parents[0], out_depths[0], out_logits[0], out_sources[0] = root, -1, 0, True, 0
    count = data[0]
    total = 0
    for c in range(count):
        total += data[1 + c]
    tokens_at = 1 + count
    sources_at = tokens_at + total
    size = 1
    used = 0
    start = 0
    for c in range(count):
        end = start + data[1 + c]
        if c > 0 and size - 1 + end - start > room:
            break
        current = 0
        k = start
        while merge and k < end:
            child = -1
            token = data[tokens_at + k]
            for node in range(1, size):  # the first child of current carrying the token
                if out_parents[node] == current and out_tokens[node] == token:
                    child = node
                    break
            if child < 0:
                break
            out_logits[child] = True
            current = child
            k += 1
        for j in range(k, end):
            out_tokens[size] = data[tokens_at + j]
            out_parents[size] = current
            out_depths[size] = out_depths[current] + 1
            out_logits[size] = True
            out_sources[size] = data[sources_at + j]
            current = size
            size += 1
        used += 1
        start = end
    return size, used


@functools.lru_cache(maxsize=1)
def _loops() -> SimpleNamespace:
    """The compiled loops (numba, ``cache=True``), made on first use: see :func:`.ngram_table.load`."""
    from numba import njit

    return SimpleNamespace(words=njit(cache=True)(_words_loop), chains=njit(cache=True)(_chains_loop))


def compile_tree() -> None:
    """Compile the trees' loops before the first step: :meth:`DraftTree.ancestor_words`' for the
    trees' arrays, :func:`chains_tree`'s for their building."""
    DraftTree.chain([0, 1]).ancestor_words()
    chains_tree(0, [(1,), (2,)], [[1], [2]], merge=True, room=2)


def chains_tree(
    root: int,
    chains: Sequence[Sequence[int]],
    sources: Sequence[Sequence[int]],
    merge: bool,
    room: int,
    spare: int = 0,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int, int]:
    """The tree of ``chains`` (their tokens' ``sources``) below ``root`` as adding them one by one
    to a :class:`TreeBuilder` gives -- ``add_chain(0, chain, needs_logits=True, merge=merge,
    sources=...)`` -- in one compiled call (:func:`_chains_loop`): every chain after the first
    only while the draft nodes stay within ``room``, the first one that does not fit ending the
    tree.  Returns its arrays -- tokens (int64), parents, depths (int32), logits (bool), sources
    (int8) -- with room for ``spare`` nodes after its own (the window's branch), its size and the
    chains added.  (Adding a tree's chains node by node in Python costs ~1-2 us a node on a
    server's core; the compiled call costs a few us a tree.)"""
    data = [len(chains)]
    data += map(len, chains)
    for chain in chains:
        data += chain
    tokens = len(data) - 1 - len(chains)
    for chain in sources:
        data += chain
    if len(data) != 1 + len(chains) + 2 * tokens:
        raise ValueError(f"{len(data) - 1 - len(chains) - tokens} sources for {tokens} tokens")
    n = 1 + tokens + spare
    arrays = (
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=bool),
        np.empty(n, dtype=np.int8),
    )
    size, used = _loops().chains(np.array(data, dtype=np.int64), root, merge, room, *arrays)
    return arrays, size, used


@functools.lru_cache(maxsize=256)
def _chain_layout(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A chain's parents, depths, logits and logit rows (read-only, shared by every chain of ``n`` nodes)."""
    return (
        _readonly(np.arange(-1, n - 1, dtype=np.int32)),
        _readonly(np.arange(n, dtype=np.int32)),
        _readonly(np.ones(n, dtype=bool)),
        _readonly(np.arange(n, dtype=np.int64)),
    )


# not frozen: made per request and step, where a frozen dataclass's init costs 2-3x (design.md, "A step's records")
@dataclass(eq=False)
class DraftTree:
    """One decode step's draft for one request, as a token tree.

    Node 0 is the root = the last accepted token (already known, not a draft).
    Nodes are in topological order (parent index < child index), so any prefix
    of nodes is again a valid tree (vLLM's scheduler may truncate the draft list
    to a prefix).
    """

    tokens: np.ndarray  # int64 (n,)
    parents: np.ndarray  # int32 (n,), parents[0] == -1, 0 <= parents[i] < i
    depths: np.ndarray  # int32 (n,), depths[i] == depths[parents[i]] + 1
    logits: np.ndarray  # bool (n,), nodes that need logits; logits[0] is True

    @classmethod
    def root_only(cls, root_token: int) -> DraftTree:
        """The tree of a step that drafts nothing: its root alone (what :class:`TreeBuilder`
        builds without nodes, made without one)."""
        tree = cls(_readonly(np.array([int(root_token)], dtype=np.int64)), _ROOT_PARENTS, _ROOT_DEPTHS, _ROOT_LOGITS)
        tree.__dict__["size"] = 1
        return tree

    @cached_property
    def size(self) -> int:
        """Nodes, root included (read many times a step: kept after the first read)."""
        return int(self.tokens.shape[0])

    @cached_property
    def token_list(self) -> list[int]:
        """:attr:`tokens` as Python ints, made once per tree: a step reads a tree's tokens several
        times (its draft, the scheduled prefix, the greedy match, the emitted tokens, the lead's),
        each a few elements, where lists cost less than numpy's calls."""
        return self.tokens.tolist()

    @property
    def draft_tokens(self) -> list[int]:
        """The draft tokens (every node but the root) as Python ints."""
        return self.token_list[1:]

    def prefix(self, n: int) -> DraftTree:
        """The tree made of the first ``n`` nodes (1 <= n <= size)."""
        if not 1 <= n <= self.size:
            raise ValueError(f"prefix length {n} outside [1, {self.size}]")
        if n == self.size:
            return self
        tree = DraftTree(
            tokens=self.tokens[:n],
            parents=self.parents[:n],
            depths=self.depths[:n],
            logits=self.logits[:n],
        )
        tree.__dict__["size"] = n
        return tree

    @cached_property
    def first_branch_node(self) -> int:
        """The first node whose parent is not the node before it (``size`` for a chain below the
        root): the nodes before it see exactly the causal prefix.  Worked out once per tree (the
        step's layout and its verification both ask)."""
        for node, parent in enumerate(self.parents.tolist()):  # a few dozen nodes: no numpy pass
            if parent != node - 1:
                return node
        return self.size

    def ancestor_mask(self) -> np.ndarray:
        """bool (n, n): ``m[i, j]`` iff ``j == i`` or ``j`` is an ancestor of ``i``
        (:meth:`_ancestor_rows`, unpacked at once)."""
        n = self.size
        width = -(-n // 8)
        packed = np.frombuffer(b"".join(row.to_bytes(width, "little") for row in self._ancestor_rows()), dtype=np.uint8)
        return np.unpackbits(packed.reshape(n, width), axis=1, count=n, bitorder="little").astype(bool)

    def ancestor_words(self) -> np.ndarray:
        """int32 (n, ceil(n / 32)): :meth:`ancestor_mask` packed 32 nodes to a word -- bit ``j % 32``
        of word ``j // 32`` of row ``i`` set iff ``m[i, j]`` -- as the Triton kernel reads it
        (:func:`~vllm_lookahead.kernels.tree_attention.ancestor_bits`), made without the mask in
        one compiled loop (:func:`_words_loop`: its parent's words and its own bit)."""
        n = self.size
        words = np.zeros((n, -(-n // 32)), dtype=np.uint32)
        _loops().words(self.parents, words)
        return words.view("<i4")

    def _ancestor_rows(self) -> list[int]:
        """Each node's ancestors and itself as the bits of one Python int: its parent's and its own
        bit (a few us for a tree of a hundred nodes, where a numpy row copy per node costs ~1 us)."""
        rows = [1]
        for i, parent in enumerate(self.parents[1:].tolist(), start=1):
            rows.append(rows[parent] | 1 << i)
        return rows

    def logit_rows(self) -> np.ndarray:
        """int64 indices of the nodes whose logits are computed, ascending (a chain's: known)."""
        rows = self.__dict__.get("_logit_rows")
        return np.flatnonzero(self.logits) if rows is None else rows

    @staticmethod
    def chain(tokens: Sequence[int]) -> DraftTree:
        """A linear chain; ``tokens[0]`` is the root; every node has logits."""
        n = len(tokens)
        if n < 1:
            raise ValueError("a chain needs at least the root token")
        parents, depths, logits, rows = _chain_layout(n)
        tree = DraftTree(_readonly(np.array(tokens, dtype=np.int64)), parents, depths, logits)
        tree.__dict__["size"] = n  # the cached properties, known: no node branches
        tree.__dict__["first_branch_node"] = n
        tree.__dict__["_logit_rows"] = rows  # every node
        return tree

    def validate(self) -> None:
        """Raise ``ValueError`` if the arrays do not describe a valid tree."""
        n = self.size
        if n < 1:
            raise ValueError("a tree has at least the root node")
        for name, array in (
            ("tokens", self.tokens),
            ("parents", self.parents),
            ("depths", self.depths),
            ("logits", self.logits),
        ):
            if array.ndim != 1 or array.shape[0] != n:
                raise ValueError(f"{name} has shape {array.shape}, expected ({n},)")
        if self.logits.dtype != np.bool_:
            raise ValueError("logits must be a bool array")
        if self.parents[0] != -1 or self.depths[0] != 0 or not self.logits[0]:
            raise ValueError("node 0 must be the root (parent -1, depth 0, logits)")
        if n > 1:
            parents = self.parents[1:].astype(np.int64)
            if np.any(parents < 0) or np.any(parents >= np.arange(1, n)):
                raise ValueError("parents must satisfy 0 <= parents[i] < i")
            if np.any(self.depths[1:] != self.depths[parents] + 1):
                raise ValueError("depths[i] must equal depths[parents[i]] + 1")


class TreeBuilder:
    """Incrementally builds a :class:`DraftTree` (parents are added before children)."""

    def __init__(self, root_token: int) -> None:
        self.root_token = int(root_token)
        self._tokens: list[int] = [self.root_token]
        self._parents: list[int] = [-1]
        self._depths: list[int] = [0]
        self._logits: list[bool] = [True]
        self._sources: list[int] = [0]  # Source per node (0 = the root)
        # (parent, token) -> first child with that token, for trie merging: of the nodes before
        # _indexed (a block, add_block, is indexed when a later add needs it)
        self._child_by_token: dict[tuple[int, int], int] = {}
        self._indexed = 1

    @property
    def size(self) -> int:
        return len(self._tokens)

    def add(self, parent: int, token: int, needs_logits: bool, source: int = 0) -> int:
        """Append a node under ``parent`` and return its id (``source``: a :class:`~.source.Source`)."""
        if not 0 <= parent < len(self._tokens):
            raise ValueError(f"parent {parent} does not exist")
        self._index()
        node = len(self._tokens)
        token = int(token)
        self._tokens.append(token)
        self._parents.append(parent)
        self._depths.append(self._depths[parent] + 1)
        self._logits.append(bool(needs_logits))
        self._sources.append(int(source))
        self._child_by_token.setdefault((parent, token), node)
        self._indexed = node + 1
        return node

    def add_nodes(
        self, parents: Sequence[int], tokens: Sequence[int], needs_logits: bool, source: int = 0
    ) -> list[int]:
        """:meth:`add` of each ``(parents[k], tokens[k])`` in order (every parent already in the
        tree), appended in one go; their node ids."""
        self._index()
        start = len(self._tokens)
        parents, tokens = [int(p) for p in parents], [int(t) for t in tokens]
        if len(parents) != len(tokens):
            raise ValueError(f"{len(parents)} parents for {len(tokens)} tokens")
        if parents and not (0 <= min(parents) and max(parents) < start):
            raise ValueError(f"parents {parents} do not all exist")
        nodes = range(start, start + len(tokens))
        depths = self._depths
        depths.extend([depths[p] + 1 for p in parents])
        self._tokens.extend(tokens)
        self._parents.extend(parents)
        self._logits.extend([bool(needs_logits)] * len(tokens))
        self._sources.extend([int(source)] * len(tokens))
        setdefault = self._child_by_token.setdefault
        for key, node in zip(zip(parents, tokens), nodes):
            setdefault(key, node)
        self._indexed = len(self._tokens)
        return list(nodes)

    def add_block(
        self,
        tokens: Sequence[int],
        parents: Sequence[int],
        depths: Sequence[int],
        needs_logits: Sequence[bool],
        source: int = 0,
    ) -> None:
        """Append ``len(tokens)`` nodes laid out by their caller (the Jacobi window's branch,
        :meth:`~.window.JacobiWindow.add_to_tree`): node ``k`` (id ``size + k``) below node
        ``parents[k]`` (an existing node or an earlier one of the block) at ``depths[k]``, its
        parent's depth plus one -- as many :meth:`add` calls would, in one go."""
        if not len(tokens) == len(parents) == len(depths) == len(needs_logits):
            raise ValueError("a block's tokens, parents, depths and logits differ in length")
        self._tokens.extend(tokens)
        self._parents.extend(parents)
        self._depths.extend(depths)
        self._logits.extend(needs_logits)
        self._sources.extend([int(source)] * len(tokens))

    def depth(self, node: int) -> int:
        return self._depths[node]

    def _index(self) -> None:
        """:attr:`_child_by_token` of the nodes a block added, before nodes are added after them."""
        setdefault, tokens, parents = self._child_by_token.setdefault, self._tokens, self._parents
        for node in range(self._indexed, len(tokens)):
            setdefault((parents[node], tokens[node]), node)
        self._indexed = len(tokens)

    def add_chain(
        self,
        parent: int,
        tokens: Sequence[int],
        needs_logits: bool,
        merge: bool = False,
        sources: int | Sequence[int] = 0,
    ) -> list[int]:
        """Append ``tokens`` as a chain below ``parent``; return the node ids.

        With ``merge=True`` an existing child of the current node carrying the
        same token is reused (trie merge) and ``needs_logits`` is OR-ed into it;
        it keeps its source.  ``sources``: one per token, or one for all.
        """
        if not 0 <= parent < len(self._tokens):
            raise ValueError(f"parent {parent} does not exist")
        self._index()
        tokens = [int(t) for t in tokens]
        per_token = [int(sources)] * len(tokens) if isinstance(sources, int) else [int(s) for s in sources]
        if len(per_token) != len(tokens):
            raise ValueError(f"{len(per_token)} sources for {len(tokens)} tokens")
        node_ids: list[int] = []
        current, merged = parent, 0
        while merge and merged < len(tokens):  # down the existing children that carry the chain's tokens
            existing = self._child_by_token.get((current, tokens[merged]))
            if existing is None:
                break
            self._logits[existing] = self._logits[existing] or bool(needs_logits)
            current = existing
            node_ids.append(current)
            merged += 1
        rest = tokens[merged:]
        if rest:  # the rest is a new chain below ``current``: appended in one go
            start = len(self._tokens)
            nodes = range(start, start + len(rest))
            self._tokens.extend(rest)
            self._parents.append(current)
            self._parents.extend(nodes[:-1])
            depth = self._depths[current] + 1
            self._depths.extend(range(depth, depth + len(rest)))
            self._logits.extend([bool(needs_logits)] * len(rest))
            self._sources.extend(per_token[merged:])
            self._child_by_token.setdefault((current, rest[0]), start)
            self._child_by_token.update(zip(zip(nodes[:-1], rest[1:]), nodes[1:]))  # new nodes: no children yet
            node_ids.extend(nodes)
            self._indexed = len(self._tokens)
        return node_ids

    def has_source(self, source: int) -> bool:
        """Whether any node so far came from ``source`` (a :class:`~.source.Source`)."""
        return int(source) in self._sources

    @property
    def sources(self) -> np.ndarray:
        """int8 (size,): each node's :class:`~.source.Source` so far."""
        return np.asarray(self._sources, dtype=np.int8)

    def build(self) -> DraftTree:
        tree = DraftTree(
            tokens=_readonly(np.asarray(self._tokens, dtype=np.int64)),
            parents=_readonly(np.asarray(self._parents, dtype=np.int32)),
            depths=_readonly(np.asarray(self._depths, dtype=np.int32)),
            logits=_readonly(np.asarray(self._logits, dtype=bool)),
        )
        tree.__dict__["size"] = len(self._tokens)  # the cached property, known
        return tree
