"""A prompt's n-grams for one pool, indexed at once and stored key by key on first use.

Seeding a pool with a prompt one n-gram at a time costs O(prompt) Python work in the step that
admits the request: ~300 ms for an 8k-token prompt across a request's three text pools, on the
critical path of every request in the batch.  :class:`PromptNgrams` instead sorts the prompt's
n-grams by key with numpy (a few milliseconds for 8k tokens) and hands a key's continuations
to the pool the first time the pool touches that key (a lookup or a new n-gram under it): the
key's occurrences are replayed in order through the pool's own per-key update, so a touched key
holds exactly what adding the prompt n-gram by n-gram would have stored (values, their LRU
order, sources and counts), and keys not yet touched leave a full pool first, least recently
said first (any key the pool touched since is more recent), so the pool's key LRU stays the
sequential one.  A prompt with more distinct keys than the pool's ``max_keys`` (65,536 by
default) keeps the ``max_keys`` keys said last, as the sequential adds would; one difference
there: a kept key that the sequential adds evicted mid-prompt and stored again keeps its
continuations from before the eviction too (after the later ones).  Untouched keys cost
nothing per step; the pool's size counts them (:attr:`PromptNgrams.num_ngrams`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .ngram_keys import NAME_BITS, key_tokens


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


class PromptNgrams:
    """The n-grams ``tokens[p : p + context + N - 1]`` of a prompt, by key (see the module docstring)."""

    def __init__(self, tokens: Sequence[int], context: int, span: int, guess_set_size: int, max_keys: int) -> None:
        seq = np.asarray(tokens, dtype=np.int64)
        self._rows: dict[object, int] = {}  # key name (_name) -> its row in _starts (keys not yet taken)
        # a key of 2 or 3 tokens is named by one int as the pool names it (.ngram_keys), made in
        # numpy for a whole prompt, where tuples cost ~1 us each
        self._context = context
        self._packed = 1 < context <= 3 and (len(seq) == 0 or int(seq.max()) < 1 << NAME_BITS)
        self._age: Sequence[object] = ()  # the kept keys' names, least recently said first
        self._by_age: Iterator[object] | None = None  # over _age, made at the first eviction
        self.num_ngrams = 0  # continuations the pool would hold for the keys not yet taken
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
        first = order[starts[keep]]  # an occurrence of each kept key, least recently said first
        if self._packed:
            names = _words(windows[first, :context], NAME_BITS)[0].tolist()
        elif context == 1:
            names = windows[first, 0].tolist()
        else:
            names = list(map(tuple, windows[first, :context].tolist()))
        self._rows = dict(zip(names, keep.tolist()))
        # the order an LRU evicts them in; int names (and the counts below) in numpy arrays, which
        # the garbage collector does not traverse as it does a list of a prompt's keys
        self._age = names if context > 1 and not self._packed else np.asarray(names, dtype=np.int64)
        self._held = held
        self._starts = np.append(starts, len(order))
        self._order = order
        # a continuation is read off the prompt itself (a view of ``windows`` would keep numpy's
        # strided base alive: one more object per pool for the collector to traverse)
        self._seq = seq
        self._offsets = np.arange(context, span)

    def _name(self, key: object) -> object:
        """A pool key's name here (the pool's own name of it, :mod:`.ngram_keys`; None: a key the
        prompt cannot have said)."""
        if self._context == 1:
            return key
        if self._packed:  # every prompt token packs: a key kept as a tuple has a token it never said
            return key if isinstance(key, int) else None
        return key_tokens(key, self._context)

    def rows_by_key(self) -> dict[object, int] | None:
        """The keys not yet taken, by the pool's own name of each (None where the names here are
        not the pool's: a prompt with a token too large to pack): ``key in rows_by_key()`` is
        ``key in self`` without a call per key."""
        return self._rows if self._context == 1 or self._packed else None

    def __len__(self) -> int:
        """Keys not yet taken."""
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return self._name(key) in self._rows

    def peek(self, key: object) -> list[tuple[int, ...]] | None:
        """The continuations said after ``key``, in prompt order (None: none, or taken before)."""
        return self._said(self._rows.get(self._name(key)))

    def take(self, key: object) -> list[tuple[int, ...]] | None:
        """:meth:`peek`, the key forgotten here (the pool holds it from now on)."""
        row = self._rows.pop(self._name(key), None)
        if row is not None:
            self.num_ngrams -= int(self._held[row])
        return self._said(row)

    def _said(self, row: int | None) -> list[tuple[int, ...]] | None:
        if row is None:
            return None
        start, end = self._starts[row], self._starts[row + 1]
        if end - start == 1:  # a key said once (most keys of 2-3 tokens): a slice, no gather
            first = int(self._order[start]) + self._context
            return [tuple(self._seq[first : first + len(self._offsets)].tolist())]
        occurrences = self._order[start:end]
        return list(map(tuple, self._seq[occurrences[:, None] + self._offsets].tolist()))

    def evict_oldest(self) -> None:
        """Forget the key said least recently of those not taken (a full pool's LRU victim: every
        key the pool touched since is more recent)."""
        if self._by_age is None:  # made here: an iterator is one more object the collector traverses
            self._by_age = iter(self._age)
        for name in self._by_age:
            row = self._rows.pop(name.item() if isinstance(name, np.generic) else name, None)
            if row is not None:
                self.num_ngrams -= int(self._held[row])
                return
        raise LookupError("no key left")
