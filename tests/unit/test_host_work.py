"""The host-work benchmark (benchmarks/host_work): lookahead's worker path and vLLM's ngram proposer
replayed over served streams, exact against the recording; the command's short run reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("vllm")

from benchmarks.host_work.anchors import AnchorReplay  # noqa: E402
from benchmarks.host_work.lookahead_replay import PHASES, LookaheadReplay, StepTimes  # noqa: E402
from benchmarks.host_work.served import ServedBatch, accepted_chain  # noqa: E402
from benchmarks.host_work.streams import Stream, with_context  # noqa: E402
from benchmarks.projection import H100, step_cost  # noqa: E402


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
        outputs = [[t] for t in served.next_tokens()]
        served.advance(outputs)
        served.replace_finished()
    assert first[0] in served.finished and served.slots[0].stream == _streams()[2]
    assert served.slots[0].prefill and served.num_tokens[0] == len(served.slots[0].stream.prompt)


def test_lookahead_replay_is_exact_drafts_and_times_every_phase():
    replay = LookaheadReplay(_streams(), 4, {}, step_cost(H100), 256)
    times = StepTimes()
    for _ in range(60):  # every emitted token is checked against the recording (AssertionError otherwise)
        replay.step(times)
    assert sum(times.draft_tokens) > 0
    assert sum(times.emitted) > sum(times.decoding)  # drafts were accepted: more than a token per request-step
    assert all(len(times.seconds[p]) == 60 for p in PHASES)
    assert (times.totals() > 0).all()
    assert replay.kv.moves >= 0 and replay.served.finished is not None


def test_ngram_anchor_is_exact_and_drafts_the_loop():
    anchor = AnchorReplay("ngram", _streams(), 4, 256)
    seconds: list[float] = []
    drafted = emitted = 0
    for _ in range(30):
        d, e = anchor.step(seconds)
        drafted, emitted = drafted + d, emitted + e
    assert len(seconds) == 30 and drafted > 0 and emitted > 30 * 4 * 0.5


def test_long_contexts_put_a_distinct_history_before_each_prompt():
    streams = _streams()
    long = with_context(streams, 100)
    assert all(len(s.prompt) == 100 + len(o.prompt) and s.prompt[100:] == o.prompt for s, o in zip(long, streams))
    assert len({s.prompt[:100] for s in long}) > 1


def test_the_command_reports_every_cell(tmp_path):
    """The short run CI makes: the recorded streams (the bundled tokenizer rebuilds their prompts),
    two batch sizes, both context lengths, lookahead beside vLLM's ngram."""
    from benchmarks.host_work.__main__ import main

    out = tmp_path / "hw"
    args = ["--batch-sizes", "1", "8", "--contexts", "0", "2048", "--steps", "10", "--warmup", "5", "--out", str(out)]
    assert main([*args, "--anchors", "ngram"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert [(c["context"], c["batch"]) for c in result["cells"]] == [(0, 1), (0, 8), (2048, 1), (2048, 8)]
    for cell in result["cells"]:
        assert cell["lookahead"]["step_s"]["p50"] > 0 and cell["ngram"]["step_s"]["p50"] > 0
        assert np.isfinite(cell["lookahead"]["request_s"]["p99"])
    table = (out / "results.md").read_text()
    assert table.count("\n| ") == 1 + 4 and "ngram ms/step" in table
    print(table)
