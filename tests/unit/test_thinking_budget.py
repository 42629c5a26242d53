"""The thinking-budget draft limit: no draft row it allows is a row where vLLM's own
``ThinkingBudgetStateHolder`` forces a token, checked by replaying decodes through the holder."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.sample.logits_processor.interface import BatchUpdate  # noqa: E402
from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder  # noqa: E402

from support.thinking import forced_tokens, random_decode  # noqa: E402
from vllm_lookahead.engine.propose.thinking_budget import ThinkingLimit  # noqa: E402

VOCAB = 10
MARKERS = [([5], [7]), ([5, 6], [7, 6]), ([5, 6], [8]), ([5], [7, 8, 9])]


@pytest.mark.parametrize("markers", MARKERS)
def test_no_allowed_draft_row_is_one_vllm_forces(markers):
    """After every step of replayed decodes, the rows a draft may reach (depth 1..room, stopping
    before a marker token) are never rows where the holder forced a token -- so verifying them with
    the unforced distribution samples what vLLM samples there."""
    start, end = markers
    rng = random.Random(0)
    checked = limited = forcing = 0
    for _ in range(200):
        budget = rng.randint(0, 12)
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.5:
            prompt += list(start) + [1] * rng.randint(0, 4)  # the prompt opens a section
        output, forced, states = random_decode(start, end, budget, prompt, 40, VOCAB, rng)
        forcing += bool(forced)
        assert forced_tokens(start, end, budget, prompt, output) == forced  # the replay helper agrees
        for n in range(1, len(output)):  # proposing after output[:n]; this step produced output[n - 1]
            holder = SimpleNamespace(think_start_token_ids=start, think_end_token_ids=end, _state=states[n - 1])
            limit = ThinkingLimit(holder)
            room = limit.room(0, n, len(prompt), output[n - 1 : n])
            # A draft guessing the tokens that follow, cut before a marker and at the room.
            depth = min(limit.cut(output[n:]), len(output) - n if room is None else room)
            for d in range(1, depth + 1):  # the row at depth d samples output[n + d]
                checked += 1
                assert n + d not in forced, (prompt, budget, output, sorted(forced), n, d, room)
            limited += room is not None and room > 0
    assert checked > 1000 and limited > 100 and forcing > 50


def test_room_reads_the_holders_count_and_cut_stops_before_markers():
    start, end = [5, 6], [7]
    reasoning = SimpleNamespace(reasoning_start_token_ids=start, reasoning_end_token_ids=end)
    holder = ThinkingBudgetStateHolder(reasoning, 2, 0, torch.device("cpu"), False)
    # Request 0: the prompt opened a section 2 tokens ago; request 1 has no budget.
    holder.sync_batch(
        BatchUpdate(
            batch_size=2,
            removed=[],
            added=[
                (0, SimpleNamespace(thinking_token_budget=10), [1, 5, 6, 1, 1], []),
                (1, SimpleNamespace(thinking_token_budget=None), [1], []),
            ],
            moved=[],
        )
    )
    limit = ThinkingLimit(holder)
    # The holder counts 1 of the prompt's 2 thinking tokens (with a 2-token start marker it starts
    # one token late) + 1 new: the row at depth d samples its thinking token 3 + d, which must stay
    # <= 10 with one token of margin: d <= 6.
    assert limit.room(0, 1, 5, [3]) == 6
    assert limit.room(0, 1, 5, [6]) == 0  # a marker token the holder has not read yet
    assert limit.room(1, 1, 1, [3]) is None
    assert limit.cut([1, 2, 6, 3]) == 2 and limit.cut([7]) == 0 and limit.cut([1, 2]) == 2


def test_no_limit_without_a_holder_or_an_end_marker():
    runner = SimpleNamespace(input_batch=SimpleNamespace(thinking_budget_state_holder=None))
    assert ThinkingLimit.of(runner) is None
    reasoning = SimpleNamespace(reasoning_start_token_ids=[5], reasoning_end_token_ids=[])
    runner.input_batch.thinking_budget_state_holder = ThinkingBudgetStateHolder(
        reasoning, 1, 0, torch.device("cpu"), False
    )
    assert ThinkingLimit.of(runner) is None
