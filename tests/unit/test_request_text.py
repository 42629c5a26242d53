"""A request's lookups over all its pools (one compiled call each) against the rules written
pool by pool in plain Python: the same candidates, sources, evidence and lead, and the same
pools afterwards (every pool asked has its key moved to most recent, as one pool's lookup does)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from support import make_config
from vllm_lookahead.core.pool import NgramPool, SharedPools
from vllm_lookahead.core.request_text import RequestText

TOKENS = st.integers(0, 5)


def _asked(text: RequestText) -> list[NgramPool]:
    return text._lookup_pools()


def reference_lookup(text: RequestText, recent: list[int], limit: int) -> tuple[list, int, int]:
    """Each pool in turn, longest context first (own, then shared), until ``limit`` distinct."""
    tokens = np.array(recent[-text.config.lookup_context :], dtype=np.int64)
    out: list[tuple[tuple[int, ...], int]] = []
    first = None
    for pool in _asked(text):
        if len(out) >= limit:
            break
        if len(tokens) < pool.context:
            continue
        for cont, source in pool.get_after(tokens, limit):
            if cont not in [c for c, _ in out]:
                out.append((cont, source))
                first = first or pool
                if len(out) >= limit:
                    break
    if first is None:
        return out, 0, 0
    return out, first.context, first.support(tokens.tolist(), out[0][0][0])


def reference_grow(
    text: RequestText, first: tuple[int, ...], source: int, recent: list[int], length: int
) -> tuple[tuple[int, ...], list[int]]:
    """The lead grown by the most recent continuation of its last ``lookup_context`` tokens."""
    context = text.config.lookup_context
    draft, sources = list(first[:length]), [source] * len(first[:length])
    while len(draft) < length:
        tokens = np.array([*recent[-context:], *draft][-context:], dtype=np.int64)
        more = None
        for pool in _asked(text):
            if len(tokens) >= pool.context:
                got = pool.get_after(tokens, 1)
                if got:
                    more = got[0]
                    break
        if more is None:
            break
        piece = more[0][: length - len(draft)]
        draft.extend(piece)
        sources.extend([more[1]] * len(piece))
    return tuple(draft), sources


def _everything(text: RequestText) -> list:
    return [pool.items() for pool in _asked(text)]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("learn"), st.lists(TOKENS, min_size=1, max_size=12)),
        st.tuples(st.just("lookup"), st.lists(TOKENS, min_size=1, max_size=4), st.integers(0, 9)),
        st.tuples(st.just("grow"), st.lists(TOKENS, min_size=1, max_size=4), st.integers(0, 12)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.lists(TOKENS, max_size=30),
    ops=OPS,
    ngram_size=st.integers(2, 4),
    guess_set_size=st.integers(1, 3),
    lookup_context=st.integers(1, 3),
    shared_pool=st.booleans(),
    max_pool_keys=st.integers(1, 12),
)
def test_one_call_over_every_pool_follows_the_rules_pool_by_pool(
    prompt, ops, ngram_size, guess_set_size, lookup_context, shared_pool, max_pool_keys
):
    config = make_config(
        ngram_size=ngram_size,
        guess_set_size=guess_set_size,
        lookup_context=lookup_context,
        shared_pool=shared_pool,
        max_pool_keys=max_pool_keys,
    )
    twins = []
    for _ in range(2):
        shared = SharedPools.for_config(config) if shared_pool else None
        twins.append(RequestText(config, prompt, shared))
    compiled, reference = twins
    history = list(prompt)
    for op in ops:
        if op[0] == "learn":
            history += op[1]
            for text in twins:
                text.catch_up(history)
        elif op[0] == "lookup":
            recent, limit = op[1], op[2]
            looked = compiled.lookup(recent, limit)
            assert (looked.found, looked.context, looked.support) == reference_lookup(reference, recent, limit)
        else:
            recent, length = op[1], op[2]
            found = reference_lookup(reference, recent, 1)[0]
            assert compiled.lookup(recent, 1).found == found
            first, source = found[0] if found else ((), 0)
            assert compiled.grow_lead(first, source, recent, length) == reference_grow(
                reference, first, source, recent, length
            )
        assert _everything(compiled) == _everything(reference)
