"""RequestLookahead end to end against deterministic toy "oracle" language models.

Each step is simulated like the engine would: the draft tree is (possibly
truncated to a prefix and) run through an oracle whose next token depends on
the text up to each node (history + ancestor path), greedily verified, and the
result fed back through ``observe``.  Lookahead decoding must be lossless: the
output equals plain greedy decoding of the oracle, whatever the parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import make_config
from support.drafting import draft_one
from vllm_lookahead.config import LookaheadConfig
from vllm_lookahead.core import (
    DraftTree,
    RequestLookahead,
    Source,
    StepDraft,
    TreeBuilder,
    greedy_verify,
)
from vllm_lookahead.core.draft_rule import LeadEvidence
from vllm_lookahead.core.pool import SharedPools
from vllm_lookahead.core.request import StepCandidates
from vllm_lookahead.core.step_cost import StepCost

Oracle = Callable[[Sequence[int]], int]
CONTEXT = 8  # oracles below look at most this many tokens back


def table_oracle(vocab: int, seed: int) -> Oracle:
    """next = random table of the last two tokens."""
    table = np.random.default_rng(seed).integers(0, vocab, size=(vocab, vocab))
    return lambda text: int(table[text[-2], text[-1]]) if len(text) >= 2 else 0


def periodic_oracle(period: Sequence[int]) -> Oracle:
    """Continue ``period`` cyclically; the successor depends on the last 2 tokens."""
    pairs = {}
    for p in range(len(period)):
        pair = (period[p], period[(p + 1) % len(period)])
        pairs[pair] = period[(p + 2) % len(period)]
    return lambda text: pairs.get(tuple(text[-2:]), period[0])


def greedy_reference(oracle: Oracle, prompt: Sequence[int], max_new: int) -> list[int]:
    text = list(prompt)
    for _ in range(max_new):
        text.append(oracle(text))
    return text[len(prompt) :]


def node_argmax(tree: DraftTree, context: list[int], oracle: Oracle) -> np.ndarray:
    """Oracle argmax at every node with logits, -1 elsewhere (root = context[-1])."""
    texts: list[list[int]] = [context]
    argmax = np.full(tree.size, -1, dtype=np.int64)
    for node in range(tree.size):
        if node:
            texts.append(texts[int(tree.parents[node])] + [int(tree.tokens[node])])
        if tree.logits[node]:
            argmax[node] = oracle(texts[node])
    return argmax


@dataclass
class Counters:
    """What the engine counts per request: target forwards, draft tokens run, tokens emitted."""

    steps: int = 0
    drafted: int = 0
    emitted: int = 0
    sources: set = None  # Sources of every draft node proposed
    accepted_from: dict = None  # Source -> accepted draft tokens

    def __post_init__(self) -> None:
        self.sources = set()
        self.accepted_from = dict.fromkeys(Source, 0)

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0


def simulate(
    params: LookaheadConfig,
    prompt: Sequence[int],
    oracle: Oracle,
    max_new: int,
    seed: int = 0,
    choose_run: Callable[[StepDraft], int] | None = None,
    budget: Callable[[int], int | None] | None = None,
    cost: StepCost | None = None,
) -> tuple[list[int], RequestLookahead, Counters]:
    """Decode ``max_new`` tokens of ``oracle`` with lookahead, each step drafted as the engine
    drafts it (:func:`~vllm_lookahead.core.drafting.draft_step`): with ``cost`` planned by the
    draft rule (the default ``"auto"``), else full trees within ``budget(step)``."""
    lookahead = RequestLookahead(params, prompt, seed)
    counters = Counters()
    history = list(prompt) + [oracle(prompt)]  # prefill samples the first token
    step = 0
    while len(history) - len(prompt) < max_new:
        limit = budget(step) if budget else None
        step += 1
        draft = draft_one(lookahead, history[-1], history[-params.lookup_context :], budget=limit, cost=cost)
        draft.tree.validate()
        check_sources(draft, params)
        counters.sources.update(Source(int(x)) for x in draft.sources[1:])
        assert draft.tree.size - 1 <= params.max_draft_tokens
        if limit is not None:
            assert draft.tree.size - 1 <= limit
        run = choose_run(draft) if choose_run else draft.tree.size
        tree = draft.tree.prefix(run)
        argmax = node_argmax(tree, history[-CONTEXT:], oracle)
        path, bonus = greedy_verify(tree, argmax)
        for node in path.tolist():
            counters.accepted_from[Source(int(draft.sources[node]))] += 1
        accepted = tree.tokens[path].tolist() + [bonus]
        accepted = accepted[: max_new - (len(history) - len(prompt))]  # max_tokens stop
        history.extend(accepted)
        lookahead.observe(draft, run, argmax, accepted, history)
        counters.steps += 1
        counters.drafted += run - 1
        counters.emitted += len(accepted)
        assert lookahead.window is None or all((level >= 0).all() for level in lookahead.window.levels)
    return history[len(prompt) :], lookahead, counters


def check_sources(draft: StepDraft, params: LookaheadConfig) -> None:
    """Every node carries a source: the root none, the lookahead branch WINDOW, candidates a pool's."""
    sources = draft.sources
    assert sources is not None and sources.shape == (draft.tree.size,)
    assert sources[0] == Source.ROOT and (sources[1:] != Source.ROOT).all()
    if draft.window_start is None:
        assert draft.window_nodes.size == 0
    else:
        assert params.window_size > 0 and draft.window_nodes.size == params.window_size
        assert (sources[draft.window_start :] == Source.WINDOW).all()
    if not params.ablation.pool_from_prompt:
        assert Source.PROMPT not in sources
    if not params.ablation.pool_from_output:
        assert Source.OUTPUT not in sources


PERIOD = [3, 1, 4, 1, 5, 9, 2, 6, 5, 8, 7, 1]


@pytest.mark.parametrize("shift", ["one", "accepted"])
@pytest.mark.parametrize("merge", [False, True])
def test_periodic_sequence_accepts_many_tokens_per_step(shift, merge):
    params = make_config(window_shift=shift, merge_candidates=merge)
    oracle = periodic_oracle(PERIOD)
    prompt = PERIOD * 2
    output, lookahead, run = simulate(params, prompt, oracle, 120)
    assert output == greedy_reference(oracle, prompt, 120)
    # prompt n-grams predict the cycle: nearly every step accepts N - 1 drafts
    assert run.tokens_per_step > 4.5


def test_window_alone_discovers_ngrams():
    params = make_config(pool_from_prompt=False, pool_from_output=False)
    oracle = periodic_oracle(PERIOD)
    prompt = [3, 1]  # only the entry of the cycle: nothing to copy from
    output, lookahead, run = simulate(params, prompt, oracle, 150, seed=5)
    assert output == greedy_reference(oracle, prompt, 150)
    assert len(lookahead.text.pool) > 0
    assert run.tokens_per_step > 3.0


def test_lookahead_beats_one_token_per_step_on_a_random_model():
    """A 2-token-context table model falls into a cycle the pool then learns."""
    oracle = table_oracle(vocab=6, seed=1)
    prompt = [0, 1, 2]
    output, lookahead, run = simulate(make_config(), prompt, oracle, 200)
    assert output == greedy_reference(oracle, prompt, 200)
    assert run.tokens_per_step > 2.0


@pytest.mark.parametrize(
    "cost,fast",
    [
        (StepCost.linear(0.02, 0.0), True),
        (StepCost.linear(0.02, 0.0005), True),
        (StepCost((1, 256), (0.010, 5.0)), False),  # a token costs twice the one-token step
    ],
    ids=["free", "cheap", "dear"],
)
def test_the_draft_rule_drafts_what_pays(cost, fast):
    """The default (``"auto"``): under free or cheap tokens the rule drafts the cycle the prompt
    shows; when no token can pay, nothing is drafted."""
    oracle = periodic_oracle(PERIOD)
    prompt = PERIOD * 2
    output, _, run = simulate(make_config(), prompt, oracle, 120, cost=cost)
    assert output == greedy_reference(oracle, prompt, 120)
    assert run.tokens_per_step > 3.0 if fast else run.drafted == 0


def test_running_only_the_root_degrades_to_plain_decoding():
    oracle = periodic_oracle(PERIOD)
    prompt = PERIOD * 2
    output, lookahead, run = simulate(make_config(), prompt, oracle, 40, choose_run=lambda d: 1)
    assert output == greedy_reference(oracle, prompt, 40)
    assert run.tokens_per_step == 1.0
    assert run.drafted == 0


def test_truncation_to_the_verification_branch_still_accepts():
    params = make_config()
    oracle = periodic_oracle(PERIOD)
    prompt = PERIOD * 2

    def verification_only(draft: StepDraft) -> int:  # the root and the candidates, not the window
        if not draft.num_candidates:
            return 1
        return 1 + draft.lead_tokens + (draft.num_candidates - 1) * (params.ngram_size - 1)

    output, lookahead, run = simulate(params, prompt, oracle, 60, choose_run=verification_only)
    assert output == greedy_reference(oracle, prompt, 60)
    assert run.tokens_per_step > 3.5


@settings(max_examples=60, deadline=None)
@given(
    width=st.integers(0, 5),
    ngram=st.integers(2, 5),
    guess=st.integers(0, 4),
    shift=st.sampled_from(["one", "accepted"]),
    merge=st.booleans(),
    from_prompt=st.booleans(),
    from_output=st.booleans(),
    vocab=st.integers(2, 5),
    oracle_seed=st.integers(0, 1000),
    prompt=st.lists(st.integers(0, 4), min_size=2, max_size=12),
    lead=st.integers(0, 12),
    per_token=st.sampled_from([None, 0.0, 0.0005, 0.02, 5.0]),
    data=st.data(),
)
def test_lossless_for_any_parameters_and_truncation(
    width, ngram, guess, shift, merge, from_prompt, from_output, vocab, oracle_seed, prompt, lead, per_token, data
):
    """Whatever is drafted (full trees, or the draft rule's plan under a cost model: tokens free to
    as dear as the step itself) and whatever prefix of it runs, the output is greedy decoding's."""
    params = make_config(
        window_size=width,
        ngram_size=ngram,
        guess_set_size=guess if width else max(guess, 1),  # W = G = 0 is refused
        window_shift=shift,
        merge_candidates=merge,
        pool_from_prompt=from_prompt,
        pool_from_output=from_output,
        max_pool_keys=3,
        max_lead_tokens=lead,
    )
    prompt = [t % vocab for t in prompt]
    oracle = table_oracle(vocab, oracle_seed)

    def random_prefix(draft: StepDraft) -> int:
        return data.draw(st.integers(1, draft.tree.size))

    cost = None if per_token is None else StepCost.linear(0.02, per_token)
    output, lookahead, run = simulate(params, prompt, oracle, 25, seed=oracle_seed, choose_run=random_prefix, cost=cost)
    assert output == greedy_reference(oracle, prompt, 25)
    assert lookahead.text.pool.num_keys <= 3
    assert lookahead.window is None or lookahead.window.filled <= ngram - 1
    if not width:
        assert Source.WINDOW not in run.sources


def test_propose_puts_candidates_first_then_the_window():
    params = make_config(window_size=3, ngram_size=3, guess_set_size=2, pool_from_prompt=False, merge_candidates=False)
    lookahead = RequestLookahead(params, [9, 9], seed=0)
    lookahead.text.pool.add((5, 1, 2))
    lookahead.text.pool.add((5, 1, 3))
    lookahead.text.pool.add((6, 7, 7))
    draft = draft_one(lookahead, 5)
    tree = draft.tree
    tree.validate()
    assert draft.num_candidates == 2
    assert tree.tokens[:5].tolist() == [5, 1, 3, 1, 2]  # most recent candidate first
    assert tree.parents[:5].tolist() == [-1, 0, 1, 0, 3]
    assert tree.logits[:5].all()
    # window (only level 0 filled): chain root -> 9 -> 9 with logits
    assert tree.tokens[5:].tolist() == [9, 9]
    assert tree.parents[5:].tolist() == [0, 5]
    assert draft.window_nodes.tolist() == [0, 5, 6]

    merged = RequestLookahead(
        make_config(window_size=3, ngram_size=3, guess_set_size=2, merge_candidates=True, pool_from_prompt=False),
        [9, 9],
        seed=0,
    )
    merged.text.pool.add((5, 1, 2))
    merged.text.pool.add((5, 1, 3))
    tree = draft_one(merged, 5).tree
    assert tree.tokens[:4].tolist() == [5, 1, 3, 2]
    assert tree.parents[:4].tolist() == [-1, 0, 1, 1]


def test_request_without_candidates_still_gets_the_window():
    lookahead = RequestLookahead(make_config(window_size=4, ngram_size=3), [1, 2], seed=0)
    draft = draft_one(lookahead, 77)
    assert draft.num_candidates == 0
    assert draft.tree.size == 4
    assert draft.window_nodes.tolist() == [0, 1, 2, 3]


def test_max_draft_tokens_is_reached_by_a_full_window_and_full_pool():
    params = make_config(
        window_size=3, ngram_size=4, guess_set_size=2, pool_from_prompt=False, max_lead_tokens=0, merge_candidates=False
    )
    assert params.max_draft_tokens == (3 * 3 - 1) + 2 * 3
    assert make_config(max_lead_tokens=0).max_draft_tokens == (7 * 4 - 1) + 7 * 4
    assert make_config().max_draft_tokens == (7 * 4 - 1) + 6 * 4 + 32  # the lead may grow to 32
    assert make_config(guess_set_size=0).max_draft_tokens == 7 * 4 - 1
    lookahead = RequestLookahead(params, [1, 2, 3], seed=0)
    while not lookahead.window.full:
        lookahead.window.update(np.array([1, 2, 3]), 0, [])
    lookahead.text.pool.add((0, 1, 2, 3))
    lookahead.text.pool.add((0, 4, 5, 6))
    draft = draft_one(lookahead, 0)
    assert draft.tree.size - 1 == params.max_draft_tokens


def test_observe_learns_output_ngrams_incrementally():
    params = make_config(window_size=1, ngram_size=3, guess_set_size=5, pool_from_prompt=False)
    lookahead = RequestLookahead(params, [1, 2], seed=0)
    draft = draft_one(lookahead, 2)
    argmax = np.array([8])
    lookahead.observe(draft, 1, argmax, [8], [1, 2, 8])
    assert lookahead.text.pool.get(1, 5) == [(2, 8)]
    draft = draft_one(lookahead, 8)
    lookahead.observe(draft, draft.tree.size, np.array([9] * draft.tree.size), [9], [1, 2, 8, 9])
    assert (8, 9) in lookahead.text.pool.get(2, 5)

    silent = RequestLookahead(
        make_config(window_size=1, ngram_size=3, guess_set_size=5, pool_from_prompt=False, pool_from_output=False),
        [1, 2],
        seed=0,
    )
    silent.observe(draft_one(silent, 2), 1, np.array([8]), [8], [1, 2, 8])
    assert silent.text.pool.get(1, 5) == []


def test_observe_shifts_the_window_by_the_accepted_draft_count():
    params = make_config(window_size=4, ngram_size=3, guess_set_size=0, window_shift="accepted")
    lookahead = RequestLookahead(params, [1, 2], seed=0)
    lookahead.window.levels = [np.array([0, 1, 2, 3]), np.array([10, 11, 12, 13])]
    draft = draft_one(lookahead, 50)
    argmax = np.arange(draft.tree.size, dtype=np.int64) + 100
    outputs = argmax[draft.window_nodes]
    history = [1, 2, 50, 61, 62, 63]
    lookahead.observe(draft, draft.tree.size, argmax, [61, 62, 63], history)
    levels = [level.tolist() for level in lookahead.window.levels]
    assert levels[0][:2] == [12, 13]  # shifted left by 2 accepted drafts
    assert levels[1][:2] == outputs[2:].tolist()
    tail = 3 + params.lookup_context + params.ngram_size - 2  # new tokens + the n-grams' context
    assert set(levels[0][2:] + levels[1][2:]) <= set(history[-tail:])


class TailOnlyHistory(Sequence[int]):
    """A history that records which positions ``observe`` reads."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.lowest_read = len(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start = range(len(self.tokens))[index].start if len(self.tokens) else 0
            self.lowest_read = min(self.lowest_read, start)
            return self.tokens[index]
        index = index % len(self.tokens)
        self.lowest_read = min(self.lowest_read, index)
        return self.tokens[index]


def test_observe_only_reads_the_tail_of_the_history():
    params = make_config(window_size=2, ngram_size=4, guess_set_size=2)
    lookahead = RequestLookahead(params, list(range(50)), seed=0)
    draft = draft_one(lookahead, 7)
    history = TailOnlyHistory(list(range(1000)) + [7, 8, 9])
    argmax = np.zeros(draft.tree.size, dtype=np.int64)
    lookahead.observe(draft, draft.tree.size, argmax, [8, 9], history)
    assert history.lowest_read >= len(history) - (2 + params.lookup_context + params.ngram_size - 2)
    assert lookahead.text.pool.get(1000 - 1, 2) == [(7, 8, 9)]


def test_reset_keeps_the_pool_and_rewinds_the_window():
    oracle = periodic_oracle(PERIOD)
    _, lookahead, _ = simulate(make_config(ngram_size=4), PERIOD, oracle, 30)
    pool_size = len(lookahead.text.pool)
    assert lookahead.window.full
    lookahead.reset([4, 4])
    assert lookahead.window.filled == 1
    assert set(lookahead.window.levels[0][1:].tolist()) == {4}
    assert len(lookahead.text.pool) == pool_size


def test_observe_validates_its_inputs():
    lookahead = RequestLookahead(make_config(window_size=2, ngram_size=3), [1, 2], seed=0)
    draft = draft_one(lookahead, 2)
    with pytest.raises(ValueError):
        lookahead.observe(draft, 0, np.zeros(0), [1], [1, 2, 1])
    with pytest.raises(ValueError):
        lookahead.observe(draft, 1, np.zeros(2), [1], [1, 2, 1])
    with pytest.raises(ValueError):
        lookahead.observe(draft, 1, np.zeros(1), [], [1, 2])


# -- lookup context and per-step budget ------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    w=st.integers(0, 5),
    n=st.integers(2, 5),
    g=st.integers(0, 4),
    context=st.integers(1, 4),
    budgets=st.lists(st.one_of(st.none(), st.integers(0, 30)), min_size=1, max_size=7),
    seed=st.integers(0, 50),
    lead=st.integers(0, 20),
)
def test_budgeted_context_lookahead_is_lossless(w, n, g, context, budgets, seed, lead):
    params = make_config(
        window_size=w,
        ngram_size=n,
        guess_set_size=g if w else max(g, 1),
        lookup_context=context,
        max_lead_tokens=lead,
    )
    oracle = table_oracle(vocab=7, seed=seed)
    prompt = [seed % 7, 1, 2, 3]
    output, _, _ = simulate(params, prompt, oracle, 60, seed=seed, budget=lambda step: budgets[step % len(budgets)])
    assert output == greedy_reference(oracle, prompt, 60)


def test_window_left_out_when_it_does_not_fit_and_waits():
    params = make_config(window_size=4, ngram_size=4, guess_set_size=2)
    lookahead = RequestLookahead(params, [1, 2, 3, 4, 5, 6], seed=0)
    before = [level.copy() for level in lookahead.window.levels]
    draft = draft_one(lookahead, 6, [6], budget=lookahead.window_tokens - 1)
    assert draft.window_nodes.size == 0
    lookahead.observe(draft, draft.tree.size, np.full(draft.tree.size, 7, dtype=np.int64), [7], [1, 2, 3, 4, 5, 6, 7])
    assert [level.tolist() for level in lookahead.window.levels] == [level.tolist() for level in before]
    roomy = draft_one(lookahead, 7, [7], budget=lookahead.window_tokens)
    assert roomy.window_nodes.size == params.window_size


def test_candidates_fill_the_budget_in_order_before_the_window():
    params = make_config(window_size=3, ngram_size=3, guess_set_size=3, pool_from_prompt=False)
    lookahead = RequestLookahead(params, [], seed=0)
    for ngram in ((5, 1, 2), (5, 3, 4), (5, 6, 7)):
        lookahead.text.pool.add(ngram)
    draft = draft_one(lookahead, 5, [5], budget=5)  # two candidates of 2 tokens; the window needs 2
    assert draft.num_candidates == 2 and draft.window_nodes.size == 0
    assert draft.tree.tokens[1:].tolist() == [6, 7, 3, 4]  # most recent first
    full = draft_one(lookahead, 5, [5], budget=None)
    assert full.num_candidates == 3 and full.window_nodes.size == 3


def test_longer_context_candidates_come_first():
    # After "9 5" the text continued "1 1"; after "8 5" it continued "2 2" (more recently).
    prompt = [9, 5, 1, 1, 0, 8, 5, 2, 2]
    one = RequestLookahead(make_config(ngram_size=3, guess_set_size=2, lookup_context=1), prompt, seed=0)
    two = RequestLookahead(make_config(ngram_size=3, guess_set_size=2, lookup_context=2), prompt, seed=0)
    assert one.text.candidates([9, 5]) == [(2, 2), (1, 1)]  # by the last token only: most recent first
    assert two.text.candidates([9, 5]) == [(1, 1), (2, 2)]  # "9 5" matched first
    assert two.text.candidates([8, 5]) == [(2, 2), (1, 1)]
    assert two.text.candidates([7, 5]) == [(2, 2), (1, 1)]  # no 2-token match: falls back


def test_context_pools_learn_output_incrementally():
    params = make_config(ngram_size=3, guess_set_size=4, lookup_context=3, pool_from_prompt=False)
    lookahead = RequestLookahead(params, [], seed=0)
    text = [4, 5, 6, 7, 4, 5, 6, 8]
    for end in range(1, len(text) + 1):
        lookahead.catch_up(text[:end])
    assert lookahead.text.candidates([4, 5, 6]) == [(7, 4)]
    assert lookahead.text.candidates([5, 6, 7, 4]) == [(5, 6)]
    assert lookahead.text.candidates([6, 7, 4, 5]) == [(6, 8), (6, 7)]


def test_recent_shorter_than_the_lookup_context_is_used_whole():
    params = make_config(ngram_size=3, guess_set_size=2, lookup_context=3, pool_from_prompt=True)
    lookahead = RequestLookahead(params, [8, 5, 1, 1, 0, 9, 5, 2, 2], seed=0)
    # two tokens of context (the request has just started): "8 5" must still rank first
    draft = draft_one(lookahead, 5, [8, 5], budget=2)
    assert draft.tree.tokens[1:].tolist() == [1, 1]


class _CountingHistory:
    """A sequence that counts how many of its elements are read."""

    def __init__(self, tokens):
        self.tokens, self.reads = tokens, 0

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, item):
        got = self.tokens[item]
        self.reads += len(got) if isinstance(item, slice) else 1
        return got


@pytest.mark.parametrize("length", [50, 200_000])
def test_per_step_work_does_not_grow_with_history_or_pool(length):
    """observe/catch_up read only the tail of the history; drafting reads only the last tokens."""
    params = make_config(window_size=3, ngram_size=4, guess_set_size=3, lookup_context=3)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 500, size=length).tolist()
    lookahead = RequestLookahead(params, prompt, seed=0)  # a pool holding up to `length` n-grams
    history = _CountingHistory(prompt + [7])
    lookahead.catch_up(history)
    span = params.lookup_context + params.ngram_size - 1
    assert history.reads <= 1 + span
    recent = _CountingHistory(history.tokens)
    draft = draft_one(lookahead, 7, recent[len(recent) - params.lookup_context :], budget=20)
    assert recent.reads == params.lookup_context
    accepted = [int(draft.tree.tokens[1]) if draft.tree.size > 1 else 3, 9]
    history = _CountingHistory(history.tokens + accepted)
    argmax = np.full(draft.tree.size, 5, dtype=np.int64)
    lookahead.observe(draft, draft.tree.size, argmax, accepted, history)
    assert history.reads <= len(accepted) + span


def _pool_tables(lookahead: RequestLookahead) -> list[dict]:
    return [pool.items() for pool in lookahead.text.pools()]


@settings(max_examples=60, deadline=None)
@given(
    text=st.lists(st.integers(0, 6), min_size=1, max_size=60),
    cuts=st.lists(st.integers(1, 60), max_size=12),
    context=st.integers(1, 3),
    from_prompt=st.booleans(),
)
def test_catching_up_in_bursts_learns_what_learning_every_token_does(text, cuts, context, from_prompt):
    """A request whose learning was skipped for a while (full batch) ends with the same pools."""
    params = make_config(ngram_size=3, guess_set_size=3, lookup_context=context, pool_from_prompt=from_prompt)
    prompt = [1, 2, 3, 1, 2]
    every = RequestLookahead(params, prompt, seed=0)
    bursts = RequestLookahead(params, prompt, seed=0)
    history = list(prompt)
    for token in text:
        history.append(token)
        every.catch_up(history)
    for end in sorted(set(c for c in cuts if c <= len(text))) + [len(text)]:
        bursts.catch_up(history[: len(prompt) + end])
    assert bursts.text.known == every.text.known == len(history)
    assert _pool_tables(bursts) == _pool_tables(every)
    bursts.catch_up(history)  # nothing new: a no-op
    assert _pool_tables(bursts) == _pool_tables(every)


def test_catch_up_reads_only_the_unseen_tail():
    params = make_config(ngram_size=4, guess_set_size=2, lookup_context=3)
    lookahead = RequestLookahead(params, list(range(100)), seed=0)
    history = _CountingHistory(list(range(100)) + [5] * 30)
    lookahead.catch_up(history)
    assert history.reads <= 30 + params.lookup_context + params.ngram_size - 2


def test_lead_candidate_grows_by_looking_up_its_own_text():
    # The prompt says "1 2 3 4 5 6 7 8 9" once; with N = 3 each candidate is 2 tokens,
    # and the lead may grow to 6 by asking the pools again after what it drafted.
    params = make_config(window_size=1, ngram_size=3, guess_set_size=2, lookup_context=2, max_lead_tokens=6)
    lookahead = RequestLookahead(params, [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1], seed=0)
    assert lookahead.text.lead_candidate((2, 3), [0, 1], 6) == (2, 3, 4, 5, 6, 7)
    assert lookahead.text.lead_candidate((2, 3), [0, 1], 1) == (2,)
    assert lookahead.text.lead_candidate((8, 9), [6, 7], 6) == (8, 9, 0, 1, 2, 3)
    assert lookahead.text.lead_candidate((11, 12), [0, 1], 6) == (11, 12)  # 12 never seen: nothing to add
    # Under the draft rule the lead is offered whole (the rule cuts it where its tokens stop paying).
    assert lookahead.step_candidates(1, [0, 1]).lead == (2, 3, 4, 5, 6, 7)
    # Under a fixed cap it starts at N - 1 and doubles while accepted in full.
    lookahead = RequestLookahead(
        params.model_copy(update={"max_tokens_per_step": 0}), [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1], seed=0
    )
    history = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    lengths = []
    for _ in range(3):
        draft = draft_one(lookahead, history[-1], history[-2:], window=False)
        lengths.append(draft.lead_tokens)
        lead = draft.tree.tokens[1 : 1 + draft.lead_tokens].tolist()
        accepted = lead + [(lead[-1] + 1) % 10]  # the text keeps cycling 1..9 0: all accepted
        history += accepted
        lookahead.observe(draft, draft.tree.size, np.full(draft.tree.size, -1), accepted, history)
    assert lengths == [2, 4, 6]
    # A miss: back to N - 1.
    draft = draft_one(lookahead, history[-1], history[-2:], window=False)
    history += [42]
    lookahead.observe(draft, draft.tree.size, np.full(draft.tree.size, -1), [42], history)
    assert lookahead.lead_length.current == 2


def test_lead_candidate_is_cut_to_the_budget_and_others_are_whole():
    params = make_config(window_size=1, ngram_size=4, guess_set_size=3, pool_from_prompt=False, max_lead_tokens=8)
    lookahead = RequestLookahead(params, [], seed=0)
    for ngram in ((5, 1, 2, 3), (5, 4, 4, 4)):
        lookahead.text.pool.add(ngram)
    draft = draft_one(lookahead, 5, [5], budget=2)
    assert draft.tree.tokens[1:].tolist() == [4, 4] and draft.lead_tokens == 2 and draft.num_candidates == 1
    draft = draft_one(lookahead, 5, [5], budget=5)  # the second candidate (3 tokens) does not fit whole
    assert draft.tree.tokens[1:].tolist() == [4, 4, 4] and draft.num_candidates == 1
    draft = draft_one(lookahead, 5, [5], budget=6)
    assert draft.tree.tokens[1:].tolist() == [4, 4, 4, 1, 2, 3] and draft.num_candidates == 2


def test_max_candidates_one_without_window_is_a_chain():
    params = make_config(window_size=2, ngram_size=3, guess_set_size=3, pool_from_prompt=False)
    lookahead = RequestLookahead(params, [], seed=0)
    for ngram in ((5, 1, 2), (5, 3, 4), (5, 6, 7)):
        lookahead.text.pool.add(ngram)
    draft = draft_one(lookahead, 5, [5], window=False, max_candidates=1)
    assert draft.tree.tokens.tolist() == [5, 6, 7] and draft.num_candidates == 1
    assert draft.window_nodes.size == 0
    assert draft_one(lookahead, 5, [5], window=False, max_candidates=2).num_candidates == 2


def test_step_candidates_carry_the_leads_evidence():
    # "5 6 7" is followed by 8 twice in the prompt: found after three tokens, support 2;
    # after "0 9" only the one-token pool knows 9 (followed by 1 once).
    params = make_config(window_size=0, ngram_size=3, guess_set_size=3, lookup_context=3)
    prompt = [5, 6, 7, 8, 1, 5, 6, 7, 8, 2, 9, 1, 4]
    state = RequestLookahead(params, prompt, seed=0)
    cands = state.step_candidates(7, [5, 6, 7])
    assert cands.lead[:2] == (8, 2) and cands.lead_evidence == LeadEvidence(3, 2)
    weak = state.step_candidates(9, [0, 0, 9])
    assert weak.lead[:2] == (1, 4) and weak.lead_evidence == LeadEvidence(1, 1)
    draft = state.build(cands, lead=2, candidates=0, window_columns=0)
    assert draft.lead_evidence == LeadEvidence(3, 2)  # kept for the acceptance record
    assert state.acceptance.lead.first(LeadEvidence(3, 2)) > state.acceptance.lead.first(LeadEvidence(1, 1))


def test_a_lead_from_the_shared_pool_is_believed_less_than_the_same_evidence_in_own_text():
    params = make_config(window_size=0, ngram_size=3, guess_set_size=3, lookup_context=2, shared_pool=True)
    shared = SharedPools.for_config(params)
    other = RequestLookahead(params, [0], seed=0, shared=shared)
    other.catch_up([0, 5, 6, 7, 8, 3, 3])  # another request's output: "5 6 7 8 3 3"
    state = RequestLookahead(params, [1, 2, 5, 6, 9, 4], seed=0, shared=shared)
    own = state.step_candidates(6, [5, 6])  # "5 6" -> 9 in its own prompt
    theirs = state.step_candidates(7, [6, 7])  # "6 7" -> 8 only in the other request's output
    assert own.lead[0] == 9 and own.lead_evidence == LeadEvidence(2, 1)
    assert theirs.lead[0] == 8 and theirs.lead_evidence == LeadEvidence(2, 1, shared=True)
    conf = state.acceptance.lead
    assert conf.first(theirs.lead_evidence) < 0.5 * conf.first(own.lead_evidence)
    assert conf.next(theirs.lead_evidence) < conf.next(own.lead_evidence)


@pytest.mark.parametrize("window_size, levels, columns", [(0, 0, 0), (4, 1, 0), (4, 1, 1), (4, 2, 0)])
def test_a_draft_of_nothing_is_the_root_alone_with_its_shadow_token(window_size, levels, columns):
    """What ``build`` gives when the plan drafts nothing (made without a tree builder): the root
    alone; a first-level window's column 0 (the root itself) kept as the builder would place it;
    the lead's first token as the shadow token, checked against the next emitted token."""
    params = make_config(window_size=window_size, ngram_size=3, guess_set_size=2, lookup_context=2)
    state = RequestLookahead(params, [5, 6, 7, 5, 6], seed=0)
    for _ in range(levels - 1):
        state.window.update(np.array([1, 2, 3, 4]), 0, [])
    cands = state.step_candidates(6, [5, 6])
    assert cands.lead
    draft = state.build(cands, lead=0, candidates=0, window_columns=columns)
    assert draft.tree.tokens.tolist() == [6] and draft.tree.parents.tolist() == [-1]
    assert draft.tree.depths.tolist() == [0] and draft.tree.logits.tolist() == [True]
    assert draft.tree.draft_tokens == [] and draft.sources.tolist() == [0]
    assert (draft.num_candidates, draft.lead_tokens, draft.shadow_token) == (0, 0, cands.lead[0])
    if columns:
        assert draft.window_nodes.tolist() == [0, -1, -1, -1] and draft.window_start == 1
        assert state.window.root_token == 6
    else:
        assert draft.window_nodes.size == 0 and draft.window_start is None
    state.catch_up([5, 6, 7, 5, 6, cands.lead[0]])  # the left-out token was the one emitted
    assert state.acceptance.lead.first_record.hits == 1.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9), st.sampled_from([int(s) for s in Source if s])), min_size=1, max_size=12),
    st.integers(0, 14),
    st.booleans(),
)
def test_a_lead_alone_is_the_chain_a_tree_builder_makes(lead, cut, window_left_out):
    """A draft of the lead alone -- no further candidate, no window column -- is made without a
    tree builder: the same tree, sources and record as the builder's chain."""
    from vllm_lookahead.core.request import StepCandidates
    from vllm_lookahead.core.tree import TreeBuilder

    tokens, sources = tuple(t for t, _ in lead), [s for _, s in lead]
    config = make_config(window_size=4 if window_left_out else 0, guess_set_size=3)
    state = RequestLookahead(config, [1, 2, 3, 4, 5], seed=0)
    evidence = LeadEvidence(2, 3)
    cands = StepCandidates(7, tokens, sources, [((1, 2), int(Source.OUTPUT))], lead_evidence=evidence)
    draft = state.build(cands, lead=cut, candidates=0, window_columns=0)
    if cut == 0:
        assert draft.tree.size == 1
        return
    kept = min(cut, len(tokens))
    builder = TreeBuilder(7)
    builder.add_chain(0, tokens[:kept], needs_logits=True, merge=True, sources=sources[:kept])
    want = builder.build()
    for name in ("tokens", "parents", "depths", "logits"):
        np.testing.assert_array_equal(getattr(draft.tree, name), getattr(want, name))
    np.testing.assert_array_equal(draft.sources, builder.sources)
    assert draft.window_sourced == builder.has_source(Source.WINDOW)
    assert (draft.num_candidates, draft.lead_tokens, draft.window_start) == (1, kept, None)
    assert draft.shadow_token == (tokens[kept] if kept < len(tokens) else -1)
    assert draft.lead_evidence == evidence and draft.window_columns == 0


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(2, 5),
    st.integers(0, 4),
    st.lists(st.integers(0, 4), max_size=10),
    st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=5), st.integers(0, 5)), max_size=6),
    st.sampled_from([None, 0, 1, 2, 7]),
    st.sampled_from([None, 0, 2, 5]),
    st.booleans(),
    st.sampled_from([None, 0, 3, 8, 40]),
)
def test_build_makes_the_tree_a_builder_makes_chain_by_chain(
    w, n, levels, lead, others, candidates, columns, merge, budget
):
    """build's tree (one compiled call for the chains, the window's branch written after them) is
    the one a TreeBuilder makes adding the lead, the further candidates that fit, then the window's
    columns that fit: the same nodes, sources, window outputs and draft fields."""
    config = make_config(window_size=w, ngram_size=n, guess_set_size=4)
    prompt = list(range(30))
    state, reference = RequestLookahead(config, prompt, seed=3), RequestLookahead(config, prompt, seed=3)
    for k in range(levels):  # the same window levels in both
        for s in (state, reference):
            s.window.update(np.arange(k, k + w, dtype=np.int64), 0, prompt)
    cands = StepCandidates(9, tuple(lead), [1] * len(lead), [(tuple(c), s) for c, s in others])
    got = state.build(cands, lead=None, candidates=candidates, window_columns=columns, merge=merge, budget=budget)
    room = 1 << 30 if budget is None else budget
    lead_tokens = cands.lead[:room]
    builder, used = TreeBuilder(9), 0
    if lead_tokens:
        builder.add_chain(0, lead_tokens, True, merge=merge, sources=cands.lead_sources[: len(lead_tokens)])
        used = 1
        for continuation, source in cands.others[:candidates]:
            if builder.size - 1 + len(continuation) > room:
                break
            builder.add_chain(0, continuation, True, merge=merge, sources=source)
            used += 1
    fit = reference._columns_that_fit(reference.window, columns, room - (builder.size - 1)) if columns != 0 else 0
    if got.tree.size == 1 and not lead_tokens:
        return  # a draft of nothing (no_draft): no tree built
    assert got.num_candidates == used and got.lead_tokens == len(lead_tokens)
    window_start = builder.size if fit else None
    window_nodes = reference.window.add_to_tree(builder, root=0, columns=fit) if fit else np.zeros(0, dtype=np.int64)
    want = builder.build()
    for name in ("tokens", "parents", "depths", "logits"):
        np.testing.assert_array_equal(getattr(got.tree, name), getattr(want, name))
        assert getattr(got.tree, name).dtype == getattr(want, name).dtype
    np.testing.assert_array_equal(got.sources, builder.sources)
    np.testing.assert_array_equal(got.window_nodes, window_nodes)
    assert got.window_start == window_start
    assert got.window_sourced == builder.has_source(Source.WINDOW)
    assert state.window.root_token == reference.window.root_token
