"""Key names of the n-gram pools: one int for two or three tokens below 2**21, a tuple otherwise."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.ngram_keys import NAME_BITS, key_name, key_names, key_tokens
from vllm_lookahead.core.pool import NgramPool
from vllm_lookahead.core.source import Source

BIG = 1 << NAME_BITS  # the first token that does not pack
_tokens = st.sampled_from([0, 1, 2, BIG - 1, BIG, BIG + 1])


@given(tokens=st.lists(_tokens, min_size=1, max_size=4))
def test_a_name_stands_for_its_tokens_and_packs_only_small_keys_of_two_or_three(tokens):
    name = key_name(tokens)
    assert key_tokens(name, len(tokens)) == tuple(tokens) or len(tokens) == 1
    if len(tokens) == 1:
        assert name == tokens[0]
    else:
        assert isinstance(name, int) == (len(tokens) <= 3 and max(tokens) < BIG)


@given(seq=st.lists(_tokens, max_size=12), context=st.integers(1, 4), data=st.data())
def test_the_names_of_a_text_are_each_keys_name(seq, context, data):
    count = data.draw(st.integers(0, max(0, len(seq) - context + 1)))
    assert key_names(seq, context, count) == [key_name(seq[p : p + context]) for p in range(count)]


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.lists(_tokens, max_size=30),
    text=st.lists(_tokens, max_size=20),
    ngram_size=st.integers(2, 4),
    context=st.integers(1, 3),
)
def test_keys_with_tokens_too_large_to_pack_are_stored_and_found(prompt, text, ngram_size, context):
    """A seeded pool and one fed n-gram by n-gram agree when some tokens do not pack (the prompt's
    index then names its keys by tuples, the pool names small keys by ints)."""
    seeded = NgramPool(ngram_size, 3, 1000, context=context)
    added = NgramPool(ngram_size, 3, 1000, context=context)
    seeded.seed(np.array(prompt, dtype=np.int64))
    added.add_sequence(prompt, source=Source.PROMPT)
    for pool in (seeded, added):
        pool.add_sequence([*prompt, *text], start=len(prompt))
    keys = {tuple(t[p : p + context]) for t in (prompt, [*prompt, *text]) for p in range(len(t) - context + 1)}
    for key in sorted(keys):
        assert seeded.get_sourced(list(key), 10) == added.get_sourced(list(key), 10)
    assert (len(seeded), seeded.num_keys) == (len(added), added.num_keys)
    assert sorted(seeded.keys()) == sorted(added.keys())
