"""The n-gram pool: candidate continuations for the verification branch.

Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057, Sec. 3.2) caches the
n-grams produced by the Jacobi window (and, optionally, the prompt and the
accepted output) keyed by their first token.  At each step the n-grams whose
key equals the last accepted token are verified in parallel; up to ``G``
(the guess set size) candidates are kept per key.

A pool may also be keyed by the last ``context`` tokens instead of one (an
extension beyond the paper, in the spirit of prompt lookup decoding): the
request keeps such pools for the prompt and output text, and asks the longest
context first, so the candidates that match more of what was just said come
first when the tree budget only has room for a few.

Both levels are LRU: per key the most recently (re-)added continuation wins,
and the key table itself is bounded by ``max_keys`` so memory stays constant on
long generations.  Every stored continuation keeps the :class:`~.source.Source`
that produced it (the text, or the Jacobi window), for attributing accepted
tokens; an n-gram re-added by a text source takes that source.  It also keeps
how often it was added: :meth:`NgramPool.support` -- how many stored n-grams
after a key begin with a given token -- is the draft rule's confidence in a lead
candidate (:class:`~.draft_rule.LeadConfidence`).  Every operation is O(1)
(amortised; ``support`` O(G)) -- ``add_sequence`` costs O(number of new n-grams),
so incremental learning never rescans history.  The storage is numpy arrays worked on by
compiled loops (:mod:`.ngram_table`): one call learns a tail of new tokens, one call answers a
lookup.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .ngram_table import COUNT, COUNT_SHIFT, HELD, KEYS, SOURCE_MASK, TOP, load, new_meta
from .source import Source

if TYPE_CHECKING:
    from vllm_lookahead.config import LookaheadConfig


def int_list(tokens: Sequence[int]) -> list[int]:
    """``tokens`` as a list of Python ints (one ``tolist`` for a numpy array)."""
    return tokens.tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


def int_array(tokens: Sequence[int]) -> np.ndarray:
    """``tokens`` as an int64 array (itself where it is one)."""
    return tokens if isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 else np.asarray(tokens, np.int64)


LONG_TEXT = 512  # new tokens from which a learning call releases the GIL (a prompt's; not a step's)
_FIRST_KEYS = 256  # least key capacity of a new pool's arrays
_FIRST_KEYS_MOST = 4096  # most key capacity a pool's first arrays are sized to (the first text it learns)


@functools.cache
def _empty_table(context: int, G: int, L: int) -> tuple[np.ndarray, ...]:
    """The arrays of a pool that holds no key yet (read for their shapes only: its counters say
    it is empty)."""
    return (
        np.empty(0, dtype=np.int32),
        np.empty((0, context), dtype=np.int32),
        np.empty((0, 3), dtype=np.int64),
        np.empty((0, G, L), dtype=np.int32),
        np.empty((0, G), dtype=np.int64),
    )


class NgramPool:
    """LRU map ``key -> up to G continuations of N - 1 tokens``.

    The key is the first token (``context=1``, the paper's pool) or the first
    ``context`` tokens of each stored sequence of ``context + N - 1`` tokens.
    Sizes come from a validated :class:`~vllm_lookahead.config.LookaheadConfig`.
    """

    def __init__(self, ngram_size: int, guess_set_size: int, max_keys: int = 65536, context: int = 1) -> None:
        self.context = context
        self.span = context + ngram_size - 1  # tokens per stored sequence
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        self.max_keys = max_keys
        self._loops = load()  # the compiled loops over the arrays below
        self._meta = new_meta()
        self._capacity = 0  # keys the arrays hold: none until the first key (_more_room)
        self._keys = self._links = self._conts = self._entries = self._slots = None
        self._table: tuple | None = None  # table(), until the arrays are replaced
        self.on_grow: Callable[[], None] | None = None  # told when the arrays are replaced (PoolBatch)
        width = max(1, guess_set_size)
        self._out = np.zeros((width, ngram_size - 1), dtype=np.int32)  # a lookup's answer
        self._out_sources = np.zeros(width, dtype=np.int64)

    def _grow(self, capacity: int) -> None:
        """Arrays for ``capacity`` keys, what is stored kept (a hash table rebuilt)."""
        G, L, top = max(1, self.guess_set_size), self.ngram_size - 1, int(self._meta[TOP])
        old = self._keys
        # a key's row is written whole when it is handed out, its continuations as they come
        keys = np.empty((capacity, self.context), dtype=np.int32)
        links = np.empty((capacity, 3), dtype=np.int64)
        conts = np.empty((capacity, G, L), dtype=np.int32)
        entries = np.empty((capacity, G), dtype=np.int64)
        if old is not None:
            keys[:top], links[:top], conts[:top], entries[:top] = (
                old[:top],
                self._links[:top],
                self._conts[:top],
                self._entries[:top],
            )
        self._keys, self._links, self._conts, self._entries = keys, links, conts, entries
        self._slots = np.full(1 << (2 * capacity - 1).bit_length(), -1, dtype=np.int32)
        self._table = None
        self._loops.rehash(self._slots, keys, links, self._meta)
        self._capacity = capacity
        if self.on_grow is not None:
            self.on_grow()

    def _first_room(self, ngrams: int) -> None:
        """A pool without arrays yet, about to learn ``ngrams`` n-grams (a prompt): arrays for as
        many keys (at least :data:`_FIRST_KEYS`, at most :data:`_FIRST_KEYS_MOST`), so that an 8k
        prompt's pools are not rebuilt on their way up (256, 1,024, 4,096 keys: ~20 % of the
        prompt's learning)."""
        if self._capacity == 0:
            self._grow(min(self.max_keys, max(_FIRST_KEYS, min(ngrams, _FIRST_KEYS_MOST))))

    def _more_room(self) -> None:
        """Grow the arrays (full: a compiled add stopped at a new key): four times while small (a
        request's pools grow through their first thousands of keys within its first steps), twice
        once large, never past ``max_keys``."""
        factor = 4 if self._capacity < 4096 else 2
        self._grow(min(max(factor * self._capacity, _FIRST_KEYS), self.max_keys))

    def make_room(self, ngrams: int) -> None:
        """Grow the arrays after a compiled add over several pools stopped at this one for room
        (:func:`~.ngram_table.learn_rows`): its first arrays sized for the ``ngrams`` n-grams it was
        learning, as :func:`add_to_each` sizes them, or larger ones."""
        if self._capacity == 0:
            self._first_room(ngrams)
        else:
            self._more_room()

    def _add(self, seq: np.ndarray, first: int, stride: int, count: int, source: int) -> None:
        """:func:`~.ngram_table.add_ngrams`, the arrays grown as often as it stops for room."""
        self._first_room(count)
        done = 0
        while True:
            done += self._loops.add_ngrams(
                *self.table, seq, first + done * stride, stride, count - done, self.max_keys, source
            )
            if done >= count:
                return
            self._more_room()

    @property
    def table(self) -> tuple:
        """The pool's arrays as the compiled loops over several pools read them
        (:func:`~.ngram_table.lookup_pools`); a pool without keys yet gives empty ones.  Made once
        per set of arrays (a step's lookups ask for it every time)."""
        if self._table is None:
            if self._slots is None:
                empty = _empty_table(self.context, max(1, self.guess_set_size), self.ngram_size - 1)
                self._table = (*empty, self._meta)
            else:
                self._table = (self._slots, self._keys, self._links, self._conts, self._entries, self._meta)
        return self._table

    def _key(self, key: int | Sequence[int]) -> np.ndarray | None:
        """The table key for ``key`` (a token, or the last ``context`` tokens of a sequence; None:
        too short)."""
        if isinstance(key, (int, np.integer)):
            return np.array([key], dtype=np.int64) if self.context == 1 else None
        if len(key) < self.context:
            return None
        return int_array(key[len(key) - self.context :])

    def add(self, ngram: Sequence[int], source: Source = Source.OUTPUT) -> None:
        """Store ``ngram[context:]`` under key ``ngram[:context]`` as the most recent value.

        ``source``: what produced it; a stored value keeps the lowest (textual) source seen.
        """
        if len(ngram) != self.span:
            raise ValueError(f"n-gram of length {len(ngram)}, expected {self.span}")
        self.add_rows(int_array(ngram)[None], source)

    def add_rows(self, ngrams: np.ndarray, source: Source = Source.OUTPUT) -> None:
        """:meth:`add` of each row of ``ngrams`` (``(k, context + N - 1)``), in order, in one call."""
        ngrams = np.ascontiguousarray(ngrams, dtype=np.int64)
        if ngrams.ndim != 2 or ngrams.shape[1] != self.span:
            raise ValueError(f"n-grams of shape {ngrams.shape}, expected (k, {self.span})")
        if self.guess_set_size == 0 or not len(ngrams):
            return
        self._add(ngrams.ravel(), 0, self.span, len(ngrams), int(source))

    def _new_ngrams(self, length: int, start: int) -> tuple[int, int]:
        """Where the n-grams of a sequence of ``length`` tokens ending at index >= ``start`` begin,
        and how many there are."""
        first = max(0, start - self.span + 1)
        return first, length - first - self.span + 1

    def add_sequence(self, tokens: Sequence[int], start: int = 0, source: Source = Source.OUTPUT) -> None:
        """Add every sequence ``tokens[p:p+span]`` that ends at an index >= ``start``
        (the same as :meth:`add` of each, in order, in one call)."""
        first, count = self._new_ngrams(len(tokens), start)
        if self.guess_set_size == 0 or count <= 0:
            return
        self._add(int_array(tokens[first:]), 0, 1, count, int(source))  # the tokens its n-grams span

    def get(self, key: int | Sequence[int], limit: int) -> list[tuple[int, ...]]:
        """At most ``min(limit, G)`` continuations for ``key``, most recent first.

        ``key``: a token (``context=1``) or the last ``context`` tokens.
        """
        return [value for value, _ in self.get_sourced(key, limit)]

    def get_sourced(self, key: int | Sequence[int], limit: int) -> list[tuple[tuple[int, ...], int]]:
        """:meth:`get` with each continuation's :class:`~.source.Source` (as stored: an int)."""
        k = self._key(key) if limit > 0 else None
        return self.get_after(k, limit) if k is not None else []

    def get_after(self, text: np.ndarray, limit: int) -> list[tuple[tuple[int, ...], int]]:
        """:meth:`get_sourced` of the key ending ``text`` (int64, at least ``context`` tokens; its
        last ``context`` are read): a caller asking several pools makes the array once."""
        if limit <= 0 or not self._meta[KEYS]:
            return []
        n = self._loops.get_into(*self.table, text[len(text) - self.context :], limit, self._out, self._out_sources)
        if not n:
            return []
        return list(zip(map(tuple, self._out[:n].tolist()), self._out_sources[:n].tolist()))

    def support(self, key: int | Sequence[int], first: int) -> int:
        """How many times n-grams stored under ``key`` that begin with ``first`` were added
        (the evidence that ``first`` follows ``key``; 0 if none).  Does not touch the LRU order."""
        k = self._key(key)
        if k is None or not self._meta[KEYS]:
            return 0
        return int(
            self._loops.support_of(self._slots, self._keys, self._links, self._conts, self._entries, k, int(first))
        )

    def keys(self) -> list[tuple[int, ...]]:
        """The keys stored so far, least recent first, as tokens."""
        return [tuple(self._keys[i].tolist()) for i in self._stored()]

    def items(self) -> list[tuple[tuple[int, ...], list[tuple[tuple[int, ...], int, int]]]]:
        """:meth:`keys` with each key's continuations, least recent first, each with its source
        and the times it was added: everything the pool holds, for comparing two pools."""
        out = []
        for i in self._stored():
            held = int(self._links[i, HELD])
            values = [
                (tuple(cont), int(entry) & SOURCE_MASK, int(entry) >> COUNT_SHIFT)
                for cont, entry in zip(self._conts[i, :held].tolist(), self._entries[i, :held])
            ]
            out.append((tuple(self._keys[i].tolist()), values))
        return out

    def _stored(self) -> np.ndarray:
        out = np.zeros(int(self._meta[KEYS]), dtype=np.int64)
        if len(out):
            self._loops.lru_keys(self._links, self._meta, out)
        return out

    def __len__(self) -> int:
        return int(self._meta[COUNT])

    @property
    def num_keys(self) -> int:
        return int(self._meta[KEYS])


def add_to_each(
    pools: Sequence[NgramPool],
    tokens: Sequence[int],
    start: int = 0,
    source: Source = Source.OUTPUT,
    unlocked: bool = False,
) -> None:
    """Each pool's :meth:`NgramPool.add_sequence` of ``tokens``, in one compiled call (the pools of
    one request, or the shared ones: the same ``N``, ``G`` and ``max_pool_keys``, any context);
    ``unlocked`` (a prompt: a new request's state may be built on another thread) or a text of
    more than :data:`LONG_TEXT` new tokens is learnt without holding the GIL."""
    if not pools or pools[0].guess_set_size == 0:
        return
    seq, loops, max_keys, source = int_array(tokens), pools[0]._loops, pools[0].max_keys, int(source)
    for pool in pools:
        pool._first_room(len(seq) - start)
    add = loops.add_to_pools_unlocked if unlocked or len(seq) - start > LONG_TEXT else loops.add_to_pools
    full, done = 0, 0
    while True:
        full, done = add(tuple(pool.table for pool in pools), seq, start, max_keys, source, full, done)
        if full < 0:
            return
        pools[full]._more_room()


class SharedPools:
    """Output n-grams of every request of one engine, for every other request's lookups.

    Suffix decoding (Oliaro et al., 2024, arXiv:2411.04975) keeps a tree over earlier
    requests' outputs: answers to similar prompts repeat each other (code, templates,
    boilerplate).  These are the same text pools a request keeps (keyed by the last
    ``lookup_context``..1 tokens), filled with accepted output only -- never prompts --
    holding token ids only, bounded like a request's (``max_pool_keys`` keys per pool,
    least recently used out, ``G`` continuations per key).  What they store is another
    request's text: drafts do not change any output (verification is exact) but a step's
    speed can depend on what other clients generated, so they are opt-in (``shared_pool``).
    """

    def __init__(self, ngram_size: int, guess_set_size: int, max_keys: int, lookup_context: int) -> None:
        self.pools = {
            k: NgramPool(ngram_size, guess_set_size, max_keys, context=k) for k in range(lookup_context, 0, -1)
        }
        self._each = list(self.pools.values())

    @classmethod
    def for_config(cls, config: LookaheadConfig) -> SharedPools:
        """Shared pools shaped like every request's text pools under ``config``."""
        return cls(config.ngram_size, config.guess_set_size, config.max_pool_keys, config.lookup_context)

    def add_sequence(self, tokens: Sequence[int], start: int = 0) -> None:
        add_to_each(self._each, tokens, start, Source.SHARED)

    @property
    def num_ngrams(self) -> int:
        return sum(len(pool) for pool in self.pools.values())
