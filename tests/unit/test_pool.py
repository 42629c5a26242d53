"""NgramPool: per-key LRU of continuations, key-table LRU, incremental learning."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core import NgramPool
from vllm_lookahead.core.pool import add_to_each
from vllm_lookahead.core.source import Source


def test_add_and_get_most_recent_first():
    pool = NgramPool(3, 4)
    pool.add((1, 2, 3))
    pool.add((1, 4, 5))
    pool.add((2, 9, 9))
    assert pool.get(1, 10) == [(4, 5), (2, 3)]
    assert pool.get(2, 10) == [(9, 9)]
    assert pool.get(3, 10) == []
    assert len(pool) == 3
    assert pool.num_keys == 2


def test_readding_moves_to_most_recent_without_duplicating():
    pool = NgramPool(3, 4)
    pool.add((1, 2, 3))
    pool.add((1, 4, 5))
    pool.add((1, 2, 3))
    assert pool.get(1, 10) == [(2, 3), (4, 5)]
    assert len(pool) == 2


def test_guess_set_size_bounds_values_per_key_lru():
    pool = NgramPool(2, 2)
    pool.add((1, 10))
    pool.add((1, 11))
    pool.add((1, 10))  # refresh 10 -> 11 is now least recent
    pool.add((1, 12))
    assert pool.get(1, 10) == [(12,), (10,)]
    assert len(pool) == 2


def test_get_limit():
    pool = NgramPool(2, 5)
    for t in range(5):
        pool.add((0, t))
    assert pool.get(0, 2) == [(4,), (3,)]
    assert pool.get(0, 0) == []


def test_zero_guess_set_stores_nothing():
    pool = NgramPool(3, 0)
    pool.add((1, 2, 3))
    pool.add_sequence([1, 2, 3, 4, 5])
    assert len(pool) == 0
    assert pool.num_keys == 0
    assert pool.get(1, 10) == []


def test_key_table_is_lru_bounded():
    pool = NgramPool(2, 3, max_keys=2)
    pool.add((1, 5))
    pool.add((1, 6))
    pool.add((2, 5))
    pool.get(1, 1)  # use key 1 -> key 2 becomes least recent
    pool.add((3, 5))
    assert pool.num_keys == 2
    assert pool.get(2, 10) == []
    assert pool.get(1, 10) == [(6,), (5,)]
    assert pool.get(3, 10) == [(5,)]
    assert len(pool) == 3  # evicting key 2 dropped its single n-gram


def test_wrong_length_rejected():
    pool = NgramPool(3, 2)
    with pytest.raises(ValueError):
        pool.add((1, 2))


def test_add_sequence_start():
    pool = NgramPool(3, 10)
    pool.add_sequence([1, 2, 3, 4, 5], start=4)  # only the n-gram ending at index 4
    assert pool.get(3, 10) == [(4, 5)]
    assert len(pool) == 1
    pool.add_sequence([1, 2, 3, 4, 5], start=0)
    assert len(pool) == 3
    pool.add_sequence([1, 2], start=0)  # shorter than N: nothing
    assert len(pool) == 3


def snapshot(pool: NgramPool, vocab: int) -> tuple:
    import itertools

    keys = list(itertools.product(range(vocab), repeat=pool.context))
    return (len(pool), pool.num_keys, [pool.get(k if pool.context > 1 else k[0], 1000) for k in keys])


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=6),
    ngram_size=st.integers(2, 5),
    guess_set_size=st.integers(0, 4),
    max_keys=st.integers(1, 8),
    context=st.integers(1, 3),
)
def test_incremental_add_sequence_equals_full_recompute(tokens, cuts, ngram_size, guess_set_size, max_keys, context):
    full = NgramPool(ngram_size, guess_set_size, max_keys, context=context)
    full.add_sequence(tokens)

    incremental = NgramPool(ngram_size, guess_set_size, max_keys, context=context)
    previous_length = 0
    for end in sorted({min(c, len(tokens)) for c in cuts} | {len(tokens)}):
        incremental.add_sequence(tokens[:end], start=previous_length)
        previous_length = end
    assert snapshot(incremental, 6) == snapshot(full, 6)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), max_size=40),
    start=st.integers(0, 45),
    ngram_size=st.integers(2, 5),
    guess_set_size=st.integers(0, 3),
    max_keys=st.integers(1, 6),
    context=st.integers(1, 3),
    sources=st.lists(st.sampled_from(list(Source)), min_size=1, max_size=3),
    as_array=st.booleans(),
)
def test_add_sequence_equals_add_of_each_ngram(
    tokens, start, ngram_size, guess_set_size, max_keys, context, sources, as_array
):
    """The batched path stores exactly what one ``add`` per n-gram stores: keys and values in
    the same LRU order, with the same sources and counts (numpy input included)."""
    fast = NgramPool(ngram_size, guess_set_size, max_keys, context=context)
    slow = NgramPool(ngram_size, guess_set_size, max_keys, context=context)
    span = fast.span
    seq = np.array(tokens, dtype=np.int64) if as_array else tokens
    for source in sources:  # re-adding with other sources exercises the kept-lowest source and the counts
        fast.add_sequence(seq, start=start, source=source)
        for p in range(max(0, start - span + 1), len(tokens) - span + 1):
            slow.add(tokens[p : p + span], source)
    assert fast.items() == slow.items()
    assert len(fast) == len(slow)


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.lists(st.integers(0, 5), max_size=30), st.integers(0, 35)), max_size=5),
    ngram_size=st.integers(2, 4),
    guess_set_size=st.integers(0, 3),
    max_keys=st.integers(1, 40),
    contexts=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    source=st.sampled_from(list(Source)),
)
def test_adding_to_several_pools_at_once_equals_adding_to_each(
    chunks, ngram_size, guess_set_size, max_keys, contexts, source
):
    """One compiled call over several pools (a request's text pools) stores what each pool's own
    ``add_sequence`` stores, the arrays growing as they fill."""
    together = [NgramPool(ngram_size, guess_set_size, max_keys, context=k) for k in contexts]
    apart = [NgramPool(ngram_size, guess_set_size, max_keys, context=k) for k in contexts]
    for tokens, start in chunks:
        add_to_each(together, tokens, start, source)
        for pool in apart:
            pool.add_sequence(tokens, start, source)
    assert [pool.items() for pool in together] == [pool.items() for pool in apart]
    assert [len(pool) for pool in together] == [len(pool) for pool in apart]


@settings(max_examples=200, deadline=None)
@given(
    ngrams=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 3)), max_size=80),
    guess_set_size=st.integers(0, 4),
    max_keys=st.integers(1, 5),
)
def test_pool_matches_reference_model(ngrams, guess_set_size, max_keys):
    """Compare with a naive list-based LRU model."""
    pool = NgramPool(3, guess_set_size, max_keys)
    keys: list[int] = []  # least recent first
    values: dict[int, list[tuple]] = {}
    for ngram in ngrams:
        pool.add(ngram)
        if guess_set_size == 0:
            continue
        key, value = ngram[0], tuple(ngram[1:])
        if key in keys:
            keys.remove(key)
        elif len(keys) >= max_keys:
            del values[keys.pop(0)]
        keys.append(key)
        entries = [v for v in values.get(key, []) if v != value] + [value]
        values[key] = entries[-guess_set_size:]
    assert len(pool) == sum(len(v) for v in values.values())
    assert pool.num_keys == len(keys)
    assert all(len(pool.get(k, 100)) <= guess_set_size for k in range(5))
    for key in range(5):
        assert pool.get(key, 100) == list(reversed(values.get(key, [])))


def test_context_keys():
    pool = NgramPool(3, 2, context=2)
    pool.add_sequence([1, 2, 3, 4, 9, 2, 3, 5])
    assert pool.span == 4
    assert pool.get([1, 2], 5) == [(3, 4)]
    assert pool.get([7, 1, 2], 5) == [(3, 4)]  # only the last two tokens are the key
    assert pool.get([9, 2], 5) == [(3, 5)]
    assert pool.get([2], 5) == []  # shorter than the context: no match
    assert pool.get(2, 5) == []
    with pytest.raises(ValueError):
        pool.add([1, 2, 3])


def test_support_counts_how_often_a_first_token_followed_the_key():
    pool = NgramPool(3, 4, context=2)
    for ngram in ((7, 8, 1, 2), (7, 8, 1, 3), (7, 8, 1, 2), (7, 8, 5, 5), (9, 8, 1, 2)):
        pool.add(ngram)
    assert pool.support((6, 7, 8), 1) == 3  # (1, 2) twice and (1, 3) once after (7, 8); the last 2 tokens key
    assert pool.support((7, 8), 5) == 1 and pool.support((7, 8), 4) == 0 and pool.support((0, 8), 1) == 0
    assert pool.support((8,), 1) == 0  # shorter than the key
    before = pool.get((9, 8), 1)
    pool.support((7, 8), 1)  # reading support does not change what the LRU evicts
    pool.add((3, 3, 0, 0))
    assert pool.get((9, 8), 1) == before
    one = NgramPool(3, 2)
    for ngram in ((4, 1, 1), (4, 1, 2), (4, 1, 1)):
        one.add(ngram)
    assert one.support(4, 1) == 3
    one.add((4, 2, 2))  # G = 2: the least recent continuation, (1, 2), falls out with its count
    assert one.support(4, 1) == 2 and one.support(4, 2) == 1


def test_a_pool_that_evicts_for_long_keeps_the_lru_keys():
    """Thousands of evictions (each a deletion from the hash table): the keys and
    continuations of a list-based LRU model, through adds, batched adds and lookups."""
    rng = np.random.default_rng(7)
    pool = NgramPool(3, 2, max_keys=5)
    keys: list[int] = []  # least recent first
    values: dict[int, list[tuple[int, int]]] = {}

    def touch(key: int, value: tuple[int, int] | None) -> None:
        if key in keys:
            keys.remove(key)
        elif value is None:
            return
        elif len(keys) >= 5:
            del values[keys.pop(0)]
        keys.append(key)
        if value is not None:
            values[key] = ([v for v in values.get(key, []) if v != value] + [value])[-2:]

    for step in range(3000):
        text = rng.integers(0, 40, size=int(rng.integers(3, 8))).tolist()
        pool.add_sequence(text)
        for p in range(len(text) - 2):
            touch(text[p], (text[p + 1], text[p + 2]))
        key = int(rng.integers(0, 40))
        assert pool.get(key, 2) == list(reversed(values.get(key, [])))
        touch(key, None)
        if step % 500 == 0:
            assert pool.keys() == [(k,) for k in keys]
    assert pool.keys() == [(k,) for k in keys] and len(pool) == sum(len(v) for v in values.values())


class _ReferencePool:
    """The pool's rules in plain Python: keys and each key's continuations in LRU order (least
    recent first), each continuation with its lowest source and the times it was added."""

    def __init__(self, context: int, span: int, guess_set_size: int, max_keys: int) -> None:
        self.context, self.span, self.limit, self.max_keys = context, span, guess_set_size, max_keys
        self.table: dict[tuple, list[list]] = {}

    def add_sequence(self, tokens: list[int], source: int) -> None:
        for p in range(len(tokens) - self.span + 1):
            key, value = tuple(tokens[p : p + self.context]), tuple(tokens[p + self.context : p + self.span])
            held = self.table.pop(key, None)
            if held is None:
                if len(self.table) >= self.max_keys:
                    del self.table[next(iter(self.table))]
                held = []
            same = [entry for entry in held if entry[0] == value]
            if same:
                held.remove(same[0])
                held.append([value, min(same[0][1], source), same[0][2] + 1])
            else:
                held = ([*held, [value, source, 1]])[-self.limit :]
            self.table[key] = held

    def get_sourced(self, key: tuple, limit: int) -> list[tuple[tuple[int, ...], int]]:
        held = self.table.pop(key, None)
        if held is None:
            return []
        self.table[key] = held
        return [(value, source) for value, source, _ in reversed(held)][:limit]

    def support(self, key: tuple, first: int) -> int:
        return sum(count for value, _, count in self.table.get(key, []) if value[0] == first)

    def items(self) -> list:
        return [(key, [tuple(entry) for entry in held]) for key, held in self.table.items()]


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.lists(st.integers(0, 30), max_size=40), st.sampled_from(list(Source))),
            st.tuples(st.just("get"), st.lists(st.integers(0, 30), min_size=3, max_size=3), st.integers(1, 5)),
            st.tuples(st.just("support"), st.lists(st.integers(0, 30), min_size=3, max_size=3), st.integers(0, 30)),
        ),
        max_size=40,
    ),
    ngram_size=st.integers(2, 5),
    guess_set_size=st.integers(1, 5),
    max_keys=st.integers(1, 80),
    context=st.integers(1, 3),
)
def test_the_compiled_pool_follows_the_reference_rules(ops, ngram_size, guess_set_size, max_keys, context):
    """Many keys in a growing hash table, evictions (and the deletions they make in it) included:
    the pool holds, answers and counts what the plain-Python rules do."""
    pool = NgramPool(ngram_size, guess_set_size, max_keys, context=context)
    model = _ReferencePool(context, pool.span, guess_set_size, max_keys)
    for kind, tokens, arg in ops:
        key = tuple(tokens[len(tokens) - context :])
        if kind == "add":
            pool.add_sequence(tokens, source=arg)
            model.add_sequence(tokens, int(arg))
        elif kind == "get":
            assert pool.get_sourced(key, arg) == model.get_sourced(key, arg)
        else:
            assert pool.support(key, arg) == model.support(key, arg)
    assert pool.items() == model.items()
    assert len(pool) == sum(len(held) for held in model.table.values()) and pool.num_keys == len(model.table)


def test_numba_loads_after_the_plugin_and_compiles_every_loop_at_start_up():
    """In a fresh process: loading the plugin imports no numba (vLLM's CPU worker scans every loaded
    module when it starts, and fails on what numba loads: ngram_table.load), and ``compile_pools``,
    ``compile_plan``, ``compile_layout``, ``compile_tree`` and ``compile_walks`` (start-up) leave
    none of the loops a step calls to compile later."""
    check = (
        "import sys\n"
        "from vllm_lookahead.engine.hooks import plugin\n"
        "plugin.register()\n"
        "assert 'numba' not in sys.modules\n"
        "from vllm_lookahead.core import ngram_table as t\n"
        "from vllm_lookahead.config import LookaheadConfig\n"
        "from vllm_lookahead.core.request_text import compile_pools\n"
        "compile_pools(LookaheadConfig())\n"
        "assert all(getattr(t, name).signatures for name in t.LOOPS), t.LOOPS\n"
        "compiled = {name: len(getattr(t, name).signatures) for name in t.LOOPS}\n"
        "from vllm_lookahead.core.request_text import RequestText\n"
        "RequestText(LookaheadConfig(), list(range(3000))).catch_up(list(range(3010)))\n"  # a long prompt
        "from vllm_lookahead.core.pool_batch import compile_batch\n"
        "compile_batch(LookaheadConfig())\n"  # a batch's step, as the engine's
        "import numpy as np\n"
        "from vllm_lookahead.core.pool_batch import PoolBatch\n"
        "from vllm_lookahead.core.request import RequestLookahead\n"
        "batch, grown = PoolBatch(LookaheadConfig()), RequestLookahead(LookaheadConfig(), [1, 2, 3], seed=0)\n"
        "batch.add(grown.text)\n"
        "batch.learn([grown.text], (np.arange(9000, dtype=np.int32) % 7919)[None], [0], [3], [9000])\n"  # pools grow
        "assert grown.text.pool_ngrams > 8000\n"
        "batch.remove(grown.text)\n"
        "assert compiled == {name: len(getattr(t, name).signatures) for name in t.LOOPS}\n"
        "from vllm_lookahead.core import plan_loop as p\n"
        "from vllm_lookahead.core.draft_rule import DraftOptions, compile_plan, plan_step\n"
        "from vllm_lookahead.core.step_cost import StepCost\n"
        "compile_plan()\n"
        "assert len(p.plan.signatures) == 1 and len(p.plan_rows.signatures) == 1\n"
        "assert len(p.draft_rows.signatures) == 1, p.draft_rows.signatures\n"  # compile_batch: the rule's batch step
        "from vllm_lookahead.core import acceptance_rows as a\n"
        "rows_compiled = lambda: [len(getattr(a, name).signatures) for name in a.LOOPS]\n"
        "assert rows_compiled() == [1, 1], rows_compiled()\n"
        "from vllm_lookahead.core.draft_rule import Acceptance, LeadConfidence, LeadEvidence, PooledConfidence\n"
        "x = Acceptance(LeadConfidence(PooledConfidence()))\n"  # a request's observations, as the engine's
        "x.observe(lead=3, lead_accepted=3, candidates=0, accepted=3, window_columns=0, window_accepted=0,"
        " evidence=LeadEvidence(2, 5, True), lead_drafted=False)\n"
        "x.lead.shifts(), x.window_column.add(0.5, 1)\n"
        "assert rows_compiled() == [1, 1], rows_compiled()\n"
        "plan_step([], StepCost((4,), (0.01,)), base_tokens=3)\n"
        "plan_step([None, DraftOptions((0.5,))], StepCost((1, 8), (0.01, 0.02)))\n"
        "assert len(p.plan.signatures) == 1, p.plan.signatures\n"
        "import numpy as np, torch\n"
        "from vllm_lookahead.core import DraftTree, StepDraft\n"
        "from vllm_lookahead.engine.step import layout_loop as l\n"
        "from vllm_lookahead.engine.step.tree_batch import build_tree_batch\n"
        "l.compile_layout()\n"
        "assert len(l.logits_layout.signatures) == 1\n"
        "i32 = lambda *xs: np.array(xs, dtype=np.int32)\n"
        "tree = DraftTree(np.array([1, 2, 3]), i32(-1, 0, 0), i32(0, 1, 1), np.ones(3, dtype=bool))\n"
        "draft = StepDraft(tree, np.zeros(0, dtype=np.int64), 1)\n"
        "qsl = i32(0, 1, 4)\n"  # vLLM's arrays
        "build_tree_batch(['a', 'b'], {'b': [2, 3]}, {'b': draft}.get, qsl, np.diff(qsl), i32(0, 0), 'cpu', True)\n"
        "assert len(l.logits_layout.signatures) == 1, l.logits_layout.signatures\n"
        "from vllm_lookahead.core import tree as tr\n"
        "tr.compile_tree()\n"
        "assert len(tr._loops().words.signatures) == 1\n"
        "from vllm_lookahead.core import TreeBuilder\n"
        "builder = TreeBuilder(1)\n"
        "builder.add_nodes([0, 0], [2, 3], True)\n"
        "builder.build().ancestor_words()\n"  # a branching tree as the engine's are made
        "assert len(tr._loops().words.signatures) == 1, tr._loops().words.signatures\n"
        "assert len(tr._loops().chains.signatures) == 1\n"
        "from vllm_lookahead.core.request import StepCandidates\n"
        "state = RequestLookahead(LookaheadConfig(), list(range(50)), seed=0)\n"
        "state.build(StepCandidates(3, (4, 5), [1, 1], [((4, 6, 7, 8), 2)]), window_columns=None)\n"  # as a step builds
        "state.build(StepCandidates(3, (4, 5), [1, 1], [((4, 6, 7, 8), 2)]), merge=False, budget=4)\n"
        "assert len(tr._loops().chains.signatures) == 1, tr._loops().chains.signatures\n"
        "from vllm_lookahead.core import sampling as s\n"
        "s.compile_walks()\n"
        "counts = lambda: [len(f.signatures) for f in vars(s._loops()).values()]\n"
        "assert counts() == [1, 1, 1], counts()\n"
        "trees = [tree, builder.build()]\n"  # a step's walks over its trees
        "s.coupled_walks([(t, 2) for t in trees], lambda reached: [3] * len(reached))\n"
        "s.Forest(trees).followed(np.concatenate([t.tokens for t in trees]))\n"
        "assert counts() == [1, 1, 1], counts()\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True)
