"""The n-gram pool: candidate continuations for the verification branch.

Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057, Sec. 3.2) caches the
n-grams produced by the Jacobi window (and, optionally, the prompt and the
accepted output) keyed by their first token.  At each step the n-grams whose
key equals the last accepted token are verified in parallel; up to ``G``
(the guess set size) candidates are kept per key.

Both levels are LRU: per key the most recently (re-)added continuation wins,
and the key table itself is bounded by ``max_keys`` so memory stays constant on
long generations.  Every operation is O(1) (amortised) -- ``add_sequence``
costs O(number of new n-grams), so incremental learning never rescans history.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class NgramPool:
    """LRU map ``first token -> up to G continuations of N - 1 tokens``."""

    def __init__(self, ngram_size: int, guess_set_size: int, max_keys: int = 65536) -> None:
        if ngram_size < 2:
            raise ValueError("ngram_size must be >= 2")
        if guess_set_size < 0:
            raise ValueError("guess_set_size must be >= 0")
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        self.max_keys = max_keys
        self._table: OrderedDict[int, OrderedDict[tuple[int, ...], None]] = OrderedDict()
        self._count = 0

    def add(self, ngram: Sequence[int]) -> None:
        """Store ``ngram[1:]`` under key ``ngram[0]`` as the most recent value."""
        if len(ngram) != self.ngram_size:
            raise ValueError(f"n-gram of length {len(ngram)}, expected {self.ngram_size}")
        if self.guess_set_size == 0:
            return
        key = int(ngram[0])
        value = tuple(int(t) for t in ngram[1:])
        values = self._table.get(key)
        if values is None:
            if len(self._table) >= self.max_keys:
                _, evicted = self._table.popitem(last=False)
                self._count -= len(evicted)
            values = OrderedDict()
            self._table[key] = values
        else:
            self._table.move_to_end(key)
        if value in values:
            values.move_to_end(value)
            return
        values[value] = None
        self._count += 1
        if len(values) > self.guess_set_size:
            values.popitem(last=False)
            self._count -= 1

    def add_sequence(self, tokens: Sequence[int], start: int = 0) -> None:
        """Add every n-gram ``tokens[p:p+N]`` that ends at an index >= ``start``."""
        n = self.ngram_size
        for p in range(max(0, start - n + 1), len(tokens) - n + 1):
            self.add(tokens[p : p + n])

    def get(self, key: int, limit: int) -> list[tuple[int, ...]]:
        """At most ``min(limit, G)`` continuations for ``key``, most recent first."""
        values = self._table.get(int(key))
        if values is None or limit <= 0:
            return []
        self._table.move_to_end(int(key))
        result: list[tuple[int, ...]] = []
        for value in reversed(values):
            if len(result) >= limit:
                break
            result.append(value)
        return result

    def __len__(self) -> int:
        return self._count

    @property
    def num_keys(self) -> int:
        return len(self._table)
