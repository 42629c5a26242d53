"""Every live request's own pools in one list: a step's learning and lookups in one compiled call each.

A request's pools (:class:`~.request_text.RequestText`) learn its new tokens and answer its
lookups in compiled loops (:mod:`.ngram_table`), one call per request and phase: at a few dozen
proposing requests a step makes ~40 such calls, each a few microseconds of interpreter and
argument unboxing around well under a microsecond of compiled work.  :class:`PoolBatch` keeps the
arrays of every admitted request's pools in one numba typed list -- a block of entries per
request, an entry rewritten when its pool's arrays grow (:attr:`~.pool.NgramPool.on_grow`) -- so
a step learns every observing request's new tokens in one call, reading them from the engine's
token array (:meth:`PoolBatch.learn`), and asks every proposing request's pools in two
(:meth:`PoolBatch.step_candidates`: the lookups, then the leads' growth), with every request's
choice of its lead's length between them in one more (the draft rule's,
:func:`~.draft_rule.own_lead_lengths`, from each request's records).

What a request learns and is answered is what its own calls give: the same n-grams in the same
order into the same pools, the same lookups in the same order (requests' pools are independent,
so the order across requests does not matter).  The per-request path
(:meth:`~.request.RequestLookahead.step_candidates`, :meth:`~.request.RequestLookahead.observe`
with ``learn=True``) is the reference, and remains the path of requests the batch does not
admit: those whose pools are shaped by their own settings, and every request of an engine with
``shared_pool`` (the shared pools are asked between a request's own).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .draft_rule import NO_EVIDENCE, LeadEvidence, own_lead_lengths
from .mode import DraftMode
from .ngram_table import load, new_meta
from .plan_loop import load as plan_loops
from .pool import _empty_table
from .request import RequestLookahead, StepCandidates
from .request_text import Lookup, RequestText
from .source import Source

if TYPE_CHECKING:
    from vllm_lookahead.config import LookaheadConfig


def _shape(config: LookaheadConfig) -> tuple:
    """What a request's pools must share with the batch's to be asked with them."""
    return (
        config.ngram_size,
        config.guess_set_size,
        config.lookup_context,
        config.max_pool_keys,
        config.ablation.pool_from_output,
    )


class PoolBatch:
    """The admitted requests' pools in one list (see the module docstring)."""

    # Proposing requests from which a step goes through the batch: its calls and their arrays
    # cost ~40 us more than one request's own calls (2-core CPU), and save ~10 us per request.
    FROM = 4

    def __init__(self, config: LookaheadConfig) -> None:
        self.config = config
        self._shape = _shape(config)
        self.width = config.lookup_context  # pools per request: its own, longest context first
        self._loops = load()
        G = max(1, config.guess_set_size)
        self._empty = (*_empty_table(1, G, config.ngram_size - 1), new_meta())  # a free entry
        self._empties = (self._empty,) * self.width  # a free block
        self._tables: Any = None  # numba typed List of pool arrays, made with the first request
        self._free: list[int] = []  # first entries of released blocks
        self._resume = np.zeros(3, dtype=np.int64)
        self._rows = G * self.width  # a lookup's answer: at most G continuations per pool

    def __len__(self) -> int:
        """Entries in the list (a block of :attr:`width` per request admitted, free ones included)."""
        return 0 if self._tables is None else len(self._tables)

    def admits(self, text: RequestText) -> bool:
        """Whether ``text``'s pools can be learnt into and asked with the batch's."""
        return text.shared is None and _shape(text.config) == self._shape and self.config.guess_set_size > 0

    def add(self, text: RequestText) -> bool:
        """Admit ``text``'s pools (if :meth:`admits`); returns whether they were."""
        if text.batch_at is not None or not self.admits(text):
            return text.batch_at is not None
        if self._tables is None:
            from numba import typed, typeof

            self._tables = typed.List.empty_list(typeof(self._empty))
        at = self._free.pop() if self._free else len(self._tables)
        self._put(at, text)
        for pool in text.pools():
            pool.on_grow = functools.partial(self._put, at, text)
        text.batch_at = at
        return True

    def _put(self, at: int, text: RequestText) -> None:
        """``text``'s pools' arrays as the block at ``at`` (admitted, or one of its pools grew: its
        entry follows), in one compiled call of the one signature compiled at start-up."""
        self._loops.put_block(self._tables, at, tuple(pool.table for pool in text.pools()))

    def remove(self, text: RequestText) -> None:
        """Release ``text``'s block (a finished request): its pools are no longer referenced here."""
        at = text.batch_at
        if at is None:
            return
        for pool in text.pools():
            pool.on_grow = None
        self._loops.put_block(self._tables, at, self._empties)
        self._free.append(at)
        text.batch_at = None

    def learn(
        self,
        texts: Sequence[RequestText],
        tokens: np.ndarray,
        rows: Sequence[int],
        starts: Sequence[int],
        lengths: Sequence[int],
    ) -> None:
        """Each admitted ``texts[k]`` learns the n-grams of ``tokens[rows[k], :lengths[k]]`` that end
        at an index >= ``starts[k]`` (what :meth:`.RequestText.learn` of that text's tail learns),
        in one call; pools whose arrays fill up grow on the way."""
        if not texts or not self.config.ablation.pool_from_output:
            return
        learns = np.array([[text.batch_at for text in texts], rows, starts, lengths], dtype=np.int64)
        resume = self._resume
        resume[:] = 0
        while not self._loops.learn_rows(
            self._tables, learns, self.width, tokens, self.config.max_pool_keys, int(Source.OUTPUT), resume
        ):
            r, p = int(resume[0]), int(resume[1])
            texts[r].pools()[p].make_room(int(learns[3, r] - learns[2, r]))

    def step_candidates(
        self,
        asks: Sequence[tuple[RequestLookahead, int, int, int, int, int | None, float]],
        tokens: np.ndarray,
    ) -> list[StepCandidates]:
        """:meth:`.RequestLookahead.step_candidates` of each ask ``(state, row, length, root, room,
        max_candidates, min_gain)`` -- its recent text the end of ``tokens[row, :length]`` -- for
        admitted states, with every lookup in one call and every lead's growth in another."""
        if not asks:
            return []
        where, found, found_sources, answers = self.lookups(asks, tokens)
        looks = []  # each request's candidates and its lookup
        for (state, *_, max_candidates, _), (n, first, support), out, sources in zip(
            asks, answers.tolist(), found, found_sources
        ):
            looked = state.text.answer(out, sources, n, first, support)
            looks.append((looked.found if max_candidates is None else looked.found[:max_candidates], looked))
        return self._leads(where, found, found_sources, self._lead_requests(asks, looks))

    def lookups(self, asks: Sequence[tuple], tokens: np.ndarray) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray]:
        """Every ask's lookup in one call (``asks[r]``: its state, row and length in ``tokens``,
        root, as :meth:`step_candidates` takes them): where they asked (the arguments :meth:`grow`
        reads again), and per ask its continuations (``found[r, :n]``, int32 rows of ``N - 1``
        tokens), their sources, and ``answers[r]`` = (``n``, the pool of the first one, its
        support) (:meth:`.RequestText.answer`)."""
        R = len(asks)
        # every request's numbers in one array (a compiled call's arguments cost per call): at, row, length, root
        at = [a[0].text.batch_at for a in asks]
        each = np.array([at, [a[1] for a in asks], [a[2] for a in asks], [a[3] for a in asks]], dtype=np.int64)
        where = (self._tables, each, self.width, tokens, self.config.lookup_context)
        found = np.zeros((R, self._rows, self.config.ngram_size - 1), dtype=np.int32)
        found_sources = np.zeros((R, self._rows), dtype=np.int64)
        answers = np.zeros((R, 3), dtype=np.int64)
        self._loops.lookup_rows(*where, self.config.guess_set_size, found, found_sources, answers)
        return where, found, found_sources, answers

    def draft_rows(
        self,
        ints: list[int],
        floats: np.ndarray,
        head: tuple[float, ...],
        logit_tables: np.ndarray,
        tokens: np.ndarray,
        xs: np.ndarray,
        ys: np.ndarray,
        most: int,
    ) -> tuple[np.ndarray, ...]:
        """A batch step's lookups, leads and plan in one compiled call (:func:`.plan_loop.draft_rows`:
        ``ints`` its per-request integer columns, flat, ``floats`` its float ones ``(R, 6)``; ``head``
        its rule's numbers before the batch's own; ``most``: the longest lead asked for).  Returns
        the lookups' continuations, their
        sources, per request (``n``, first pool, support, ``t``, ``d``: :meth:`lookups` and
        :meth:`grow`), the leads' odds, the grown rows, their sources and the plan ``(3, R)``."""
        R = len(ints) // 9
        L = self.config.ngram_size - 1
        context = self.config.lookup_context
        found = np.zeros((R, self._rows, L), dtype=np.int32)
        found_sources = np.zeros((R, self._rows), dtype=np.int64)
        answers = np.zeros((R, 5), dtype=np.int64)
        odds = np.zeros((R, 2), dtype=np.float64)
        buf = np.zeros((R, context + most), dtype=np.int64)
        sources = np.zeros((R, most), dtype=np.int64)
        plans = np.zeros((3, R), dtype=np.int64)
        plan_loops().draft_rows(
            self._tables,
            np.array(ints, dtype=np.int64).reshape(R, 9),
            floats,
            np.array((*head, self.width, context, self.config.guess_set_size), dtype=np.float64),
            logit_tables,
            tokens,
            xs,
            ys,
            found,
            found_sources,
            answers,
            odds,
            buf,
            sources,
            plans,
        )
        return found, found_sources, answers, odds, buf, sources, plans

    def grow(
        self, where: tuple, found: np.ndarray, found_sources: np.ndarray, lengths: Sequence[int]
    ) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        """Each ask's lead (:meth:`lookups`' first continuation) cut or grown to ``lengths[r]``
        tokens, in one call: per ask ``(t, d)``, a row whose ``[t : t + d]`` is the lead, and its
        tokens' sources (``[:d]``), as lists (a lead is a few tokens: a numpy slice per row costs
        more)."""
        want = np.array(lengths, dtype=np.int64)
        most = max(1, max(lengths))
        R = len(lengths)
        buf = np.zeros((R, self.config.lookup_context + most), dtype=np.int64)
        sources = np.zeros((R, most), dtype=np.int64)
        grown = np.zeros((R, 2), dtype=np.int64)
        self._loops.grow_rows(*where, found, found_sources, want, buf, sources, grown)
        return grown.tolist(), buf.tolist(), sources.tolist()

    @staticmethod
    def _lead_requests(asks: Sequence[tuple], looks: list[tuple[list, Lookup]]) -> list[tuple]:
        """:meth:`.RequestLookahead.lead_request` of each ask: its candidates, its lead's length,
        evidence and odds -- under the draft rule all in one compiled call (the pools asked are the
        requests' own: no lead is the shared pool's)."""
        lengths, odds = own_lead_lengths(
            [ask[0].acceptance.lead for ask in asks],
            [looked.context for _, looked in looks],
            [looked.support for _, looked in looks],
            [ask[4] for ask in asks],
            [ask[6] for ask in asks],
            [ask[0].config.lead_tokens for ask in asks],
        )
        leads = []
        for (state, _, _, _, room, _, min_gain), (cands, looked), length, lead_odds in zip(asks, looks, lengths, odds):
            if state.config.mode is not DraftMode.AUTO:
                leads.append((cands, *state.lead_request(cands, looked, room, min_gain)))
            elif cands and room > 0:
                evidence = LeadEvidence(looked.context, max(1, looked.support), False)
                leads.append((cands, length, evidence, tuple(lead_odds)))
            else:
                leads.append((cands, 0, NO_EVIDENCE, None))
        return leads

    def _leads(self, where: tuple, found: np.ndarray, found_sources: np.ndarray, leads: list) -> list[StepCandidates]:
        """:meth:`step_candidates`' leads grown in one call, and each request's candidates."""
        out = []
        grown, bufs, sources = self.grow(where, found, found_sources, [lead[1] for lead in leads])
        for (cands, _, evidence, odds), (t, d), root, text, lead_sources in zip(
            leads, grown, where[1][3].tolist(), bufs, sources
        ):
            lead = tuple(text[t : t + d])
            out.append(RequestLookahead.candidates(root, cands, lead, lead_sources[:d], evidence, odds))
        return out


def compile_batch(config: LookaheadConfig) -> None:
    """Compile the batch's loops and its list's operations for ``config`` at start-up (numba;
    cached on disk after the first time), on a throwaway request learning and asking through
    a batch as a step does, under the draft rule its drafts too (the engine's token array: int32)."""
    prompt = [*range(3 * config.ngram_size)] * 2
    state = RequestLookahead(config, prompt, seed=0)
    batch = PoolBatch(config)
    if not batch.add(state.text):
        return
    tokens = np.array([[*prompt, *range(3 * config.ngram_size)]], dtype=np.int32)
    end = tokens.shape[1]
    batch.learn([state.text], tokens, [0], [len(prompt)], [end])
    batch.step_candidates([(state, 0, end, int(tokens[0, -1]), config.ngram_size + 1, None, 0.0)], tokens)
    if config.mode is DraftMode.AUTO:  # the rule's step through the batch (batch_step imports this module)
        from .batch_step import StepAsk, draft_batch
        from .step_cost import StepCost

        ask = StepAsk(state, 0, end, int(tokens[0, -1]), config.ngram_size + 1, None)
        draft_batch(batch, [ask], tokens, 0.0, StepCost.linear(0.01, 1e-4, tree_row=1e-4))
    batch.remove(state.text)
