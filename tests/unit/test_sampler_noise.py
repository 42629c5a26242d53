"""The noise verification draws for a random request's tree nodes is the noise vLLM's sampler
would draw for those positions: token for token against vLLM's own ``TopKTopPSampler`` over a
run of positions, with per-request generators (seeded) of the same seed on both sides."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler, apply_top_k_top_p  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402

from vllm_lookahead.engine.step.sampler_noise import SamplerNoise  # noqa: E402

VOCAB, POSITIONS = 97, 40
TEMPERATURE = torch.tensor([[0.7], [1.0], [0.5]])
TOP_K = torch.tensor([VOCAB, 7, VOCAB])
TOP_P = torch.tensor([0.9, 1.0, 1.0])


def sampled_both_ways(forward, noise: SamplerNoise, seeded=(0, 2)) -> tuple[list[list[int]], list[list[int]]]:
    """(vLLM's tokens, ours) for the seeded rows of a 3-request batch over POSITIONS positions."""
    torch.manual_seed(0)
    runs = [torch.randn(3, VOCAB) * 3 for _ in range(POSITIONS)]
    theirs_gen = {i: torch.Generator().manual_seed(100 + i) for i in seeded}
    ours_gen = {i: torch.Generator().manual_seed(100 + i) for i in seeded}
    theirs, ours = [], []
    for logits in runs:
        tokens, _ = forward(logits.clone() / TEMPERATURE, theirs_gen, TOP_K.clone(), TOP_P.clone())
        theirs.append([int(tokens[i]) for i in seeded])
        row = [
            apply_top_k_top_p(logits[i : i + 1] / TEMPERATURE[i], TOP_K[i : i + 1].clone(), TOP_P[i : i + 1].clone())
            for i in seeded
        ]
        ours.append([noise.sample(r, ours_gen[i]) for r, i in zip(row, seeded)])
    return theirs, ours


@pytest.mark.parametrize("fp64", [False, True])
def test_cpu_sampler(fp64):
    sampler = Sampler(use_fp64_gumbel=fp64)
    noise = SamplerNoise.of(sampler)
    assert noise == SamplerNoise("exponential", True) if fp64 else noise == SamplerNoise("splitmix")
    theirs, ours = sampled_both_ways(sampler.topk_topp_sampler.forward, noise)
    assert theirs == ours
    assert len({tuple(t) for t in theirs}) > POSITIONS // 2  # really sampled, not a constant


@pytest.mark.parametrize("fp64", [False, True])
def test_native_sampler(fp64):
    """``random_sample`` (vLLM's CUDA path whenever a request has its own generator)."""
    inner = TopKTopPSampler(use_fp64_gumbel=fp64)
    noise = SamplerNoise.of(
        SimpleNamespace(topk_topp_sampler=SimpleNamespace(forward=inner.forward_native, use_fp64_gumbel=fp64))
    )
    assert noise == SamplerNoise("exponential", fp64)
    theirs, ours = sampled_both_ways(inner.forward_native, noise)
    assert theirs == ours


def test_unknown_samplers_have_no_noise_to_mirror():
    other = SimpleNamespace(topk_topp_sampler=SimpleNamespace(forward=lambda *a: None, use_fp64_gumbel=False))
    assert SamplerNoise.of(other) is None
    assert SamplerNoise.of(SimpleNamespace()) is None


@pytest.mark.parametrize(
    "noise", [SamplerNoise("splitmix"), SamplerNoise("exponential"), SamplerNoise("exponential", True)]
)
def test_rows_sampled_in_one_pass_equal_rows_sampled_one_at_a_time(noise):
    """What verification draws for several requests' walks in one pass (one generator per row,
    one unseeded) is what each row's own call draws, and every generator ends where it would."""
    torch.manual_seed(1)
    positions = [torch.randn(4, VOCAB) * 3 for _ in range(12)]
    seeds = [5, None, 6, 7]
    one = [torch.Generator().manual_seed(s) if s is not None else None for s in seeds]
    many = [torch.Generator().manual_seed(s) if s is not None else None for s in seeds]
    alone, together = [], []
    for logits in positions:
        alone.append([noise.sample(logits[i : i + 1], one[i]) for i in range(4)])
        together.append(noise.sample_rows(logits, many))
    seeded = [i for i, s in enumerate(seeds) if s is not None]
    assert [[row[i] for i in seeded] for row in alone] == [[row[i] for i in seeded] for row in together]
    assert all(torch.equal(one[i].get_state(), many[i].get_state()) for i in seeded)
    assert len({tuple(row) for row in together}) > 6  # really sampled


def test_rows_of_several_requests_get_each_requests_own_settings():
    """``target_dist.sampling_logits`` over rows of several requests in one pass (each row its
    request's temperature, top-k and top-p) equals each request's rows taken alone, and their
    tokens under one noise pass are vLLM's own sampler's for the same batch."""
    from vllm_lookahead.engine.step import target_dist

    torch.manual_seed(2)
    sm = SimpleNamespace(temperature=TEMPERATURE[:, 0].clone(), top_k=TOP_K.clone(), top_p=TOP_P.clone())
    logits = torch.randn(7, VOCAB) * 3
    owners = [2, 0, 1, 1, 0, 2, 1]
    together = target_dist.sampling_logits(logits, sm, owners)
    alone = torch.cat([target_dist.sampling_logits(logits[j : j + 1], sm, owners[j]) for j in range(7)])
    assert torch.equal(together, alone)
    assert torch.isinf(together).any(axis=1).tolist() == [o != 2 for o in owners]  # top-k / top-p applied per row

    inner = TopKTopPSampler()
    noise = SamplerNoise.of(SimpleNamespace(topk_topp_sampler=SimpleNamespace(forward=inner.forward_native)))
    rows = logits[:3]
    gens = {i: torch.Generator().manual_seed(40 + i) for i in range(3)}
    theirs, _ = inner.forward_native(rows.clone() / TEMPERATURE, gens, TOP_K.clone(), TOP_P.clone())
    mine = [torch.Generator().manual_seed(40 + i) for i in range(3)]
    assert noise.sample_rows(target_dist.sampling_logits(rows, sm, [0, 1, 2]), mine) == theirs.tolist()


def test_rows_without_a_generator_are_drawn_from_their_distribution():
    """Unseeded rows (:func:`inverse_cdf`): each row's tokens follow its own softmax, chi-square
    against the exact probabilities, top-k / top-p masked tokens never drawn, a row with one token
    left always that token; the test itself rejects a row's draws checked against another row."""
    from collections import Counter

    from support.stats import compare_to_exact
    from vllm_lookahead.engine.step import target_dist
    from vllm_lookahead.engine.step.sampler_noise import inverse_cdf

    torch.manual_seed(3)
    sm = SimpleNamespace(temperature=TEMPERATURE[:, 0].clone(), top_k=TOP_K.clone(), top_p=TOP_P.clone())
    logits = target_dist.sampling_logits(torch.randn(3, VOCAB) * 2, sm, [0, 1, 2])
    probs = logits.softmax(dim=-1).double().numpy()
    draws = torch.stack([inverse_cdf(logits) for _ in range(4000)]).numpy()  # (4000, 3)
    counts = {f"row {r}": Counter(draws[:, r].tolist()) for r in range(3)}
    exact = {f"row {r}": {t: float(p) for t, p in enumerate(probs[r]) if p > 0} for r in range(3)}
    result = compare_to_exact(counts, exact)
    assert result.passed, result.summary()
    assert all(probs[r, t] > 0 for r in range(3) for t in draws[:, r])  # masked tokens never drawn
    swapped = {"row 0": exact["row 1"], "row 1": exact["row 0"], "row 2": exact["row 2"]}
    assert not compare_to_exact(counts, swapped).passed

    one_left = torch.full((2, VOCAB), float("-inf"))
    one_left[0, 5], one_left[1, VOCAB - 1] = 0.0, 3.0
    assert inverse_cdf(one_left).tolist() == [5, VOCAB - 1]


@pytest.mark.parametrize("vocab", [97, 256, 300, 7854])
def test_the_two_level_draw_is_the_flat_draw(vocab):
    """:func:`inverse_cdf`'s draw on CPU tensors (running sums by block, then within the block)
    picks the entry of the running sum over the whole row for the same uniforms, masked entries
    never, the first and last entries with mass at the ends of the uniform's range -- a vocabulary
    shorter than a block, a multiple of it and one with a partial last block."""
    from vllm_lookahead.engine.step.sampler_noise import _blocked_draw, _flat_draw

    torch.manual_seed(vocab)
    logits = torch.randn(24, vocab) * 4
    logits[logits < -2] = float("-inf")
    logits[0, :-1], logits[0, -1] = float("-inf"), 1.0  # one token left: the last
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    for _ in range(40):
        u = torch.rand(24, 1, dtype=torch.float64)
        drawn = _blocked_draw(probs, u)
        assert torch.equal(drawn, _flat_draw(probs, u))
        assert bool((probs.gather(1, drawn[:, None]) > 0).all())
    ends = torch.tensor([[0.0], [1 - 2**-53]], dtype=torch.float64).repeat(12, 1)
    with_mass = [np.flatnonzero(row > 0).tolist() for row in probs.numpy()]
    assert _blocked_draw(probs, ends).tolist() == [row[0] if i % 2 == 0 else row[-1] for i, row in enumerate(with_mass)]


@pytest.mark.parametrize("noise", [SamplerNoise("splitmix"), SamplerNoise("exponential")])
def test_a_pass_of_seeded_and_unseeded_rows_puts_each_token_in_its_row(noise):
    """Rows with and without generators in one pass: every row's token where it belongs (rows
    with a single token left must give it), the seeded rows' tokens those of their own calls."""
    torch.manual_seed(4)
    logits = torch.randn(5, VOCAB) * 3
    forced = {1: 11, 3: 42}  # unseeded rows with one token left
    for row, token in forced.items():
        logits[row] = float("-inf")
        logits[row, token] = 1.0
    seeds = [8, None, 9, None, 10]
    together = noise.sample_rows(logits, [torch.Generator().manual_seed(s) if s else None for s in seeds])
    alone = [noise.sample(logits[i : i + 1], torch.Generator().manual_seed(s)) for i, s in enumerate(seeds) if s]
    assert [together[i] for i, s in enumerate(seeds) if s] == alone
    assert [together[row] for row in forced] == list(forced.values())


def test_walks_gather_a_position_s_rows_from_the_kept_rows_as_stacking_them_does():
    """Where every walking request's rows are a block of the step's kept rows, a position's rows
    are one gather from them: the same paths and tokens, and the same draws from each seeded
    request's generator, as stacking each request's rows."""
    from vllm_lookahead.core import TreeBuilder
    from vllm_lookahead.engine.step.verification import KeptRows, _Verifying, _walk_together

    torch.manual_seed(3)
    trees, rows, blocks, at = [], [], {}, 0
    for i in range(3):
        tokens = torch.randint(0, VOCAB, (6,)).tolist()
        b = TreeBuilder(tokens[0])
        b.add_chain(0, tokens[1:], True, merge=True)
        b.add_chain(0, [tokens[1], (tokens[2] + 1) % VOCAB, tokens[3]], True, merge=True)
        tree = b.build()
        mine = torch.randn(tree.size, VOCAB)
        mine[torch.arange(tree.size - 1), torch.tensor(tree.tokens[1:].tolist())] += 6.0  # drafts mostly accepted
        trees.append(tree)
        rows.append(mine)
        blocks[f"r{i}"] = (at, tree.size)
        at += tree.size
    kept = KeptRows(torch.cat(rows), blocks)

    def walk(gathered: bool) -> tuple[list, list]:
        torch.manual_seed(7)  # request 1 has no seed: the global stream
        generators = {0: torch.Generator().manual_seed(11), 2: torch.Generator().manual_seed(12)}
        sm = SimpleNamespace(
            temperature=TEMPERATURE.view(-1), top_k=TOP_K, top_p=TOP_P, generators=generators, max_num_logprobs=None
        )
        items = [
            _Verifying(
                tr=SimpleNamespace(tree=tree, logit_nodes=tree.logit_rows(), batch_index=i, req_id=f"r{i}"),
                kept=kept,
                argmax=rows[i].argmax(dim=-1).numpy(),  # every node has logits
                greedy=False,
                processed_rows=None if gathered else kept.of(f"r{i}", float32=True),
                root_token=int(tree.tokens[1]),
                first_row=blocks[f"r{i}"][0] if gathered else None,
            )
            for i, tree in enumerate(trees)
        ]
        _walk_together(SamplerNoise("exponential"), sm, items, kept)
        return [(item.path.tolist(), item.last) for item in items], [g.get_state() for g in generators.values()]

    (paths, states), (stacked_paths, stacked_states) = walk(True), walk(False)
    assert paths == stacked_paths and sum(len(p) for p, _ in paths) >= 3
    assert all(torch.equal(a, b) for a, b in zip(states, stacked_states))
