"""The measured on/off gate over the draft rule (core/draft_gate.py): it drafts where drafting
has been measured faster than not drafting at that batch size, pauses drafting where it has been
measured slower, and keeps re-measuring the policy it does not run."""

import random

import pytest

from vllm_lookahead.core.draft_gate import PHASE_STEPS, DraftGate, batch_group


def _run(gate: DraftGate, steps: int, speed, batch: int = 5, noise: float = 0.0, seed: int = 0) -> list[bool]:
    """Drive the gate like the runner does: each step's policy is decided before it runs and
    measured after; ``speed(drafting)`` = (tokens per request, seconds per step)."""
    rng = random.Random(seed)
    policies = []
    for _ in range(steps):
        drafting = gate.allow(batch)
        tokens_per_request, seconds = speed(drafting)
        seconds *= 1.0 + rng.uniform(-noise, noise)
        gate.observe(batch, round(tokens_per_request * batch), seconds, drafting)
        policies.append(drafting)
    return policies


def _engine(gain: float):
    """Drafting returns ``gain`` times the tokens/s of not drafting (1.4 tokens per request in a
    step that costs 1.4 / gain of the bare one)."""
    return lambda drafting: (1.4, 0.020 * 1.4 / gain) if drafting else (1.0, 0.020)


def test_batch_groups_are_powers_of_two():
    assert [batch_group(b) for b in (1, 2, 3, 4, 7, 8, 31, 32, 64)] == [0, 1, 1, 2, 2, 3, 4, 5, 6]
    assert batch_group(0) == 0


@pytest.mark.parametrize("noise", [0.0, 0.15])
def test_drafting_that_pays_runs_almost_always(noise):
    gate = DraftGate()
    policies = _run(gate, 3000, _engine(1.3), noise=noise, seed=1)
    late = policies[600:]
    assert sum(late) / len(late) >= 0.93
    assert not all(late)  # not drafting is still re-measured
    assert gate.ratio(5) == pytest.approx(1.3, rel=0.1)


@pytest.mark.parametrize("noise", [0.0, 0.15])
def test_drafting_measured_slower_is_paused(noise):
    gate = DraftGate()
    policies = _run(gate, 3000, _engine(0.9), noise=noise, seed=2)
    late = policies[600:]
    assert sum(late) / len(late) <= 0.3  # re-measured every few phases while the two are close
    assert any(late)
    assert gate.ratio(5) == pytest.approx(0.9, rel=0.1)


def test_a_clear_loss_is_re_measured_rarely():
    gate = DraftGate()
    late = _run(gate, 4000, _engine(0.5))[800:]
    assert 0 < sum(late) / len(late) <= 0.06


def test_each_batch_size_group_decides_for_itself():
    gate = DraftGate()
    for _ in range(40):  # requests come and go: phases alternate between 10 and 40 in flight
        _run(gate, PHASE_STEPS, _engine(1.4), batch=10)
        _run(gate, PHASE_STEPS, _engine(0.85), batch=40)
    assert gate.ratio(10) > 1.2 and gate.ratio(40) < 0.95
    assert sum(_run(gate, PHASE_STEPS * 10, _engine(1.4), batch=10)) >= PHASE_STEPS * 8
    assert sum(_run(gate, PHASE_STEPS * 10, _engine(0.85), batch=40)) <= PHASE_STEPS * 3
    assert gate.describe() == "8-15: 1.40x, 32-63: 0.85x"


def test_a_new_group_is_measured_both_ways_first():
    gate = DraftGate()
    policies = _run(gate, 6 * PHASE_STEPS, _engine(2.0))
    assert policies[0] and not all(policies[: 3 * PHASE_STEPS])
    assert gate.describe() == "4-7: 2.00x"


def test_gaps_that_are_not_steps_are_ignored():
    gate = DraftGate()
    gate.observe(4, 4, 30.0, False)  # an idle server between two proposals
    gate.observe(4, 0, 0.02, False)  # nothing emitted
    gate.observe(0, 4, 0.02, False)
    assert gate.rates == {} and gate.describe() == "no decode steps yet"


def test_same_timings_same_decisions():
    a = _run(DraftGate(), 1000, _engine(1.02), noise=0.2, seed=5)
    b = _run(DraftGate(), 1000, _engine(1.02), noise=0.2, seed=5)
    assert a == b


def test_a_new_group_starts_with_what_won_nearby():
    slower = DraftGate()
    _run(slower, 20 * PHASE_STEPS, _engine(0.8), batch=10)  # 8-15: drafting measured slower
    slower.phase_left = 0  # the next step starts a phase
    assert slower.allow(20) is False  # 16-31, never seen: measured without drafts first
    faster = DraftGate()
    _run(faster, 20 * PHASE_STEPS, _engine(1.3), batch=10)
    faster.phase_left = 0
    assert faster.allow(20) is True
