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
from typing import TYPE_CHECKING

import numpy as np

from .pool import NgramPool, SharedPools, int_array, int_list
from .source import Source

if TYPE_CHECKING:  # the parameters: a validated config (pydantic, no engine)
    from vllm_lookahead.config import LookaheadConfig


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
            prompt = int_array(prompt_token_ids)
            for pool in self.pools():
                pool.add_sequence(prompt, source=Source.PROMPT)
        self.known = len(prompt_token_ids)  # tokens of the sequence the pools have seen
        self.prompt_len = len(prompt_token_ids)

    def pools(self) -> list[NgramPool]:
        """The request's own pools, longest context first."""
        return [*self.context_pools, self.pool]

    @property
    def pool_ngrams(self) -> int:
        """N-grams this request's pools hold (O(pools), not O(pool size))."""
        return sum(len(pool) for pool in self.pools())

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

    # -- lookups ---------------------------------------------------------------------------
    def candidates(self, recent: Sequence[int], limit: int | None = None) -> list[tuple[int, ...]]:
        """Up to ``limit`` (default ``G``) distinct continuations for ``recent`` (ends with the root),
        longest context first."""
        return [c for c, _ in self.sourced_candidates(recent, limit)]

    def sourced_candidates(self, recent: Sequence[int], limit: int | None = None) -> list[tuple[tuple[int, ...], int]]:
        """:meth:`candidates` with the :class:`~.source.Source` of each (the first pool's that has it)."""
        return self.lookup(recent, limit)[0]

    def lookup(
        self, recent: Sequence[int], limit: int | None = None
    ) -> tuple[list[tuple[tuple[int, ...], int]], NgramPool | None]:
        """:meth:`sourced_candidates` and the pool the first one came from (None: nothing found).
        ``recent``: a list of Python ints, or any sequence of tokens."""
        limit = self.config.guess_set_size if limit is None else limit
        out: list[tuple[tuple[int, ...], int]] = []
        seen: set[tuple[int, ...]] = set()
        first_pool = None
        text = np.array(self._ints(recent), dtype=np.int64)
        for pool in self._lookup_pools():
            if len(out) >= limit:
                break
            if len(text) < pool.context:
                continue
            for cont, source in pool.get_after(text, limit):
                if cont not in seen:
                    seen.add(cont)
                    out.append((cont, source))
                    first_pool = first_pool or pool
                    if len(out) >= limit:
                        break
        return out, first_pool

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
        """:meth:`lead_candidate` and the source of each of its tokens."""
        draft = list(first[:length])
        sources = [source] * len(draft)
        context = self.config.lookup_context
        text = self._ints(recent)
        while len(draft) < length:
            more = self._most_recent([*text, *draft][-context:])
            if more is None:
                break
            piece = more[0][: length - len(draft)]
            draft.extend(piece)
            sources.extend([more[1]] * len(piece))
        return tuple(draft), sources

    def _most_recent(self, tokens: list[int]) -> tuple[tuple[int, ...], int] | None:
        """The most likely continuation of ``tokens`` (Python ints) with its source: ``lookup(tokens,
        1)``'s one answer (the same pools asked in the same order), without its bookkeeping."""
        text = np.array(tokens, dtype=np.int64)
        for pool in self._lookup_pools():
            if len(text) >= pool.context:
                found = pool.first_after(text)
                if found is not None:
                    return found
        return None

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
            for pool in self.pools():
                pool.add_sequence(tail, start=start)
        self._share(tail, start, length)
        self.known = length

    def catch_up(self, history: Sequence[int]) -> None:
        """Learn every token of ``history`` the pools have not seen yet (none, one or many)."""
        num_new = len(history) - self.known
        self.known = len(history)
        if num_new <= 0 or not (self.config.ablation.pool_from_output or self.shared is not None):
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
