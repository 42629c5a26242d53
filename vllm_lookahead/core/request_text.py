"""The n-gram pools of one request's own text, and the lookups a draft is made of.

:class:`RequestText` holds what a request knows of its text: the pool keyed by the last token
(fed by the prompt, the output and the Jacobi window's n-grams), the pools keyed by the last
``k = lookup_context .. 2`` tokens, and (``shared_pool``) the engine's pools of other requests'
outputs, consulted after the request's own at each context length.  It answers the lookups a
step's candidates are made of -- the continuations of the recent text, longest context first,
and the lead grown by looking up its own text -- and learns new tokens as they are emitted.

What it stores changes with the text; how a step turns its answers into a tree, and what the
draft rule makes of them, lives in :class:`~.request.RequestLookahead`.  Each lookup costs
O(``G`` x pools); learning O(new tokens); never O(pool size) or O(sequence length).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .ngram_table import load
from .pool import NgramPool, SharedPools, add_to_each, int_array, int_list
from .source import Source

if TYPE_CHECKING:  # the parameters: a validated config (pydantic, no engine)
    from vllm_lookahead.config import LookaheadConfig


class Lookup(NamedTuple):
    """:meth:`RequestText.lookup`'s answer."""

    found: list[tuple[tuple[int, ...], int]]  # distinct continuations and their Source, most likely first
    context: int  # tokens the first one's key matched (0: nothing found)
    support: int  # times n-grams after that key beginning with the first one's first token were added


class RequestText:
    """The pools of one request's text (see the module docstring)."""

    def __init__(
        self, config: LookaheadConfig, prompt_token_ids: Sequence[int], shared: SharedPools | None = None
    ) -> None:
        self.config = config
        self.shared = shared  # other requests' output n-grams (``shared_pool``), consulted after ours
        self.pool = NgramPool(config.ngram_size, config.guess_set_size, config.max_pool_keys)
        # Text pools keyed by the last k = lookup_context..2 tokens (longest first).
        self.context_pools = [
            NgramPool(config.ngram_size, config.guess_set_size, config.max_pool_keys, context=k)
            for k in range(config.lookup_context, 1, -1)
        ]
        if config.ablation.pool_from_prompt:
            add_to_each(self.pools(), prompt_token_ids, 0, Source.PROMPT, unlocked=True)
        self._own = self.pools()
        self._asked = self._lookup_pools()  # the pools a lookup asks, in order
        self._loops = load()
        # a lookup's answer: at most G distinct continuations from each pool asked
        rows = max(1, config.guess_set_size) * len(self._asked)
        self._found = np.zeros((rows, config.ngram_size - 1), dtype=np.int32)
        self._found_sources = np.zeros(rows, dtype=np.int64)
        self.batch_at: int | None = None  # its pools' first entry in a PoolBatch (None: not in one)
        self.known = len(prompt_token_ids)  # tokens of the sequence the pools have seen
        self.prompt_len = len(prompt_token_ids)

    def pools(self) -> list[NgramPool]:
        """The request's own pools, longest context first."""
        return [*self.context_pools, self.pool]

    @property
    def pool_ngrams(self) -> int:
        """N-grams this request's pools hold (O(pools), not O(pool size))."""
        return sum([len(pool) for pool in self._own])

    def _lookup_pools(self) -> list[NgramPool]:
        """The pools candidates are looked up in: longest context first; at each context length
        this request's own pool, then the shared one."""
        if self.shared is None:
            return self.pools()
        out = []
        for pool in self.pools():
            out.append(pool)
            shared = self.shared.pools.get(pool.context)
            if shared is not None:
                out.append(shared)
        return out

    def _tables(self) -> tuple[tuple[np.ndarray, ...], ...]:
        """The arrays of :meth:`_lookup_pools`, as the compiled lookups read them (taken afresh
        each time: a pool's arrays are replaced when it grows)."""
        return tuple(pool.table for pool in self._asked)

    # -- lookups ---------------------------------------------------------------------------
    def candidates(self, recent: Sequence[int], limit: int | None = None) -> list[tuple[int, ...]]:
        """Up to ``limit`` (default ``G``) distinct continuations for ``recent`` (ends with the root),
        longest context first."""
        return [c for c, _ in self.lookup(recent, limit).found]

    def lookup(self, recent: Sequence[int], limit: int | None = None) -> Lookup:
        """Up to ``limit`` (default ``G``) distinct continuations for ``recent`` (ends with the
        root), longest context first, each with its :class:`~.source.Source` (the first pool's
        that has it), and where the first was found (:class:`Lookup`): one compiled call over
        every pool asked."""
        limit = self.config.guess_set_size if limit is None else limit
        text = int_array(self._ints(recent))
        n, first, support = self._loops.lookup_pools(
            self._tables(), text, min(limit, len(self._found)), self._found, self._found_sources
        )
        return self.answer(self._found, self._found_sources, n, first, support)

    def answer(self, found: np.ndarray, sources: np.ndarray, n: int, first: int, support: int) -> Lookup:
        """The :class:`Lookup` a compiled lookup over :meth:`_lookup_pools` wrote: ``n`` rows of
        ``found`` / ``sources``, the first from pool ``first`` with ``support``."""
        if not n:
            return Lookup([], 0, 0)
        rows = list(zip(map(tuple, found[:n].tolist()), sources[:n].tolist()))
        return Lookup(rows, self._asked[first].context, support)

    def lead_candidate(self, first: tuple[int, ...], recent: Sequence[int], length: int) -> tuple[int, ...]:
        """``first`` cut or grown to ``length`` tokens.

        Growing asks the pools again for the continuation of the text drafted so
        far (the last ``lookup_context`` tokens of ``recent + draft``), until
        ``length`` tokens or the pools have nothing: at most ``length / (N - 1)``
        lookups, independent of pool size and sequence length.
        """
        return self.grow_lead(first, Source.OUTPUT, recent, length)[0]

    def grow_lead(
        self, first: tuple[int, ...], source: int, recent: Sequence[int], length: int
    ) -> tuple[tuple[int, ...], list[int]]:
        """:meth:`lead_candidate` and the source of each of its tokens (one compiled call)."""
        text = self._ints(recent)
        start = first[:length]
        if len(start) >= length:
            return tuple(start), [source] * len(start)
        t = len(text)
        buf = np.empty(t + length, dtype=np.int64)
        buf[:t] = text
        buf[t : t + len(start)] = start
        sources = np.full(length, source, dtype=np.int64)
        d = self._loops.grow_lead(self._tables(), self.config.lookup_context, buf, t, len(start), length, sources)
        return tuple(buf[t : t + d].tolist()), sources[:d].tolist()

    def _ints(self, recent: Sequence[int]) -> list[int]:
        """The last ``lookup_context`` tokens of ``recent`` as Python ints (a list is taken to hold them)."""
        context = self.config.lookup_context
        return recent[-context:] if isinstance(recent, list) else int_list(recent[max(0, len(recent) - context) :])

    # -- learning --------------------------------------------------------------------------
    def tail(self, num_new: int, history: Sequence[int]) -> tuple[np.ndarray, int]:
        """The end of ``history`` that new n-grams can touch (int64), and where the new tokens start in it."""
        span = self.config.lookup_context + self.config.ngram_size - 1
        length = min(len(history), num_new + span - 1)
        return int_array(history[len(history) - length :]), length - num_new

    def learn(self, tail: np.ndarray, start: int, length: int) -> None:
        """The n-grams of ``tail`` (the end of a sequence of ``length`` tokens, new tokens from
        ``start``) into the text pools (unless the ablation's ``pool_from_output`` is off) and the shared ones."""
        if self.config.ablation.pool_from_output:
            add_to_each(self._own, tail, start)
        self._share(tail, start, length)
        self.known = length

    def catch_up(self, history: Sequence[int], learn: bool = True) -> None:
        """Learn every token of ``history`` the pools have not seen yet (none, one or many;
        ``learn`` False: only count them as seen, the caller learns them)."""
        num_new = len(history) - self.known
        self.known = len(history)
        if not learn or num_new <= 0 or not (self.config.ablation.pool_from_output or self.shared is not None):
            return
        tail, start = self.tail(num_new, history)
        self.learn(tail, start, len(history))

    def _share(self, tail: np.ndarray, start: int, length: int) -> None:
        """Give the shared pools the n-grams of ``tail`` (the end of a sequence of ``length``
        tokens) that lie wholly in the output: prompts are never shared."""
        if self.shared is None:
            return
        first_output = max(0, self.prompt_len - (length - len(tail)))
        self.shared.add_sequence(tail[first_output:], start=max(0, start - first_output))


def compile_pools(config: LookaheadConfig) -> None:
    """Compile the pools' loops (numba; cached on disk after the first time) at start-up, not in
    the first step that learns or looks up: every call a step makes, on a throwaway request's
    pools shaped by ``config`` (the lookups over several pools are compiled for their number),
    and a batch's (:func:`~.pool_batch.compile_batch`)."""
    from .pool_batch import compile_batch

    compile_batch(config)
    shared = SharedPools.for_config(config) if config.shared_pool else None
    text = RequestText(config, list(range(3 * config.ngram_size)) * 2, shared)
    text.catch_up([*range(3 * config.ngram_size)] * 3)
    found = text.lookup([0, 1, 2][-config.lookup_context :], None).found
    text.grow_lead(found[0][0] if found else (), Source.PROMPT, [0], config.ngram_size + 1)
    pool = text.pool
    pool.add_rows(np.zeros((1, pool.span), dtype=np.int64))
    pool.get_after(np.zeros(1, dtype=np.int64), 1)
    pool.support(0, 0)
    pool.keys()
