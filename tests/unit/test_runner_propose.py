"""The proposal step of the runner's lookahead state (engine/runner.py: RunnerLookahead.propose),
reached through the ``custom_class`` proposer as vLLM calls it, with a stand-in runner."""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm_lookahead.engine.hooks.proposer import LookaheadProposer  # noqa: E402
from vllm_lookahead.engine.runner import RunnerLookahead  # noqa: E402


def _proposer(device: str, **keys) -> LookaheadProposer:
    """The proposer vLLM would build, attached to a RunnerLookahead over a stand-in runner."""
    model = SimpleNamespace(max_model_len=4096, uses_mrope=False)
    vllm_config = SimpleNamespace(
        additional_config={"lookahead": keys}, model_config=model, device_config=SimpleNamespace(device_type=device)
    )
    proposer = LookaheadProposer(vllm_config)
    runner = SimpleNamespace(
        vllm_config=vllm_config,
        model_config=model,
        drafter=proposer,
        input_batch=SimpleNamespace(req_ids=[]),
        requests={},
    )
    RunnerLookahead.of(runner)
    return proposer


def test_loading_the_proposer_says_there_is_no_draft_model(caplog):
    """vLLM's runner logs "Loading drafter model..." for any proposer; ours answers it in the next line."""
    import logging

    with caplog.at_level(logging.INFO, logger="vllm.lookahead"):
        _proposer("cpu").load_model(object())
    assert [r.getMessage() for r in caplog.records if "drafter" in r.getMessage()] == [
        'lookahead: no drafter model to load (vLLM\'s "Loading drafter model..." is its call into this proposer): '
        "drafts come from n-gram pools of the prompt and output and from the Jacobi window, all run by the target model"
    ]


def _bind(p: LookaheadProposer, prompts: dict[str, list[int]]):
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=1000)
    runner = p.owner.runner
    runner.input_batch.req_ids = list(prompts)
    runner.requests = {
        r: SimpleNamespace(prompt_token_ids=t, sampling_params=sp, output_token_ids=[]) for r, t in prompts.items()
    }


def _step(p: LookaheadProposer, histories: list[list[int]]) -> list[list[int]]:
    import numpy as np

    width = max(len(h) for h in histories)
    ids = np.zeros((len(histories), width), dtype=np.int64)
    for i, h in enumerate(histories):
        ids[i, : len(h)] = h
    return p.propose([[h[-1]] for h in histories], np.array([len(h) for h in histories]), ids)


def test_under_the_rule_a_batch_too_full_to_draft_skips_learning():
    from vllm_lookahead.core.step_cost import StepCost

    p = _proposer("cpu", guess_set_size=2, ngram_size=3)
    p.owner.timing.cost = StepCost((1, 256), (0.010, 5.0))  # each token costs twice the batch: no draft pays
    prompts = {"a": [1, 2, 7, 8, 9], "b": [3, 4, 7, 8, 9]}
    _bind(p, prompts)
    assert _step(p, [prompts["a"] + [7], prompts["b"] + [7]]) == [[], []]
    assert len(p.owner.live) == 0
    # each request's reason goes to the scheduler once, not every step it stays the same
    assert p.owner.take_report()["undrafted"] == {"a": "batch_full", "b": "batch_full"}
    assert _step(p, [prompts["a"] + [7, 8], prompts["b"] + [7, 8]]) == [[], []]
    assert p.owner.take_report()["undrafted"] == {}
    p.owner.forget(["b"])  # a request of the same id later is reported again
    _step(p, [prompts["a"] + [7, 8, 9], prompts["b"] + [7]])
    assert p.owner.take_report()["undrafted"] == {"b": "batch_full"}
    p.owner.timing.cost = StepCost.linear(0.020, 0.0)  # free tokens: both draft (lead first, then more)
    drafts = _step(p, [prompts["a"] + [7], prompts["b"] + [7]])
    assert all(d[:2] == [8, 9] for d in drafts)


def test_a_batch_too_full_to_draft_skips_learning_and_catches_up_later():
    p = _proposer("cpu", max_tokens_per_step=3, guess_set_size=2, ngram_size=3)
    prompts = {"a": [1, 2], "b": [3, 4]}
    _bind(p, prompts)
    a, b = [1, 2], [3, 4]
    for token in (7, 8, 9, 7, 8):  # two requests decoding: share (3 - 2) // 2 = 0 drafts each
        a, b = a + [token], b + [token]
        assert _step(p, [a, b]) == [[], []]
    assert len(p.owner.live) == 0  # no per-request work while nothing can be drafted
    _bind(p, {"a": prompts["a"]})  # "b" finished: "a" alone may draft (3 - 1) // 1 = 2 nodes
    a = a + [9]
    assert _step(p, [a]) == [[7, 8]]  # learnt "9 7 8" from the tokens it had skipped
    assert p.owner.live.state("a").text.known == len(a)


def test_auto_with_cpu_costs_drafts_one_confident_chain_and_no_tree():
    # The request repeats "1 2 3 4 5 6 7 8 9 0", so every candidate is right.  Under this CPU's
    # forward cost (the bundled profile: the stand-in runner has no model to time) the rule
    # drafts the lead candidate alone -- a chain, which vLLM's causal kernel verifies -- as long
    # as its evidence (found after 3 tokens of context, seen 3 times) makes its tokens pay, and
    # longer once the request has shown that it copies; a second candidate or the window would
    # add ~0.05 tokens for rows that cost more than that here.
    import numpy as np

    from vllm_lookahead.engine.step.verification import StepOutcome

    p = _proposer("cpu", ngram_size=3, guess_set_size=3, window_size=2)
    cycle = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]
    prompt = cycle * 3
    _bind(p, {"a": prompt})
    history = prompt + [1]
    new = [1]
    lengths = []
    for _ in range(4):
        (draft,) = p.propose([new], np.array([len(history)]), np.array([history]))
        pending = p.owner.live.draft("a")
        # no window node either (a window at its first level may run column 0, which is the root)
        assert pending.num_candidates == 1 and pending.tree.size == 1 + pending.lead_tokens
        assert len(draft) == pending.tree.size - 1 == pending.lead_tokens
        assert pending.tree.parents[1:].tolist() == list(range(len(draft)))  # a chain below the root
        lengths.append(len(draft))
        nxt = cycle.index(history[-1]) + 1
        new = [cycle[(nxt + k) % 10] for k in range(len(draft) + 1)]
        assert new[:-1] == draft  # all accepted, plus the bonus token
        p.owner.live.set_outcome(
            "a", StepOutcome(pending, pending.tree.size, np.full(pending.tree.size, -1), np.arange(1, len(draft) + 1))
        )  # the whole chain
        history = history + new
    # a confident lead from the start, then the whole lead (max_lead_tokens = 32) once it was right
    assert 8 <= lengths[0] < 32 and lengths[1:] == [32, 32, 32]


def test_initial_window_depends_on_the_prompt_not_on_the_request_id():
    # vLLM appends a random suffix to request ids, so a window seeded by the id would differ
    # from run to run (and MAT with it); seeded by the prompt it is the same in every run.
    prompt, other = list(range(10, 40)), list(range(40, 70))

    def first_level(req_id: str, tokens: list[int], seed: int = 0):
        p = _proposer("cpu", max_tokens_per_step=0, ablation={"seed": seed})
        _bind(p, {req_id: tokens})
        _step(p, [tokens + [tokens[0]]])
        return p.owner.live.state(req_id).window.levels[0].tolist()

    same = first_level("0-1a2b3c4d", prompt)
    assert first_level("7-ffffeeee", prompt) == same
    assert first_level("0-1a2b3c4d", other) != same
    assert first_level("0-1a2b3c4d", prompt, seed=1) != same


def test_thinking_budget_limits_the_draft_depth_and_stops_before_markers():
    """Budgeted requests (vLLM's holder: start marker 9, end marker 8) are drafted no deeper than
    the holder's count allows and never through a marker token; the others are not limited."""
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder

    p = _proposer("cpu", ngram_size=8, max_tokens_per_step=0)  # lead candidates of 7 tokens, no step cap
    runner = p.owner.runner
    reasoning = SimpleNamespace(reasoning_start_token_ids=[9], reasoning_end_token_ids=[8])
    holder = ThinkingBudgetStateHolder(reasoning, 4, 0, torch.device("cpu"), False)
    runner.input_batch.thinking_budget_state_holder = holder
    thinking = [9, *[1, 2, 3, 4] * 3]  # the prompt opens a section: 12 thinking tokens
    plain = [1, 2, 3, 8] * 3  # no section; the end marker inside the repeated text
    prompts = {"think16": thinking, "think20": thinking, "plain": plain, "free": thinking}
    budgets = {"think16": 16, "think20": 20, "plain": 100, "free": None}
    runner.input_batch.req_ids = list(prompts)
    runner.requests = {
        r: SimpleNamespace(
            prompt_token_ids=t,
            output_token_ids=[1],
            sampling_params=SamplingParams(temperature=0.0, max_tokens=100, thinking_token_budget=budgets[r]),
        )
        for r, t in prompts.items()
    }
    holder.sync_batch(
        BatchUpdate(
            batch_size=4,
            removed=[],
            moved=[],
            added=[(i, runner.requests[r].sampling_params, t, []) for i, (r, t) in enumerate(prompts.items())],
        )
    )
    holder.update_state([[], [], [], []], None)  # the step that sampled token 1 read the output before it
    drafts = _step(p, [t + [1] for t in prompts.values()])
    # 12 + 1 thinking tokens: rows at depth d sample token 14 + d, kept <= budget - 1.
    assert drafts[0] == [2]
    assert drafts[1] == [2, 3, 4, 1, 2]
    assert drafts[2] == [2, 3]  # stops before the end marker
    assert drafts[3][:5] == drafts[1] and len(drafts[3]) > 5  # no budget: not limited


def test_full_trees_draft_whatever_the_cost_model_says():
    """``max_tokens_per_step: 0`` is the full tree every step: the draft rule's cost model is not
    consulted, even where it says no draft pays."""
    from vllm_lookahead.core.step_cost import StepCost

    p = _proposer("cpu", guess_set_size=2, ngram_size=3, max_tokens_per_step=0)
    p.owner.timing.cost = StepCost((1, 256), (0.010, 5.0))  # each token costs twice the batch
    assert not p.owner.timing.any_draft_pays(2)
    prompts = {"a": [1, 2, 7, 8, 9], "b": [3, 4, 7, 8, 9]}
    _bind(p, prompts)
    drafts = _step(p, [prompts["a"] + [7], prompts["b"] + [7]])
    assert all(d[:2] == [8, 9] for d in drafts)


def _proposals(p: LookaheadProposer, tokens: list[int], history: list[int]) -> tuple[list[bool], list[int]]:
    """Step request "a" through ``tokens``: per step whether it proposed (its pools looked at the
    step's token), and the history at the end."""
    proposed = []
    for token in tokens:
        history = history + [token]
        _step(p, [history])
        proposed.append(p.owner.live.state("a").text.known == len(history))
    return proposed, history


def test_a_request_offered_nothing_two_proposals_running_rests_and_catches_up():
    """Under the draft rule, where proposing is a large share of the step, a request whose
    proposals drafted nothing twice running skips 8, then 16, 32 ... proposals (no lookups, no
    learning; a sixteenth of its longest rest first), proposes again in between, and learns the
    skipped tokens when it does; a draft ends the rests."""
    from vllm_lookahead.core.step_cost import StepCost

    p = _proposer("cpu", guess_set_size=2, ngram_size=3, window_size=0)
    timing = p.owner.timing
    timing.cost = StepCost.linear(0.0001, 0.0)  # a 0.1 ms forward: proposing costs more than 2 % of it
    measured = timing.proposed_for  # proposing priced at 1 ms a request, however fast this machine is
    timing.proposed_for = lambda seconds, requests: measured(1e-3 * requests, requests)
    _bind(p, {"a": [1, 2, 3]})
    proposed, history = _proposals(p, list(range(100, 116)), [1, 2, 3])  # new text: nothing to draft
    # its longest rest is 128 proposals, so its first is already 8, then 16 ...
    assert proposed == [True, True] + [False] * 8 + [True] + [False] * 5
    assert p.owner.take_report()["undrafted"]["a"] == "no_candidate"  # a rest keeps the request's reason
    for _ in range(20):  # the rest (16 proposals by now) runs out; the next proposal learns every skipped token
        proposed, history = _proposals(p, [100], history)
        if proposed[-1]:
            break
    assert p.owner.live.state("a").text.known == len(history)
    history = history + [101]
    assert _step(p, [history])[0][:2] == [102, 103]  # "100 101" was seen: it drafts, and is idle no more
    assert p.owner.live._records["a"].idle == 0


@pytest.mark.parametrize("setting", ["fixed_cap", "tensor_parallel", "cheap_proposals"])
def test_requests_do_not_rest_under_a_cap_under_tensor_parallelism_or_where_proposing_is_cheap(setting):
    from vllm_lookahead.core.step_cost import StepCost

    cap = {"max_tokens_per_step": 64} if setting == "fixed_cap" else {}
    p = _proposer("cpu", guess_set_size=2, ngram_size=3, window_size=0, **cap)
    p.owner.timing.cost = StepCost.linear(1.0 if setting == "cheap_proposals" else 0.0001, 0.0)
    p.owner.timing.frozen = setting == "tensor_parallel"
    _bind(p, {"a": [1, 2, 3]})
    proposed, _ = _proposals(p, list(range(100, 110)), [1, 2, 3])
    assert all(proposed)
