"""A batch of requests' pools learnt into and asked in one compiled call per phase
(:class:`~vllm_lookahead.core.pool_batch.PoolBatch`) against each request's own calls: the same
candidates (lead, sources, evidence, odds, further candidates) and the same pools afterwards,
through learning, lookups, pools growing and requests leaving and joining, for requests whose
records shift their leads' odds each their own way."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from support import make_config
from vllm_lookahead.core.draft_rule import LeadEvidence, PooledConfidence
from vllm_lookahead.core.pool_batch import PoolBatch, compile_batch
from vllm_lookahead.core.request import RequestLookahead

TOKENS = st.integers(0, 5)
WIDTH = 400  # token array columns


def _pools(state: RequestLookahead) -> list:
    return [pool.items() for pool in state.text.pools()]


class Twin:
    """One request twice: asked on its own (the reference) and through the batch."""

    def __init__(self, config, prompt: list[int], batch: PoolBatch, row: int, tokens: np.ndarray) -> None:
        self.own, self.batched = (RequestLookahead(config, prompt, seed=0, pooled=PooledConfidence()) for _ in range(2))
        for state in (self.own, self.batched):  # records of its own that shift its leads' odds
            for tried, accepted in ((3, 2), (1, 0), (6, 6))[: row % 4]:
                state.acceptance.lead.observe(LeadEvidence(1 + row % 3, 1 + row), tried, accepted)
        assert batch.add(self.batched.text)
        self.history = list(prompt)
        self.row = row
        tokens[row, : len(prompt)] = prompt

    def same(self) -> None:
        assert _pools(self.own) == _pools(self.batched)
        assert self.own.text.known == self.batched.text.known


def _step(batch: PoolBatch, twins: list[Twin], tokens: np.ndarray, learns: list, asks: list) -> None:
    """Some twins learn new tokens (``learns``: (twin, tokens, as an observation or a catch-up)),
    then some ask for candidates (``asks``: (twin, root is the last token, room, one candidate,
    floor))."""
    texts, rows, starts, lengths = [], [], [], []
    for twin, new, observed in learns:
        start = len(twin.history)
        twin.history += new
        end = len(twin.history)
        tokens[twin.row, start:end] = new
        if observed:  # observe(): the n-grams ending in the new tokens
            twin.own.text.learn(*twin.own.text.tail(len(new), twin.history), end)
            twin.batched.text.known = end
        else:
            start = twin.batched.text.known
            twin.own.catch_up(twin.history)
            twin.batched.catch_up(twin.history, learn=False)
        texts.append(twin.batched.text)
        rows.append(twin.row)
        starts.append(start)
        lengths.append(end)
    batch.learn(texts, tokens, rows, starts, lengths)
    for twin, *_ in learns:
        twin.same()
    questions, expected = [], []
    for twin, at_end, room, one, floor in asks:
        last = twin.history[-1] if twin.history else 0
        root = last if at_end else (last + 1) % 6  # the text ends with its root, or not
        recent = twin.history[-twin.own.config.lookup_context :]
        expected.append(twin.own.step_candidates(root, recent, room, 1 if one else None, min_gain=floor))
        questions.append((twin.batched, twin.row, len(twin.history), root, room, 1 if one else None, floor))
    assert batch.step_candidates(questions, tokens) == expected
    for twin, *_ in asks:
        twin.same()


STEPS = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 3), st.lists(TOKENS, min_size=1, max_size=8), st.booleans()), max_size=4),
        st.lists(
            st.tuples(
                st.integers(0, 3), st.booleans(), st.integers(0, 9), st.booleans(), st.sampled_from([0.0, 0.3, 0.9])
            ),
            max_size=4,
        ),
        st.integers(-1, 3),  # a request that finishes (its block goes to a new one)
    ),
    max_size=12,
)


@settings(max_examples=120, deadline=None)
@given(
    prompts=st.lists(st.lists(TOKENS, max_size=20), min_size=4, max_size=4),
    steps=STEPS,
    ngram_size=st.integers(2, 4),
    guess_set_size=st.integers(1, 3),
    lookup_context=st.integers(1, 3),
    max_pool_keys=st.integers(1, 12),
    capped=st.booleans(),
)
def test_a_batch_learns_and_answers_as_each_request_on_its_own(
    prompts, steps, ngram_size, guess_set_size, lookup_context, max_pool_keys, capped
):
    config = make_config(
        ngram_size=ngram_size,
        guess_set_size=guess_set_size,
        lookup_context=lookup_context,
        max_pool_keys=max_pool_keys,
        **({"max_tokens_per_step": 16} if capped else {}),
    )
    batch = PoolBatch(config)
    tokens = np.zeros((4, WIDTH), dtype=np.int32)
    twins = [Twin(config, prompt, batch, row, tokens) for row, prompt in enumerate(prompts)]
    for learns, asks, finished in steps:
        learn_once = {k: (twins[k], new, observed) for k, new, observed in learns}  # a request once a step
        _step(
            batch,
            twins,
            tokens,
            list(learn_once.values()),
            [(twins[k], *rest) for k, *rest in {a[0]: a for a in asks}.values()],
        )
        if finished >= 0:
            batch.remove(twins[finished].batched.text)
            twins[finished] = Twin(config, prompts[(finished + 1) % 4], batch, finished, tokens)
    assert len(batch) == 4 * lookup_context  # blocks are reused


def test_pools_growing_in_the_batch_are_asked_in_their_new_arrays():
    """Long texts over a large vocabulary: every pool's arrays are replaced several times while
    in the batch (256, then 1,024 keys, ...), through the batch's own learning and the request's."""
    config = make_config()
    compile_batch(config)
    batch = PoolBatch(config)
    rng = np.random.default_rng(0)
    tokens = np.zeros((2, 6000), dtype=np.int32)
    twins = [Twin(config, rng.integers(0, 50, 10).tolist(), batch, row, tokens) for row in range(2)]
    for step in range(40):
        text = rng.integers(0, 3000, 120).tolist()
        learns = [(twin, text[k * 60 : (k + 1) * 60], step % 2 == 0) for k, twin in enumerate(twins)]
        asks = [(twin, True, 12, False, 0.0) for twin in twins]
        _step(batch, twins, tokens, learns, asks)
    capacities = [pool._capacity for pool in twins[0].batched.text.pools()]
    assert min(capacities) >= 1024, capacities


def test_requests_with_their_own_pool_shapes_or_shared_pools_stay_out():
    config = make_config()
    batch = PoolBatch(config)
    other = RequestLookahead(make_config(guess_set_size=3), [1, 2, 3], seed=0)
    assert not batch.add(other.text) and other.text.batch_at is None
    shared = make_config(shared_pool=True)
    from vllm_lookahead.core.pool import SharedPools

    sharing = RequestLookahead(shared, [1, 2, 3], seed=0, shared=SharedPools.for_config(shared))
    assert not PoolBatch(shared).add(sharing.text)
    own = RequestLookahead(config, [1, 2, 3], seed=0)
    assert batch.add(own.text) and batch.add(own.text) and len(batch) == config.lookup_context
