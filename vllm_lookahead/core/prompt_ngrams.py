"""A seeded text's n-grams for one pool, indexed at once by numpy and stored key by key on first use.

Seeding a pool with a prompt one n-gram at a time costs O(prompt) work in the step that admits
the request, on the critical path of every request in the batch.  :class:`TextIndex` instead sorts
the text's n-grams by key with numpy (a few milliseconds for 8k tokens); the pool
(:mod:`.ngram_table`) puts the keys in its table at once, each pointing at its occurrences here,
and replays a key's continuations in the order the text said them the first time it touches that
key (a lookup or a new n-gram under it), so a touched key holds exactly what adding the text
n-gram by n-gram would have stored (values, their LRU order, sources and counts).  Keys not yet
touched leave a full pool first, least recently said first (any key the pool touched since is
more recent), so the pool's key LRU stays the sequential one.  A text with more distinct keys than
the pool's ``max_keys`` (65,536 by default) keeps the ``max_keys`` keys said last, as the
sequential adds would; one difference there: a kept key that the sequential adds evicted
mid-text and stored again keeps its continuations from before the eviction too (after the
later ones).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _words(columns: np.ndarray, bits: int) -> list[np.ndarray]:
    """The columns of ``columns`` (P, k) packed ``64 // bits`` tokens to a uint64 word, first
    column lowest: rows compare equal exactly when their words do."""
    per = 64 // bits
    words = []
    for j in range(0, columns.shape[1], per):
        word = np.zeros(len(columns), dtype=np.uint64)
        for i, column in enumerate(columns[:, j : j + per].T):
            word |= column.astype(np.uint64) << np.uint64(bits * i)
        words.append(word)
    return words


def _changes(words: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    """Where rows taken in ``order`` differ from the row before (the first row always)."""
    changed = np.ones(len(order), dtype=bool)
    changed[1:] = False
    for word in words:
        w = word[order]
        changed[1:] |= w[1:] != w[:-1]
    return changed


_NONE = np.zeros(0, dtype=np.int64)
_NONE.setflags(write=False)


class TextIndex:
    """The n-grams ``tokens[p : p + context + N - 1]`` of a text, by key (see the module docstring).

    ``seq``: the text (int64); ``order``: the n-grams' start positions by key, each key's in the
    order said; ``starts``: where each key's run begins in ``order`` (one more entry at the end);
    ``held``: the continuations the pool will hold for each key (distinct ones, at most ``G``);
    ``kept_first`` / ``kept_rows``: the keys a pool of ``max_keys`` keeps, least recently said
    first -- an occurrence of each (a start position) and its row; ``num_ngrams``: what those
    keys will hold.
    """

    def __init__(self, tokens: Sequence[int], context: int, span: int, guess_set_size: int, max_keys: int) -> None:
        seq = np.asarray(tokens, dtype=np.int64)
        self.seq = seq
        self.order = self.starts = self.held = self.kept_first = self.kept_rows = _NONE
        self.num_ngrams = 0
        if len(seq) < span or guess_set_size == 0:
            return
        bits = max(1, int(seq.max()).bit_length())
        windows = sliding_window_view(seq, span)  # (P, span): n-gram p starts at token p
        keys = _words(windows[:, :context], bits)
        values = _words(windows[:, context:], bits)
        # n-grams by key, then by position: a key's occurrences in the order they were said
        order = (
            np.argsort(keys[0], kind="stable") if len(keys) == 1 else np.lexsort((np.arange(len(windows)), *keys[::-1]))
        )
        starts = np.flatnonzero(_changes(keys, order))
        last_seen = order[np.append(starts[1:], len(order)) - 1]  # each key's last occurrence
        keep = np.argsort(last_seen, kind="stable")[-max_keys:]  # the keys an LRU of max_keys keeps
        # distinct continuations per key: what the pool holds for it, at most G
        by_value = np.lexsort((*values[::-1], *keys[::-1]))
        key_of_pair = np.cumsum(_changes(keys, by_value)) - 1
        pairs = _changes(keys + values, by_value)
        held = np.minimum(np.bincount(key_of_pair[pairs], minlength=len(starts)), guess_set_size)
        self.num_ngrams = int(held[keep].sum())
        self.order = order.astype(np.int64)
        self.starts = np.append(starts, len(order)).astype(np.int64)
        self.held = held.astype(np.int64)
        self.kept_first = self.order[starts[keep]]  # an occurrence of each kept key, least recently said first
        self.kept_rows = keep.astype(np.int64)
