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
so incremental learning never rescans history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .ngram_keys import key_name, key_names, key_tokens
from .prompt_ngrams import PromptNgrams
from .source import Source

if TYPE_CHECKING:
    from vllm_lookahead.config import LookaheadConfig


# A key's continuations: a tuple of (continuation, entry) pairs, least recent first, where the entry
# is one int -- the continuation's Source in the low bits, the times it was added above them.  Tuples
# of ints, replaced whole on a change (at most G pairs), are what the garbage collector stops
# tracking: the pools of a thousand requests then add next to nothing to its scans.
_COUNT_SHIFT = 3
_SOURCE = (1 << _COUNT_SHIFT) - 1
_ONCE = 1 << _COUNT_SHIFT
assert max(Source) <= _SOURCE
Held = tuple[tuple[tuple[int, ...], int], ...]


def _added(held: Held, value: tuple[int, ...], source: int, limit: int) -> Held:
    """One key's continuations with ``value`` added as the most recent (its entry counted once more,
    its source the lowest seen), at most ``limit`` kept."""
    for i, (stored, entry) in enumerate(held):
        if stored == value:
            return (*held[:i], *held[i + 1 :], (value, min(entry & _SOURCE, source) | ((entry & ~_SOURCE) + _ONCE)))
    if len(held) < limit:
        return (*held, (value, source | _ONCE))
    return (*held[1:], (value, source | _ONCE))


def int_list(tokens: Sequence[int]) -> list[int]:
    """``tokens`` as a list of Python ints (one ``tolist`` for a numpy array)."""
    return tokens.tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


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
        # key name (.ngram_keys) -> its continuations (Held), least recent key first: a key touched
        # is taken out and put back.  A plain dict, not an OrderedDict: the garbage collector stops
        # tracking a dict that holds only untracked values (ints, tuples of ints), so a full
        # collection skips the pools of requests that learnt nothing since the last one, where it
        # traverses every OrderedDict whole (at 1,024 requests in flight, ~12 against ~40 ms).
        self._table: dict[object, Held] = {}
        self._evicted = 0  # keys evicted since the table was last compacted (_evict)
        self._count = 0
        self._prompt: PromptNgrams | None = None  # a seeded text's keys not yet in the table (seed)
        self._prompt_source = int(Source.PROMPT)

    def _key(self, tokens: Sequence[int]) -> object:
        return int(tokens[0]) if self.context == 1 else key_name(list(map(int, tokens)))

    def add(self, ngram: Sequence[int], source: Source = Source.OUTPUT) -> None:
        """Store ``ngram[context:]`` under key ``ngram[:context]`` as the most recent value.

        ``source``: what produced it; a stored value keeps the lowest (textual) source seen.
        """
        if len(ngram) != self.span:
            raise ValueError(f"n-gram of length {len(ngram)}, expected {self.span}")
        if self.guess_set_size == 0:
            return
        c = self.context
        self._store(self._key(ngram[:c]), tuple(map(int, ngram[c:])), int(source))

    def _store(self, key: object, value: tuple[int, ...], source: int) -> None:
        """:meth:`add` for an already normalised key and continuation."""
        table = self._table
        held = table.pop(key, None)
        if held is None:
            held = self._new_key(key)
        table[key] = added = _added(held, value, source, self.guess_set_size)
        self._count += len(added) - len(held)

    def _new_key(self, key: object) -> Held:
        """The continuations of a key not in the table, put in as the most recent key: the
        seeded text's (:meth:`seed`) if it said the key, else none yet -- a new key, for which
        the least recent key leaves a full pool."""
        prompt = self._prompt
        said = prompt.take(key) if prompt is not None else None
        if said is None:
            if len(self._table) + (len(prompt) if prompt is not None else 0) >= self.max_keys:
                self._evict()
            held: Held = ()
        else:
            held = self._replay(said)
            self._count += len(held)
        self._table[key] = held
        return held

    def _replay(self, said: list[tuple[int, ...]]) -> Held:
        """One key's continuations after the seeded text's, in the order it said them."""
        source, limit = self._prompt_source, self.guess_set_size
        if len(said) == 1:  # most keys: said once
            return ((said[0], source | _ONCE),)
        held: Held = ()
        for value in said:
            held = _added(held, value, source, limit)
        return held

    def _evict(self) -> None:
        """The least recent key leaves: a seeded key never touched (older than every key in the
        table), else the table's first.  A dict's first key is found by a scan past the slots of
        the keys taken out before it, so a table that evicts is compacted in place every
        ``max(256, keys / 32)`` evictions (O(keys) each time: O(32) per eviction)."""
        if self._prompt is not None and len(self._prompt):
            self._prompt.evict_oldest()
            return
        table = self._table
        evicted = table.pop(next(iter(table)))
        self._count -= len(evicted)
        self._evicted += 1
        if self._evicted >= max(256, len(table) >> 5):
            self._evicted = 0
            kept = list(table.items())
            table.clear()
            table.update(kept)

    def seed(self, tokens: Sequence[int], source: Source = Source.PROMPT) -> None:
        """:meth:`add_sequence` of a whole text into an empty pool, in O(text) numpy work: each
        key's n-grams are stored when the pool first touches the key
        (:class:`~.prompt_ngrams.PromptNgrams`), exactly as adding them one by one would have."""
        if self._table or self._prompt is not None:
            raise ValueError("seed() fills an empty pool")
        if self.guess_set_size == 0:
            return
        self._prompt = PromptNgrams(tokens, self.context, self.span, self.guess_set_size, self.max_keys)
        self._prompt_source = int(source)

    def add_sequence(self, tokens: Sequence[int], start: int = 0, source: Source = Source.OUTPUT) -> None:
        """Add every sequence ``tokens[p:p+span]`` that ends at an index >= ``start``
        (the same as :meth:`add` of each, in order; the tokens are converted once)."""
        n, c = self.span, self.context
        first = max(0, start - n + 1)
        if self.guess_set_size == 0 or len(tokens) - first < n:
            return
        seq = int_list(tokens[first:])
        src = int(source)
        count = len(seq) - n + 1
        # each n-gram's key name and continuation, made by zip (no slice per n-gram); _store inlined
        values = zip(*(seq[i : i + count] for i in range(c, n)))
        table, new_key, limit, grown = self._table, self._new_key, self.guess_set_size, 0
        # a key new to the table that the seeded text did not say, in a table with room, starts
        # empty (what _new_key decides, without its calls: 4 in 10 of a text's keys are new)
        said = self._prompt.rows_by_key() if self._prompt is not None else {}
        max_keys, once = self.max_keys, src | _ONCE
        for key, value in zip(key_names(seq, c, count), values):
            held = table.pop(key, None)
            if held is None:
                if said is not None and key not in said and len(table) + len(said) < max_keys:
                    held = ()
                else:
                    held = new_key(key)
            if held:
                table[key] = added = _added(held, value, src, limit)
                grown += len(added) - len(held)
            else:  # _added of an empty key, inlined
                table[key] = ((value, once),)
                grown += 1
        self._count += grown

    def get(self, key: int | Sequence[int], limit: int) -> list[tuple[int, ...]]:
        """At most ``min(limit, G)`` continuations for ``key``, most recent first.

        ``key``: a token (``context=1``) or the last ``context`` tokens.
        """
        return [value for value, _ in self.get_sourced(key, limit)]

    def get_sourced(self, key: int | Sequence[int], limit: int) -> list[tuple[tuple[int, ...], int]]:
        """:meth:`get` with each continuation's :class:`~.source.Source` (as stored: an int)."""
        k = self._lookup_key(key) if limit > 0 else None
        return self.get_named(k, limit) if k is not None else []

    def get_named(self, name: object, limit: int) -> list[tuple[tuple[int, ...], int]]:
        """:meth:`get_sourced` of the key named ``name`` (:func:`~.ngram_keys.key_name` of its
        ``context`` tokens, Python ints): a caller asking several pools names the text once."""
        if limit <= 0:
            return []
        table = self._table
        held = table.pop(name, None)
        if held is None:
            if self._prompt is None or name not in self._prompt:
                return []
            held = self._new_key(name)
        else:
            table[name] = held
        return [(value, entry & _SOURCE) for value, entry in held[: -limit - 1 : -1]]

    def support(self, key: int | Sequence[int], first: int) -> int:
        """How many times n-grams stored under ``key`` that begin with ``first`` were added
        (the evidence that ``first`` follows ``key``; 0 if none).  Does not touch the LRU order."""
        k = self._lookup_key(key)
        held = self._table.get(k) if k is not None else None
        if held is None:  # a seeded key not touched yet: read, left for its first touch
            said = self._prompt.peek(k) if self._prompt is not None and k is not None else None
            if said is None:
                return 0
            held = self._replay(said)
        return sum(entry >> _COUNT_SHIFT for value, entry in held if value[0] == first)

    def _lookup_key(self, key: int | Sequence[int]) -> object | None:
        """The table key for ``key`` (a token, or the last ``context`` tokens of a sequence)."""
        if self.context == 1:
            return int(key if isinstance(key, (int, np.integer)) else key[-1])
        if isinstance(key, (int, np.integer)) or len(key) < self.context:
            return None
        return self._key(key[len(key) - self.context :])

    def keys(self) -> list[tuple[int, ...]]:
        """The keys stored so far, least recent first, as tokens (a seeded text's keys not
        touched yet left out)."""
        return [key_tokens(name, self.context) if self.context > 1 else (name,) for name in self._table]

    def __len__(self) -> int:
        return self._count + (self._prompt.num_ngrams if self._prompt is not None else 0)

    @property
    def num_keys(self) -> int:
        return len(self._table) + (len(self._prompt) if self._prompt is not None else 0)


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

    @classmethod
    def for_config(cls, config: LookaheadConfig) -> SharedPools:
        """Shared pools shaped like every request's text pools under ``config``."""
        return cls(config.ngram_size, config.guess_set_size, config.max_pool_keys, config.lookup_context)

    def add_sequence(self, tokens: Sequence[int], start: int = 0) -> None:
        for pool in self.pools.values():
            pool.add_sequence(tokens, start=start, source=Source.SHARED)

    @property
    def num_ngrams(self) -> int:
        return sum(len(pool) for pool in self.pools.values())
