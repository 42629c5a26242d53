"""The host-work benchmark (benchmarks/host_work): requests served over streams; lookahead's worker
path and vLLM's ngram proposer replayed over them, exact against the recording; the command's short
run reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")

from benchmarks.host_work.lookahead_replay import PHASES  # noqa: E402
from benchmarks.host_work.served import ServedBatch, accepted_chain  # noqa: E402
from benchmarks.host_work.streams import Stream, with_context  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _streams() -> list[Stream]:
    loop = [11, 12, 13, 14, 15, 16, 17, 18]
    return [Stream(tuple(loop * 3 + [k]), tuple((loop * 8)[k : k + 40])) for k in range(6)]


def test_accepted_chain_is_the_matching_prefix_and_the_bonus_token():
    text = (1, 2, 3, 4)
    assert accepted_chain([2, 3, 9], text, 1) == [2, 3, 4]
    assert accepted_chain([9], text, 0) == [1]
    assert accepted_chain([4, 5], text, 3) == [4]  # the recording ends


def test_served_batch_replaces_ended_requests_with_the_next_streams():
    served = ServedBatch(_streams(), 2, 256)
    first = served.req_ids
    while served.slots[0].req_id == first[0]:
        served.schedule([[], []])
        outputs = [[t] for t in served.next_tokens()]
        served.advance(outputs)
        served.replace_finished()
    assert first[0] in served.finished and served.slots[0].stream == _streams()[2]
    assert served.slots[0].prefill and served.num_tokens[0] == len(served.slots[0].stream.prompt)


def test_prompts_are_computed_in_chunks_within_the_token_budget():
    """After the first step (every prompt whole), the decoding requests' tokens and drafts come
    first and new prompts share what is left, in chunks; a prompt emits its first token on the
    step of its last chunk."""
    streams = [Stream(tuple(range(100, 130)), tuple(range(5))), Stream(tuple(range(200, 240)), tuple(range(9)))]
    served = ServedBatch(streams, 2, 256, max_num_batched_tokens=16)
    assert list(served.schedule([[], []])) == [30, 40]  # the batch admitted whole before measuring
    served.advance([[0], [0]])
    assert list(served.schedule([[1, 2], []])) == [3, 1]  # 3 decode tokens, then 1 decode token
    served.advance([[1, 2, 3], [1]])
    while not served.replace_finished():  # request 0 (5 tokens) ends; the streams cycle: a 30-token prompt
        served.schedule([[], []])
        served.advance([[served.next_tokens()[0]], [served.next_tokens()[1]]])
    chunks = []
    while served.slots[0].prefill:
        chunks.append(int(served.schedule([[], []])[0]))
        first = served.slots[0].emits
        tokens = [served.next_tokens()[0]] if first else []
        served.advance([tokens, [served.next_tokens()[1]]])
    assert chunks == [15, 15] and served.slots[0].emitted == 1  # 16 less request 1's decode token


def test_learning_alone_catches_every_stream_up_and_times_it():
    from benchmarks.host_work.learning import learning_us_per_token

    figures = learning_us_per_token(_streams(), chunk=7, rounds=2)  # asserts every pool caught up
    assert len(figures) == 2 and all(0 < f < 1e4 for f in figures)


def test_long_contexts_put_a_distinct_history_before_each_prompt():
    streams = _streams()
    long = with_context(streams, 100)
    assert all(len(s.prompt) == 100 + len(o.prompt) and s.prompt[100:] == o.prompt for s, o in zip(long, streams))
    assert len({s.prompt[:100] for s in long}) > 1


# Run in a subprocess: the replays import numba (vLLM's ngram proposer, JIT-compiled) and Triton
# (the kernel's launch plan), and vLLM's CPU platform cannot start an engine in a process where
# numba has compiled (its kernel-override scan of sys.modules trips over llvmlite's objects) -- the
# engine tests run their engines in this process.
REPLAYS = """
import json, sys
from benchmarks.host_work.anchors import AnchorReplay
from benchmarks.host_work.lookahead_replay import PHASES, LookaheadReplay, StepTimes
from benchmarks.host_work.streams import Stream
from benchmarks.projection import H100, step_cost

loop = [11, 12, 13, 14, 15, 16, 17, 18]
streams = [Stream(tuple(loop * 3 + [k]), tuple((loop * 8)[k : k + 40])) for k in range(6)]
replay = LookaheadReplay(streams, 4, {}, step_cost(H100), 256, device_time=True)
built_ahead, start = [], replay.state.builds.start
from benchmarks.host_work.engine_check import forward_stand_in
stand_in, between = forward_stand_in(2 * 16 * 16, 4), []
replay.between = lambda: between.append(stand_in().shape)  # where each step's forward goes
replay.state.builds.start = lambda req_id, build: (built_ahead.append(req_id), start(req_id, build))
times = StepTimes()
for _ in range(60):  # every emitted token is checked against the recording (AssertionError otherwise)
    replay.step(times)
sampled = LookaheadReplay(streams, 4, {"max_tokens_per_step": 0}, step_cost(H100), 256, temperature=0.7)
drawn = StepTimes()
for _ in range(30):  # full trees, sampled from a model peaked at the recording, walks with the sampler's noise
    sampled.step(drawn)
import threading
import vllm_lookahead.engine.runner as runner_module
back, threads, new_state = LookaheadReplay(streams, 4, {}, step_cost(H100), 256), [], runner_module._new_state
def counted(*args):
    threads.append(threading.current_thread().name)
    return new_state(*args)
for _ in range(40):  # back to back: no device time
    back.step(None)
    runner_module._new_state = counted  # from the second step on: the engine drafts, states are built ahead
anchor = AnchorReplay("ngram", streams, 4, 256)
seconds, ngram = [], [0, 0]
for _ in range(30):
    d, e = anchor.step(seconds)
    ngram = [ngram[0] + d, ngram[1] + e]
json.dump({
    "drafted": sum(times.draft_tokens), "emitted": sum(times.emitted), "decoding": sum(times.decoding),
    "phases": {p: len(times.seconds[p]) for p in PHASES}, "positive": bool((times.totals() > 0).all()),
    "collector": [len(times.collector), min(times.collector), bool((times.totals() >= times.collector).all())],
    "built_ahead": len(built_ahead), "stalls": [len(times.stall), min(times.stall)],
    "between": [len(between), list(between[0])],
    "ngram_steps": len(seconds), "ngram_drafted": ngram[0], "ngram_emitted": ngram[1],
    "sampled_drafted": sum(drawn.draft_tokens), "sampled_emitted": sum(drawn.emitted),
    "sampled_decoding": sum(drawn.decoding), "sampled_verify_s": sum(drawn.seconds["verify"]),
    "ahead_builds": [sum(t.startswith("lookahead-states") for t in threads), len(threads)],
}, sys.stdout)
"""


def test_the_replays_are_exact_draft_and_time_every_phase(tmp_path):
    """Lookahead's worker path (greedy, exact against the recording, sleeping through each modelled
    forward; sampled, full trees walked with the sampler's noise) and vLLM's ngram proposer on
    synthetic looping streams (4 in flight, requests replaced as they end); then the command's short
    run over the recording (the bundled tokenizer rebuilds its prompts): two batch sizes, both
    context lengths, greedy and T=0.7, lookahead beside ngram."""
    done = subprocess.run([sys.executable, "-c", REPLAYS], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["drafted"] > 0 and got["emitted"] > got["decoding"]  # drafts accepted: > 1 token per request-step
    assert got["phases"] == {p: 60 for p in PHASES} and got["positive"]
    assert got["collector"][0] == 60 and got["collector"][1] >= 0 and got["collector"][2]  # GC: within the phases
    # requests admitted while the engine drafts: their states were built while their prompts ran
    assert got["built_ahead"] > 0 and got["stalls"][0] == 60 and got["stalls"][1] >= 0
    assert got["between"] == [60, [4, 16]]  # the engine check's stand-in, once per step
    assert got["ngram_steps"] == 30 and got["ngram_drafted"] > 0 and got["ngram_emitted"] > 30 * 4 * 0.5
    # sampled: trees walked with the sampler's noise, some of their tokens accepted
    assert got["sampled_drafted"] > 0 and got["sampled_emitted"] > got["sampled_decoding"] > 0
    assert got["sampled_verify_s"] > 0
    # back to back (no device time), new requests' states are built where the forward goes, on the worker thread
    assert got["ahead_builds"][1] > 0 and got["ahead_builds"][0] == got["ahead_builds"][1]

    out = tmp_path / "hw"
    args = ["--batch-sizes", "1", "8", "--contexts", "0", "2048", "--steps", "10", "--warmup", "5", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.host_work", *args, "--anchors", "ngram"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    cells = [(c["context"], c["batch"], c["temperature"]) for c in result["cells"]]
    assert cells == [(ctx, b, t) for ctx in (0, 2048) for b in (1, 8) for t in (0.0, 0.7)]
    for cell in result["cells"]:
        assert cell["lookahead"]["step_s"]["p50"] > 0 and np.isfinite(cell["lookahead"]["request_s"]["p99"])
        assert 0 <= cell["lookahead"]["collector_s"]["mean"] <= cell["lookahead"]["step_s"]["mean"]
        assert ("ngram" in cell) == (cell["temperature"] == 0)  # vLLM's proposer: greedy only
        assert "ngram" not in cell or cell["ngram"]["step_s"]["p50"] > 0
    table = (out / "results.md").read_text()
    assert table.count("\n| ") == 1 + 8 and "ngram ms/step" in table and "of which GC" in table
    assert result["allocator"] and result["allocator"] in table  # run as the engines are (engine_env)
    print(table)


def test_ab_compares_two_versions_step_for_step_and_refuses_runs_that_decided_differently():
    """``python -m benchmarks.host_work.ab`` with the checkout against itself: the fixed prices make
    every run decide alike, so the steps compare; runs whose decisions differ are refused."""
    from benchmarks.host_work.ab import compare

    args = ["--base", str(ROOT), "--batch", "2", "--steps", "6", "--warmup", "4", "--rounds", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.host_work.ab", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == 6 and result["median_step_ratio"] > 0
    assert all(result[v]["step_ms"]["p50"] > 0 and len(result[v]["run_p50_ms"]) == 1 for v in ("base", "head"))

    run = {"seconds": {"propose": [1e-3, 2e-3]}, "draft_tokens": [3, 0], "emitted": [2, 1]}
    assert compare({"base": [run], "head": [dict(run, seconds={"propose": [5e-4, 2e-3]})]})["median_step_ratio"] == 0.75
    with pytest.raises(SystemExit, match="decisions differ"):
        compare({"base": [run], "head": [dict(run, draft_tokens=[2, 0])]})
    # a change that moves the drafts: each version's runs agree among themselves, p50 and mean compare
    other = dict(run, draft_tokens=[2, 0], seconds={"propose": [1e-3, 3e-3]})
    moved = compare({"base": [run, run], "head": [other, other]}, same_decisions=False)
    assert moved["p50_ratio"] == 2.0 / 1.5 and moved["head"]["draft_tokens_per_step"] == 1.0
    with pytest.raises(SystemExit, match="its other runs'"):
        compare({"base": [run], "head": [other, run]}, same_decisions=False)


def test_engine_check_compares_full_batch_steps_and_can_disagree():
    from benchmarks.host_work.engine_check import compare

    def steps(propose_ms: list[float], decoding: int = 10) -> list[dict[str, float]]:
        return [
            {"decoding": decoding, "trees": 1.0, "propose": ms / 1e3, "tree batch": ms / 1e4, "verify": 0.0}
            for ms in propose_ms
        ]

    replay = [steps([1.0, 1.1, 1.2, 1.3, 1.4] * 4), steps([1.0, 1.2, 1.4] * 4)]
    # the engine's filling and draining steps (fewer than 90 % of 10 decoding) are left out
    engine = steps([1.2, 1.25, 1.15]) + steps([9.0, 9.0, 9.0, 9.0], decoding=5)
    result = compare(engine, replay, in_flight=10)
    assert result["engine_steps"] == 3 and result["replay_steps"] == [20, 12]
    propose = result["phases"]["propose"]
    assert propose["agrees"] and propose["engine_ms"]["p50"] == pytest.approx(1.2)
    assert propose["replay_round_p50_ms"] == [pytest.approx(1.2), pytest.approx(1.2)]
    assert "agrees" not in result["phases"]["verify"]  # not the same work in the two
    # the tree batch is read over the steps that carried trees only
    treeless = [{**s, "trees": 0.0, "tree batch": 0.0} for s in steps([5.0] * 20)]
    mixed = compare(engine + treeless, replay, in_flight=10)
    assert mixed["engine_steps"] == 23 and mixed["engine_steps_with_trees"] == 3
    assert mixed["phases"]["tree batch"]["agrees"] and mixed["phases"]["propose"]["agrees"] is False
    slow = compare(steps([2.0, 2.1, 2.2]), replay, in_flight=10)
    assert slow["phases"]["propose"]["agrees"] is False
