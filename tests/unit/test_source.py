"""Attribution of draft tokens to their source: prompt, output or Jacobi window n-grams."""

from __future__ import annotations

import numpy as np
from test_request import PERIOD, greedy_reference, periodic_oracle, simulate

from support import make_config
from support.drafting import draft_one
from vllm_lookahead.core import NgramPool, RequestLookahead, Source, count_by_source
from vllm_lookahead.engine.metrics.stats import LookaheadStats


def test_pool_keeps_the_textual_source_of_an_ngram():
    pool = NgramPool(3, 4)
    pool.add((1, 2, 3), Source.WINDOW)
    pool.add((1, 4, 5), Source.PROMPT)
    assert pool.get_sourced(1, 10) == [((4, 5), Source.PROMPT), ((2, 3), Source.WINDOW)]
    pool.add((1, 2, 3), Source.OUTPUT)  # the window's n-gram appears in the output: text lookup finds it now
    pool.add((1, 4, 5), Source.WINDOW)  # re-made by the window: still a prompt n-gram
    assert pool.get_sourced(1, 10) == [((4, 5), Source.PROMPT), ((2, 3), Source.OUTPUT)]
    assert pool.get(1, 10) == [(4, 5), (2, 3)]


def test_candidates_carry_their_pools_source_and_the_window_branch_is_window():
    params = make_config(window_size=3, ngram_size=3, guess_set_size=3, max_lead_tokens=0)
    req = RequestLookahead(params, [5, 6, 7, 8], seed=0)
    history = [5, 6, 7, 8, 5, 9, 9]
    req.catch_up(history)  # output n-grams 8 5 9 / 5 9 9
    draft = draft_one(req, 5, [7, 8, 5])
    tokens = draft.tree.tokens.tolist()
    sources = draft.sources.tolist()
    # the longest context (7 8 5) is nowhere; (8 5) -> 9 9 is output; 5 -> 6 7 is the prompt's
    first = {tokens[i]: sources[i] for i in range(1, draft.window_start) if draft.tree.parents[i] == 0}
    assert first == {9: Source.OUTPUT, 6: Source.PROMPT}
    assert set(sources[draft.window_start :]) == {Source.WINDOW}
    assert count_by_source(draft.sources, np.arange(1, draft.tree.size)) == {
        "prompt": 2,
        "output": 2,
        "shared": 0,
        "window": draft.tree.size - draft.window_start,
    }


def test_window_ngrams_are_credited_to_the_window_until_the_text_has_them():
    params = make_config(window_size=3, ngram_size=3, guess_set_size=3)
    req = RequestLookahead(params, [1, 2], seed=0)
    draft = draft_one(req, 2, [1, 2])
    # a two-level window: run it so its outputs form n-grams
    argmax = np.full(draft.tree.size, 7, dtype=np.int64)
    req.observe(draft, draft.tree.size, argmax, [7], [1, 2, 7])
    draft = draft_one(req, 7, [1, 2, 7])
    argmax = np.full(draft.tree.size, 4, dtype=np.int64)
    req.observe(draft, draft.tree.size, argmax, [4], [1, 2, 7, 4])
    window_ngrams = [(v, s) for key in range(10) for v, s in req.text.pool.get_sourced(key, 10) if s == Source.WINDOW]
    assert window_ngrams, "the full window produced n-grams"


def test_accepted_tokens_come_from_the_prompt_when_it_holds_the_answer():
    oracle = periodic_oracle(PERIOD)
    prompt = PERIOD * 2
    output, _, run = simulate(make_config(), prompt, oracle, 100)
    assert output == greedy_reference(oracle, prompt, 100)
    assert run.accepted_from[Source.PROMPT] > 0.8 * sum(run.accepted_from.values())


def test_accepted_tokens_come_from_the_window_when_no_text_holds_them():
    oracle = periodic_oracle(PERIOD)
    prompt = [3, 1]
    params = make_config(pool_from_prompt=False, pool_from_output=False)
    output, _, run = simulate(params, prompt, oracle, 150, seed=5)
    assert output == greedy_reference(oracle, prompt, 150)
    assert run.accepted_from[Source.WINDOW] == sum(run.accepted_from.values()) > 100
    # the same request with the text pools: once the cycle is in the output, the output takes over
    output, _, run = simulate(make_config(), prompt, oracle, 150, seed=5)
    assert run.accepted_from[Source.OUTPUT] > run.accepted_from[Source.WINDOW]


def test_without_a_window_nothing_is_credited_to_it():
    oracle = periodic_oracle(PERIOD)
    params = make_config(window_size=0)
    output, req, run = simulate(params, PERIOD * 2, oracle, 80)
    assert output == greedy_reference(oracle, PERIOD * 2, 80)
    assert req.window is None and Source.WINDOW not in run.sources
    assert run.tokens_per_step > 4


def test_stats_count_window_steps_and_accepted_tokens_by_source():
    params = make_config(window_size=2, ngram_size=3, guess_set_size=2, max_lead_tokens=0)
    req = RequestLookahead(params, [1, 2, 3, 1, 2, 4], seed=0)
    draft = draft_one(req, 2, [1, 2])
    assert draft.window_start is not None
    stats = LookaheadStats()
    candidate_nodes = np.arange(1, draft.window_start)
    path = candidate_nodes[:2]  # the first candidate (a prompt n-gram) accepted
    stats.on_verified(draft.tree.size - 1, len(path), draft, draft.sources[path].tolist())
    assert stats.accepted_by_source == {"prompt": 2, "output": 0, "shared": 0, "window": 0}
    assert stats.window_steps == 1 and stats.window_tokens == draft.tree.size - draft.window_start
    # the scheduler ran only the candidates: the window did not run this step
    stats.on_verified(draft.window_start - 1, 0, draft, [])
    assert stats.window_steps == 1 and stats.steps == 2
    snap = stats.snapshot()
    assert snap["lookahead_accepted_prompt"] == 2 and snap["lookahead_window_steps"] == 1


def test_a_shared_pool_drafts_other_requests_output_credited_as_shared():
    from vllm_lookahead.core.pool import SharedPools

    params = make_config(window_size=0, ngram_size=3, guess_set_size=2)
    shared = SharedPools.for_config(params)
    first = RequestLookahead(params, [1, 2], seed=0, shared=shared)
    first.catch_up([1, 2, 40, 41, 42, 43])  # its output: 40 41 42 43
    second = RequestLookahead(params, [9, 9], seed=0, shared=shared)
    draft = draft_one(second, 40, [9, 40])
    assert draft.tree.draft_tokens[:2] == [41, 42]
    assert draft.sources[1:3].tolist() == [Source.SHARED, Source.SHARED]
    alone = RequestLookahead(params, [9, 9], seed=0)  # no shared pool: nothing to draft
    assert draft_one(alone, 40, [9, 40]).tree.size == 1
    # prompts are never shared
    third = RequestLookahead(params, [9, 9], seed=0, shared=shared)
    assert draft_one(third, 1, [9, 1]).tree.size == 1
