"""The 2D Jacobi window: the lookahead branch of Lookahead Decoding.

Fu et al. (2024, arXiv:2402.02057, Sec. 3.1) keep a window of ``W`` columns and
``N - 1`` levels of guessed future tokens.  Each step every column is pushed one
Jacobi iteration further: the target model's argmax at the last level becomes a
new level and the oldest level is dropped.  Reading a column top to bottom plus
the new argmax gives an n-gram of length ``N`` that the model itself produced,
which is stored in the n-gram pool for later verification.

Coordinates follow llama.cpp's ``examples/lookahead``: ``levels[j][i]`` is
level ``j`` (0 = oldest), column ``i``.  In the token tree, level 0 is a chain
hanging off the root (column 0 of level 0 *is* the root, the last accepted
token) and every deeper level extends the column above it, so node ``(j, i)``
sits at depth ``i + j`` and sees ``root, levels[0][1..i], levels[1][i], ...,
levels[j][i]`` -- the last ``N - 1`` of these are exactly the column.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from .source import Source
from .tree import TreeBuilder

_WINDOW = int(Source.WINDOW)


def _sample(rng: np.random.Generator, tokens: Sequence[int], count: int) -> np.ndarray:
    """``count`` tokens drawn uniformly with replacement (zeros if ``tokens`` is empty)."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    if len(tokens) == 0:
        return np.zeros(count, dtype=np.int64)
    picks = rng.integers(0, len(tokens), size=count)
    if isinstance(tokens, np.ndarray):  # a step's fill: the request's recent tokens
        return tokens[picks].astype(np.int64)
    return np.asarray([int(tokens[p]) for p in picks], dtype=np.int64)


class JacobiWindow:
    """``W`` columns by ``N - 1`` levels of Jacobi guesses for one request.

    ``window_size``, ``ngram_size`` and ``shift`` ("one" | "accepted") come from a
    validated :class:`~vllm_lookahead.config.LookaheadConfig` and are not checked again.
    """

    def __init__(
        self,
        window_size: int,
        ngram_size: int,
        init_tokens: Sequence[int],
        rng: np.random.Generator,
        shift: str = "one",
    ) -> None:
        self.window_size = window_size
        self.ngram_size = ngram_size
        self.shift = shift
        self.rng = rng
        self.levels: list[np.ndarray] = []
        self.root_token = 0  # root token of the last add_to_tree call
        self._root_column: np.ndarray | None = None  # root_column's answer
        self.reset(init_tokens)

    @property
    def num_levels(self) -> int:
        """Levels of a full window: ``N - 1``."""
        return self.ngram_size - 1

    @property
    def filled(self) -> int:
        return len(self.levels)

    @property
    def full(self) -> bool:
        return self.filled == self.num_levels

    def reset(self, init_tokens: Sequence[int]) -> None:
        """Re-initialise: only level 0, columns 1.. sampled from ``init_tokens``."""
        level0 = np.zeros(self.window_size, dtype=np.int64)
        level0[1:] = _sample(self.rng, init_tokens, self.window_size - 1)
        self.levels = [level0]

    def tree_nodes(self, columns: int | None = None) -> int:
        """Tree nodes (root excluded) the first ``columns`` columns (default all) add."""
        k = self.window_size if columns is None else max(0, min(columns, self.window_size))
        return k * self.filled - 1 if k else 0

    def add_to_tree(self, builder: TreeBuilder, root: int = 0, columns: int | None = None) -> np.ndarray:
        """Add the window's first ``columns`` columns (default all) below ``root``.

        Returns the W output node ids (last level), -1 for columns left out this
        step: those get no new level from :meth:`update` (they keep their last
        guess) and yield no n-gram.
        """
        width = self.window_size if columns is None else max(0, min(columns, self.window_size))
        self.root_token = int(builder.root_token)
        outputs = np.full(self.window_size, -1, dtype=np.int64)
        if width == 0:
            return outputs
        # level 0: the root, then columns 1.. as a chain below it; each next level one node below
        # each of the level before (the nodes in the order adding them one by one gives), appended
        # as one block laid out by the window's shape
        parents, depths, logits, last = _layout(width, self.filled, root, builder.size, builder.depth(root))
        builder.add_block(self._block_tokens(width).tolist(), parents, depths, logits, _WINDOW)
        outputs[:width] = last
        return outputs

    def put_block(
        self, arrays: tuple[np.ndarray, ...], start: int, root_token: int, columns: int
    ) -> tuple[int, np.ndarray]:
        """:meth:`add_to_tree` below the root of a tree of ``start`` nodes, written into its arrays from
        node ``start`` on (tokens, parents, depths, logits, sources, as
        :func:`~.tree.chains_tree` returns them, with room for the block): the tree's size after it
        and the W output node ids."""
        width = max(0, min(columns, self.window_size))
        self.root_token = int(root_token)
        outputs = np.full(self.window_size, -1, dtype=np.int64)
        if width == 0:
            return start, outputs
        parents, depths, logits, last = _layout_arrays(width, self.filled, start)
        end = start + len(parents)
        tokens, tree_parents, tree_depths, tree_logits, sources = arrays
        tokens[start:end] = self._block_tokens(width)
        tree_parents[start:end] = parents
        tree_depths[start:end] = depths
        tree_logits[start:end] = logits
        sources[start:end] = _WINDOW
        outputs[:width] = last
        return end, outputs

    def _block_tokens(self, width: int) -> np.ndarray:
        """The tokens of the first ``width`` columns' nodes, in :func:`_layout`'s order."""
        return np.concatenate([self.levels[0][1:width], *(level[:width] for level in self.levels[1:])])

    def root_column(self, root_token: int) -> np.ndarray:
        """:meth:`add_to_tree` of the first column alone while the window holds one level, where
        that column is the root itself and adds no node: the output nodes ``[root, -1, ...]`` (one
        read-only array per window), made without a tree builder."""
        if self.filled != 1:
            raise ValueError(f"the first column is the root alone at the first level only ({self.filled} levels)")
        self.root_token = int(root_token)
        if self._root_column is None:
            self._root_column = np.full(self.window_size, -1, dtype=np.int64)
            self._root_column[0] = 0
            self._root_column.setflags(write=False)
        return self._root_column

    def update(
        self,
        outputs: np.ndarray,
        num_accepted: int,
        fill_tokens: Sequence[int],
    ) -> np.ndarray:
        """Collect n-grams from a full window, then advance it by one Jacobi step.

        ``outputs``: int64 (W,) argmax at the output nodes, -1 where unknown.
        ``num_accepted``: accepted draft tokens this step (bonus not counted).
        Returns the n-grams, int64 ``(k, N)``, one row per known column in column order
        (none while the window fills).
        """
        outputs = np.asarray(outputs, dtype=np.int64)
        if outputs.shape != (self.window_size,):
            raise ValueError(f"outputs has shape {outputs.shape}, expected ({self.window_size},)")
        known = outputs >= 0
        new_level = np.where(known, outputs, self.levels[-1])
        if not self.full:
            self.levels.append(new_level)
            return np.zeros((0, self.ngram_size), dtype=np.int64)
        ngrams = self._collect_ngrams(outputs, known)
        shifted = self.levels[1:] + [new_level]
        shift_by = min(max(int(num_accepted), 0), self.window_size) if self.shift == "accepted" else 0
        if shift_by > 0:
            shifted = [
                np.concatenate([level[shift_by:], _sample(self.rng, fill_tokens, shift_by)]) for level in shifted
            ]
        self.levels = shifted
        return ngrams

    def _collect_ngrams(self, outputs: np.ndarray, known: np.ndarray) -> np.ndarray:
        columns = np.stack(self.levels + [outputs], axis=1)  # (W, N): column i top to bottom, its argmax
        columns[0, 0] = self.root_token
        return columns[known]


@functools.lru_cache(maxsize=1024)
def _layout_arrays(width: int, filled: int, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_layout` below the root (node 0, depth 0) as read-only arrays (int32 parents and
    depths, bool logits, int64 output nodes), as a tree's arrays take them."""
    parents, depths, logits, last = _layout(width, filled, 0, start, 0)
    arrays = (
        np.array(parents, dtype=np.int32),
        np.array(depths, dtype=np.int32),
        np.array(logits, dtype=bool),
        np.array(last, dtype=np.int64),
    )
    for array in arrays:
        array.setflags(write=False)
    return arrays


@functools.lru_cache(maxsize=4096)
def _layout(
    width: int, filled: int, root: int, start: int, root_depth: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...], tuple[int, ...]]:
    """The block :meth:`JacobiWindow.add_to_tree` appends for ``width`` columns of ``filled``
    levels below node ``root`` (at ``root_depth``) of a tree of ``start`` nodes: each node's
    parent, depth and whether it needs logits (the last level's nodes), and the last level's
    nodes by column.  Level 0's columns 1.. are a chain below the root, then each level's
    ``width`` nodes hang one below each of the level before (column 0 of level 1 below the
    root).  Shared by every window of that shape (a few shapes, a few dozen starts), hence tuples."""
    parents = [root, *range(start, start + width - 2)][: width - 1]
    depths = list(range(root_depth + 1, root_depth + width))
    below = [root, *range(start, start + width - 1)]  # the level above's nodes, by column
    for j in range(1, filled):
        at = start + len(parents)
        parents.extend(below)
        depths.extend(range(root_depth + j, root_depth + j + width))
        below = list(range(at, at + width))
    last_level = width - 1 if filled == 1 else width
    logits = [False] * (len(parents) - last_level) + [True] * last_level
    return tuple(parents), tuple(depths), tuple(logits), tuple(below)
