"""Per-request Lookahead Decoding state, free of any inference engine.

One decode step of Lookahead Decoding (Fu et al., 2024, arXiv:2402.02057,
Alg. 2) for one request is:

1. :meth:`RequestLookahead.step_candidates` and :meth:`RequestLookahead.build`
   (sized for the whole batch by :func:`~vllm_lookahead.core.drafting.draft_step`)
   -- build the token tree from the last accepted token: the *verification
   branch* (up to ``G`` pool n-grams keyed by that token) first, then the
   *lookahead branch* (the Jacobi window).
   Candidates whose preceding text matches more of the recent tokens come
   first (``lookup_context``).  The first (*lead*) candidate may grow past
   ``N - 1`` tokens (``max_lead_tokens``): it is extended by asking the pools
   again with its own text -- under the draft rule as far as allowed, the rule
   cutting it where its tokens stop paying; under a fixed cap while the request
   keeps accepting it in full (:mod:`~vllm_lookahead.core.draft_length`).  An optional token
   budget per step cuts the tree: the lead to what fits, the other candidates
   in order while they fit whole, then the whole window if it fits (a window
   left out this step simply waits; it is never run in part).
2. The engine runs the tree in one target forward and accepts the longest
   greedily-matching path (see :func:`~vllm_lookahead.core.verify.greedy_verify`).
3. :meth:`RequestLookahead.observe` -- advance the window with the argmax at
   its output nodes, feed the n-grams it produced to the pool and (optionally)
   learn the n-grams of the newly accepted output; the lead length follows
   what was accepted.

The parameters are the validated :class:`~vllm_lookahead.config.LookaheadConfig`
(read-only here; ``LookaheadConfig()`` = the shipped defaults).  The engine glue
only moves tokens and argmax arrays in and out; all decisions live here.  Per-step cost is bounded by the tree
size and the number of new
tokens -- never by the pool size or the sequence length.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .draft_length import DraftLength
from .draft_rule import (
    NO_EVIDENCE,
    Acceptance,
    DraftOptions,
    LeadConfidence,
    LeadEvidence,
    PooledConfidence,
    StepOptions,
)
from .mode import DraftMode
from .pool import SharedPools, int_list
from .request_text import Lookup, RequestText
from .source import Source
from .tree import DraftTree, _readonly, chains_tree
from .window import JacobiWindow

_SHARED = int(Source.SHARED)  # a found continuation's source, as lookups give it (an int)

if TYPE_CHECKING:  # the parameters: a validated config (pydantic, no engine)
    from vllm_lookahead.config import LookaheadConfig


_NO_NODES = np.zeros(0, dtype=np.int64)
_NO_NODES.setflags(write=False)
_ROOT_SOURCES = np.zeros(1, dtype=np.int8)  # the root's Source (0)
_ROOT_SOURCES.setflags(write=False)
_WINDOW = int(Source.WINDOW)  # a Source as a plain int, for the walks over lists


@functools.lru_cache(maxsize=1024)
def _chain_sources(sources: tuple[int, ...]) -> np.ndarray:
    """A lead chain's node sources: the root's (0), then its tokens' (read-only, shared by every
    chain of those sources: a lead's tokens mostly share one source, so a few dozen arrays)."""
    return _readonly(np.array([0, *sources], dtype=np.int8))


# not frozen: made per request and step, where a frozen dataclass's init costs 2-3x (design.md, "A step's records")
@dataclass(eq=False, slots=True)
class StepDraft:
    tree: DraftTree
    window_nodes: np.ndarray  # (W,) output node ids of the window; (0,) if left out this step
    num_candidates: int  # pool n-grams put in the verification branch
    lead_tokens: int = 0  # draft tokens of the first candidate (extended past N - 1 when it may grow)
    sources: np.ndarray | None = None  # int8 (tree.size,): each node's Source (None: not tracked)
    window_start: int | None = None  # first node of the lookahead branch (None: left out this step)
    shadow_token: int = -1  # the first lead token the draft rule left out (-1: none)
    lead_evidence: LeadEvidence = NO_EVIDENCE  # where the lead was found (for the acceptance record)
    window_sourced: bool = False  # some node's Source is the window (its branch, or a pool n-gram it made)

    @property
    def window_columns(self) -> int:
        """Window columns this tree runs (their output nodes are >= 0)."""
        return int((self.window_nodes >= 0).sum())


# not frozen: made per request and step, where a frozen dataclass's init costs 2-3x (design.md, "A step's records")
@dataclass(slots=True)
class StepCandidates:
    """What the pools offer below one root this step, before a tree is built."""

    root: int
    lead: tuple[int, ...]  # the lead candidate, grown to the request's lead length (or cut to the room)
    lead_sources: list[int]
    others: list[tuple[tuple[int, ...], int]]  # further candidates (and their Source), most likely first
    lead_evidence: LeadEvidence = NO_EVIDENCE  # where the lead was found (the rule's confidence in it)
    lead_odds: tuple[float, float] | None = None  # the rule's LeadConfidence.odds of it (None: not asked)


class RequestLookahead:
    """One request's drafting: its Jacobi window, its text's pools (:attr:`text`,
    :class:`~.request_text.RequestText`), how its drafts were accepted (the lead's length, the
    draft rule's estimates), and the step built from them (candidates, tree, observation)."""

    def __init__(
        self,
        config: LookaheadConfig,
        prompt_token_ids: Sequence[int],
        seed: int,
        shared: SharedPools | None = None,
        pooled: PooledConfidence | None = None,
    ) -> None:
        self.config = config
        self.text = RequestText(config, prompt_token_ids, shared)  # its pools: lookups and learning
        self.rng = np.random.default_rng(seed)
        # W = 0: no lookahead branch (the verification branch alone, from the text pools).
        self.window = (
            JacobiWindow(
                config.window_size,
                config.ngram_size,
                prompt_token_ids,
                self.rng,
                shift=config.ablation.window_shift,
            )
            if config.window_size
            else None
        )
        self.lead_length = DraftLength(config.ngram_size - 1, config.lead_tokens)
        # what this request's drafts have been accepted at (draft rule), its leads' estimates
        # shifted by ``pooled`` (how the engine's drafted leads of the same kind fared against them)
        self.acceptance = Acceptance(lead=LeadConfidence(pooled=pooled))
        self._unsent: StepDraft | None = None  # last build, if it drafted nothing but had a lead

    @property
    def window_tokens(self) -> int:
        """Tree nodes the window adds this step (root excluded)."""
        return self.config.window_size * self.window.filled - 1 if self.window is not None else 0

    def step_candidates(
        self,
        root_token: int,
        recent: Sequence[int] = (),
        room: int | None = None,
        max_candidates: int | None = None,
        min_gain: float = 0.0,
    ) -> StepCandidates:
        """The candidates below ``root_token`` (the last accepted token): the lead, grown to
        ``max_lead_tokens`` under the draft rule (which cuts it where its tokens stop paying) or
        to the request's lead length under a fixed cap
        (:class:`~vllm_lookahead.core.draft_length.DraftLength`), and cut to ``room``; then up
        to ``max_candidates - 1`` (default ``G - 1``) further ones; and the lead's evidence for
        the rule (the context length it was found after, its first token's support).

        ``recent``: the last tokens of the sequence, ending with ``root_token`` (only the last
        ``lookup_context`` are read).  ``min_gain``: under the draft rule, lead tokens expected to
        add less than this (:func:`~.draft_rule.lead_floor`) could never be chosen and are not
        looked up.
        """
        config = self.config
        recent = int_list(recent[max(0, len(recent) - config.lookup_context) :])
        if not recent or recent[-1] != int(root_token):
            recent = [int(root_token)]
        looked = self.text.lookup(recent)
        found = looked.found if max_candidates is None else looked.found[:max_candidates]
        length, evidence, odds = self.lead_request(found, looked, 1 << 30 if room is None else room, min_gain)
        lead, lead_sources = self.text.grow_lead(found[0][0], found[0][1], recent, length) if length else ((), [])
        return self.candidates(int(root_token), found, lead, lead_sources, evidence, odds)

    def lead_request(
        self, found: list[tuple[tuple[int, ...], int]], looked: Lookup, room: int, min_gain: float
    ) -> tuple[int, LeadEvidence, tuple[float, float] | None]:
        """:meth:`step_candidates`' lead: how many tokens its first continuation ``found[0]`` is
        cut or grown to (0: no lead), the evidence it was found on (``looked``) and the rule's odds
        of it."""
        if not found or room <= 0:
            return 0, NO_EVIDENCE, None
        config = self.config
        evidence = LeadEvidence(looked.context, max(1, looked.support), found[0][1] == _SHARED)
        if config.mode is not DraftMode.AUTO:
            # under a fixed cap its length follows what was accepted (DraftLength)
            return min(room, self.lead_length.current), evidence, None
        # Under the draft rule the lead is offered whole and the rule cuts it, one token more than
        # can pay: a left-out token is still checked against the emitted one.
        confidence = self.acceptance.lead
        odds = confidence.odds(evidence)
        above = confidence.tokens_above(evidence, min_gain, config.lead_tokens, odds)
        return min(room, config.lead_tokens, 1 + above), evidence, odds

    @staticmethod
    def candidates(
        root: int,
        found: list[tuple[tuple[int, ...], int]],
        lead: tuple[int, ...],
        lead_sources: list[int],
        evidence: LeadEvidence,
        odds: tuple[float, float] | None,
    ) -> StepCandidates:
        """:meth:`step_candidates`' answer: the lead grown from ``found[0]``, the rest of ``found``
        after it."""
        return StepCandidates(
            root, lead, lead_sources, found[1:] if lead else [], lead_evidence=evidence, lead_odds=odds
        )

    def draft_options(
        self, cands: StepCandidates, window: bool = True, fixed_seconds: float = 0.0, token_seconds: float = 0.0
    ) -> DraftOptions:
        """What the draft rule (:func:`~.draft_rule.plan_step`) may choose from for ``cands``,
        with this request's expected acceptance and its host prices, as one record (what
        :meth:`lay_out_options` lays out)."""
        step = StepOptions()
        self.lay_out_options(step, cands, window, fixed_seconds, token_seconds)
        return step.options(0)  # type: ignore[return-value]

    def lay_out_options(
        self, step: StepOptions, cands: StepCandidates, window: bool, fixed_seconds: float, token_seconds: float
    ) -> None:
        """Append this request's options for ``cands`` to the step's (:meth:`.StepOptions.add_request`).
        The lead's gains come from the odds its candidates were made with (:attr:`StepCandidates.lead_odds`):
        the records they rest on change only when a request observes a step, and the engine
        observes every request's step before it asks any request for candidates."""
        acc = self.acceptance
        odds = cands.lead_odds
        if odds is None:
            odds = acc.lead.odds(cands.lead_evidence) if cands.lead else (0.0, 0.0)
        columns = self.window
        step.add_request(
            odds,
            len(cands.lead),
            [len(c) for c, _ in cands.others],
            acc.candidate.value,
            columns.filled if window and columns is not None else 0,
            columns.window_size if window and columns is not None else 0,
            acc.window_column.value,
            fixed_seconds,
            token_seconds,
        )

    def build(
        self,
        cands: StepCandidates,
        lead: int | None = None,
        candidates: int | None = None,
        window_columns: int | None = 0,
        merge: bool | None = None,
        budget: int | None = None,
    ) -> StepDraft:
        """The tree of ``cands``: the lead cut to ``lead`` tokens, ``candidates`` further candidates
        (None: as many as fit ``budget`` whole, in order), the first ``window_columns`` window
        columns (None: the whole window if it fits ``budget``), at most ``budget`` draft nodes."""
        config = self.config
        room = budget if budget is not None else 1 << 30
        lead_tokens = cands.lead[: min(room, len(cands.lead) if lead is None else lead)]
        window = self.window if window_columns != 0 else None
        if not lead_tokens and (
            window is None or (window_columns is not None and window.tree_nodes(window_columns) == 0)
        ):
            shadow = int(cands.lead[0]) if cands.lead else -1
            return self.no_draft(cands.root, shadow, cands.lead_evidence, window_columns if window is not None else 0)
        if window is None and (candidates == 0 or not cands.others):
            k = len(lead_tokens)
            shadow = int(cands.lead[k]) if k < len(cands.lead) else -1
            return self.lead_draft(cands.root, lead_tokens, cands.lead_sources[:k], shadow, cands.lead_evidence)
        merge = config.ablation.merge_candidates if merge is None else merge
        tree, sources, used, window_start, window_nodes = self._tree(
            cands, lead_tokens, candidates, window, window_columns, bool(merge), int(room)
        )
        draft = StepDraft(
            tree=tree,
            window_nodes=window_nodes,
            num_candidates=used,
            lead_tokens=len(lead_tokens),
            sources=sources,
            window_start=window_start,
            shadow_token=int(cands.lead[len(lead_tokens)]) if len(lead_tokens) < len(cands.lead) else -1,
            lead_evidence=cands.lead_evidence,
            window_sourced=bool((sources == _WINDOW).any()),
        )
        # A draft with no tokens is never verified: catch_up checks its shadow token instead.
        self._unsent = draft if draft.tree.size == 1 and draft.shadow_token >= 0 else None
        return draft

    def _tree(
        self,
        cands: StepCandidates,
        lead_tokens: Sequence[int],
        candidates: int | None,
        window: JacobiWindow | None,
        window_columns: int | None,
        merge: bool,
        room: int,
    ) -> tuple[DraftTree, np.ndarray, int, int | None, np.ndarray]:
        """:meth:`build`'s tree: the lead, then the candidates that fit (one compiled call,
        :func:`~.tree.chains_tree`), then the window's columns that fit written after them
        (:meth:`~.window.JacobiWindow.put_block`).  Returns it, its nodes' sources, the chains
        added, the window's first node and its output nodes."""
        chains: list[Sequence[int]] = []
        chain_sources: list[Sequence[int]] = []
        if lead_tokens:
            chains.append(lead_tokens)
            chain_sources.append(cands.lead_sources[: len(lead_tokens)])
            for continuation, source in cands.others[:candidates]:
                chains.append(continuation)
                chain_sources.append([source] * len(continuation))
        # a later (less likely) candidate that does not fit ends the tree: it never jumps the queue
        spare = self.window_tokens if window is not None else 0  # the window's nodes, if it fits
        arrays, size, used = chains_tree(cands.root, chains, chain_sources, merge, room, spare)
        window_start, window_nodes, end = None, _NO_NODES, size
        if window is not None:
            window_columns = self._columns_that_fit(window, window_columns, room - (size - 1))
            if window_columns:
                window_start = size  # the lookahead branch: every node from here on
                end, window_nodes = window.put_block(arrays, size, cands.root, window_columns)
        tokens, parents, depths, logits, sources = (array[:end] for array in arrays)
        tree = DraftTree(_readonly(tokens), _readonly(parents), _readonly(depths), _readonly(logits))
        tree.__dict__["size"] = end  # the cached property, known
        return tree, sources, used, window_start, window_nodes

    def _columns_that_fit(self, window: JacobiWindow, columns: int | None, room: int) -> int:
        """The window columns :meth:`build` adds within ``room`` draft nodes: the first
        ``columns`` or as many of them as fit (None: the whole window, if it fits)."""
        if columns is None:
            return window.window_size if self.window_tokens <= room else 0
        columns = min(columns, window.window_size)
        while columns and window.tree_nodes(columns) > room:
            columns -= 1
        return columns

    def lead_draft(
        self, root: int, lead_tokens: Sequence[int], sources: list[int], shadow: int, evidence: LeadEvidence
    ) -> StepDraft:
        """:meth:`build`'s draft of the lead alone (most drafts of a full batch): a chain, made
        without a tree builder (``sources``: its tokens'; ``shadow``: the lead's next token, -1:
        none; ``evidence``: where the lead was found) -- made so by a batch step's plan too
        (:func:`~.batch_step.draft_batch`), without a candidates record."""
        self._unsent = None
        return StepDraft(
            tree=DraftTree.chain((root, *lead_tokens)),
            window_nodes=_NO_NODES,
            num_candidates=1,
            lead_tokens=len(lead_tokens),
            sources=_chain_sources(tuple(sources)),
            shadow_token=shadow,
            lead_evidence=evidence,
            window_sourced=Source.WINDOW in sources,
        )

    def no_draft(self, root: int, shadow: int, evidence: LeadEvidence, window_columns: int = 0) -> StepDraft:
        """:meth:`build`'s draft when it drafts nothing (the most common step in a full batch, so
        made without building a tree): the root alone -- with the window's first column where it
        is the root itself (a window at its first level, :meth:`~.window.JacobiWindow.root_column`)
        -- its lead's first token kept as the shadow token the next step checks (-1: none)."""
        window_nodes, window_start = _NO_NODES, None
        if window_columns and self.window is not None:
            window_nodes, window_start = self.window.root_column(root), 1
        draft = StepDraft(
            tree=DraftTree.root_only(root),
            window_nodes=window_nodes,
            num_candidates=0,
            sources=_ROOT_SOURCES,
            window_start=window_start,
            shadow_token=shadow,
            lead_evidence=evidence,
        )
        self._unsent = draft if shadow >= 0 else None
        return draft

    def observe(
        self,
        draft: StepDraft,
        num_nodes_run: int,
        argmax: np.ndarray,
        accepted_tokens: Sequence[int],
        history: Sequence[int],
        path: np.ndarray | None = None,
        learn: bool = True,
    ) -> None:
        """Learn from the target forward of ``draft`` (see module docstring).

        ``num_nodes_run``: nodes of ``draft.tree`` actually run (a prefix, >= 1);
        ``argmax``: (num_nodes_run,) argmax per run node, -1 without logits;
        ``accepted_tokens``: tokens appended this step (drafts + bonus, >= 1);
        ``history``: the full sequence after this step (only its tail is read);
        ``path``: the accepted node ids (to credit window-only n-grams; None: not known);
        ``learn``: False leaves the n-grams ending in the new tokens to the caller, who learns
        them after the window's (:meth:`.PoolBatch.learn`, for a batch of requests at once).
        """
        if not 1 <= num_nodes_run <= draft.tree.size:
            raise ValueError(f"num_nodes_run {num_nodes_run} outside [1, {draft.tree.size}]")
        argmax = np.asarray(argmax, dtype=np.int64)
        if argmax.shape != (num_nodes_run,):
            raise ValueError(f"argmax has shape {argmax.shape}, expected ({num_nodes_run},)")
        num_new = len(accepted_tokens)
        if num_new < 1:
            raise ValueError("at least the bonus token is accepted each step")
        window_nodes = draft.window_nodes
        runs_window = window_nodes.size and self.window is not None
        # the end of the text, which the window and learning read (a step of a chain in a batch
        # that learns on its own reads neither)
        tail, start = self.text.tail(num_new, history) if runs_window or learn else (None, 0)
        if runs_window:  # each window column's output: its node's argmax where it ran, else -1
            said = argmax.tolist()  # a few columns: a walk over lists costs less than numpy's passes
            outputs = [said[node] if 0 <= node < num_nodes_run else -1 for node in window_nodes.tolist()]
            ngrams = self.window.update(np.array(outputs, dtype=np.int64), num_new - 1, tail)
            if len(ngrams):
                self.text.pool.add_rows(ngrams, Source.WINDOW)
        if learn:
            self.text.learn(tail, start, len(history))
        else:
            self.text.known = len(history)

        self.adapt_lead(draft, num_nodes_run, num_new - 1)
        self.record_acceptance(draft, num_nodes_run, accepted_tokens, path)
        self._unsent = None

    def record_acceptance(
        self, draft: StepDraft, num_nodes_run: int, accepted_tokens: Sequence[int], path: np.ndarray | None
    ) -> None:
        """Feed the draft rule's per-request estimates (:class:`~.draft_rule.Acceptance`).

        Lead tokens the rule left out are still observed where the step says what they would
        have met: when the drafted part of the lead (maybe none of it) was accepted in full
        and the step ended there, the next emitted token is the model's own choice, and the
        left-out token would have been accepted exactly when it equals that token (for greedy
        requests by definition, for sampled ones with the same probability p(x)).  So a
        request the rule stopped drafting keeps being measured, and drafts again when its
        text starts to repeat.
        """
        accepted = len(accepted_tokens) - 1
        lead = min(draft.lead_tokens, num_nodes_run - 1)
        drafted = lead > 0
        lead_tokens = draft.tree.token_list[1 : lead + 1]
        lead_accepted, checked = 0, min(lead, accepted)
        while lead_accepted < checked and lead_tokens[lead_accepted] == accepted_tokens[lead_accepted]:
            lead_accepted += 1
        window_nodes = draft.window_nodes
        columns = sum(1 for node in window_nodes.tolist() if 0 <= node < num_nodes_run) if window_nodes.size else 0
        window_accepted = 0
        if path is not None and draft.window_sourced and len(path):
            sources = draft.sources.tolist()
            window_accepted = sum(1 for node in path.tolist() if sources[node] == _WINDOW)
        further = max(0, draft.num_candidates - 1) if num_nodes_run - 1 > lead else 0
        if draft.shadow_token >= 0 and lead == draft.lead_tokens and lead_accepted == lead == accepted:
            lead += 1  # the left-out token, checked against the emitted one
            if int(accepted_tokens[accepted]) == draft.shadow_token:
                lead_accepted += 1
        self.acceptance.observe(
            lead=lead,
            lead_accepted=lead_accepted,
            candidates=further,
            accepted=accepted,
            window_columns=columns,
            window_accepted=window_accepted,
            evidence=draft.lead_evidence,
            lead_drafted=drafted,
        )

    def adapt_lead(self, draft: StepDraft, num_nodes_run: int, num_accepted: int) -> None:
        """Let the lead length follow a step's outcome (``num_accepted`` draft tokens, bonus excluded)."""
        self.lead_length.update(min(draft.lead_tokens, num_nodes_run - 1), num_accepted)  # lead = nodes 1..lead

    def reset(self, prompt_token_ids: Sequence[int]) -> None:
        """After preemption: re-initialise the window, keep the pool."""
        if self.window is not None:
            self.window.reset(prompt_token_ids)

    def catch_up(self, history: Sequence[int], learn: bool = True) -> None:
        """Learn every token of ``history`` the pools have not seen yet (none, one or many;
        ``learn`` False: the caller learns them, as in :meth:`observe`).

        Lets the engine skip a request's learning while it cannot draft anyway (a
        full batch) and pay for it, once per token, when it can: total work stays
        O(tokens), each call O(tokens since the last one).
        """
        unsent, self._unsent = self._unsent, None
        known = self.text.known
        if unsent is not None and len(history) > known:  # the step after a draft of nothing
            self.record_acceptance(unsent, 1, [int(history[known])], None)
        self.text.catch_up(history, learn)
