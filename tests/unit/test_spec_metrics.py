"""The scheduler-side rebuild of vLLM's spec-decode stats (engine/metrics/spec_metrics.py) and the stat
logger that exports lookahead's own (engine/metrics/prometheus.py), on vLLM's real stats classes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_lookahead.core import DraftTree
from vllm_lookahead.core.request import StepDraft
from vllm_lookahead.core.source import Source
from vllm_lookahead.engine.hooks.patches import FIELDS, INSTALLED
from vllm_lookahead.engine.metrics import spec_metrics
from vllm_lookahead.engine.metrics.stats import StepReport
from vllm_lookahead.engine.step.verification import StepOutcome

P, O, W = int(Source.PROMPT), int(Source.OUTPUT), int(Source.WINDOW)


def _request_metrics(nodes: int, vllm_accepted: int, level: str):
    """A per-request record after vLLM observed (nodes, tokens sampled - 1), as vLLM does."""
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    m = RequestSpecDecodeMetrics.new(8)
    m.observe(num_draft_tokens=nodes, num_accepted=vllm_accepted, detailed=level == "detailed")
    return m


def _step(level: str = "detailed"):
    """Two drafted requests and one that finishes undrafted, as vLLM's scheduler leaves them."""
    from vllm.v1.metrics.stats import SchedulerStats

    INSTALLED.apply(FIELDS)  # as the plugin does in every process (idempotent)
    # A: depth 3, 7 nodes, path of 3 accepted (prompt, window, window), all 4 tokens emitted.
    # B: depth 4, 4 nodes, path of 4 accepted but max_tokens let only 2 tokens out.
    report = {
        "trees": {"A": (3, 7, 2, 1, [P, W, W]), "B": (4, 4, 1, 0, [O, O, O, O])},
        "undrafted": {"C": "min_p"},
        "propose_seconds": 0.002,
        "verify_seconds": 0.003,
        "pool_ngrams": 42,
        "request_states": 3,
    }
    sched_out = SimpleNamespace(scheduled_spec_decode_tokens={"A": [1] * 7, "B": [1] * 4}, num_invalid_spec_tokens=None)
    runner_out = SimpleNamespace(
        sampled_token_ids=[[5, 6, 7, 8], [5, 6, 7, 8, 9], [3]], req_id_to_index={"A": 0, "B": 1, "C": 2}
    )
    counted = spec_metrics.before_step(sched_out, runner_out)
    assert counted == {"A": (7, 3), "B": (4, 4)}
    # vLLM then trims B at max_tokens (in place) and finishes B and C
    runner_out.sampled_token_ids[1][2:] = []
    metrics = {"A": _request_metrics(7, 3, level), "B": _request_metrics(4, 4, level)}
    outs = [
        SimpleNamespace(
            request_id="A", new_token_ids=runner_out.sampled_token_ids[0], finish_reason=None, spec_decode_metrics=None
        ),
        SimpleNamespace(
            request_id="B",
            new_token_ids=runner_out.sampled_token_ids[1],
            finish_reason="length",
            spec_decode_metrics=metrics["B"],
        ),
        SimpleNamespace(request_id="C", new_token_ids=[3], finish_reason="length", spec_decode_metrics=None),
    ]
    stats = SchedulerStats()
    outputs = {0: SimpleNamespace(outputs=outs, scheduler_stats=stats)}
    scheduler = SimpleNamespace(
        num_spec_tokens=8,
        log_stats=True,
        spec_decode_metrics_level=level,
        requests={
            "A": SimpleNamespace(spec_decode_metrics=metrics["A"]),
            "C": SimpleNamespace(spec_decode_metrics=None),
        },
    )
    spec_metrics.finish_step(scheduler, sched_out, report, counted, outputs)
    return stats, metrics


def test_spec_decode_stats_count_tree_depth_and_kept_tokens():
    stats, _ = _step()
    spec = stats.spec_decoding_stats
    assert spec.num_drafts == 2
    assert spec.num_draft_tokens == 3 + 4  # depths, not the 11 nodes vLLM saw
    assert spec.num_accepted_tokens == 3 + 1  # B kept 2 tokens: 1 accepted + the sampled one
    assert spec.num_accepted_tokens_per_pos[:4] == [2, 1, 1, 0]
    assert spec.num_draft_tokens_per_pos[:5] == [2, 2, 2, 1, 0]
    # mean acceptance length = tokens emitted per drafted request-step
    assert 1 + spec.num_accepted_tokens / spec.num_drafts == (4 + 2) / 2


@pytest.mark.parametrize("level", ["summary", "detailed"])
def test_per_request_metrics_are_corrected(level):
    _, metrics = _step(level)
    a, b = metrics["A"], metrics["B"]
    assert a.num_draft_tokens == 3 and a.histogram[3] == 1 and sum(a.histogram) == 1
    assert b.num_draft_tokens == 4 and b.histogram[1] == 1 and b.histogram[4] == 0 and sum(b.histogram) == 1
    if level == "detailed":
        assert b.per_step_accepted == [1] and b.per_step_drafted == [4]


def test_lookahead_payload_reaches_scheduler_stats():
    stats, _ = _step()
    data = stats.lookahead
    assert data["accepted"] == {"prompt": 1, "window": 2, "output": 1}
    assert data["draft_tokens"] == {"7": 1, "4": 1}
    assert data["tokens_per_forward"] == {"4": 1, "2": 1}
    assert data["candidates"] == {"2": 1, "1": 1}
    assert data["window_steps"] == 1 and data["drafts"] == 2
    assert data["undrafted"] == {"min_p": 1}
    assert data["pool_ngrams"] == 42 and data["verify_seconds"] == 0.003
    # the worker's count as reported; the scheduler's reason table lost B and C as they finished
    assert data["request_states"] == {"worker": 3, "scheduler": 1}


def test_scheduler_stats_field_survives_msgspec():
    """The field the patch table adds travels engine core -> API server (vLLM's msgpack codec)."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    stats, _ = _step()
    wire = MsgpackEncoder().encode(EngineCoreOutputs(scheduler_stats=stats))
    got = MsgpackDecoder(EngineCoreOutputs).decode(wire).scheduler_stats
    assert got.lookahead == stats.lookahead
    assert got.spec_decoding_stats.num_draft_tokens == 7


def test_undrafted_reason_table_frees_aborted_requests_on_the_next_step():
    from vllm.v1.metrics.stats import SchedulerStats

    scheduler = SimpleNamespace(
        num_spec_tokens=8, log_stats=True, spec_decode_metrics_level="none", requests={"live": object()}
    )
    gone = {}

    def step(report):
        stats = SchedulerStats()
        spec_metrics.finish_step(
            scheduler,
            SimpleNamespace(scheduled_spec_decode_tokens={}, num_invalid_spec_tokens=None),
            report,
            {},
            {0: SimpleNamespace(outputs=[], scheduler_stats=stats)},
        )
        for k, v in stats.lookahead["undrafted"].items():
            gone[k] = gone.get(k, 0) + v
        return stats.lookahead["request_states"]["scheduler"]

    for k in range(200):  # each request is reported undrafted while live, then aborted (it never reaches an output)
        scheduler.requests[f"r{k}"] = object()
        held = step({"undrafted": {f"r{k}": "batch_full", "live": "min_p"}})
        assert held == 2  # "live" and r{k}: r{k-1}, aborted since the last step, was freed by this one
        del scheduler.requests[f"r{k}"]
    assert step({}) == 1  # the last aborted one freed: only the live request left
    assert gone == {"batch_full": 200}


def test_step_report_of_a_tree_outcome():
    tree = DraftTree(
        tokens=np.array([9, 1, 2, 3, 4]),
        parents=np.array([-1, 0, 1, 0, 3]),
        depths=np.array([0, 1, 2, 1, 2]),
        logits=np.ones(5, bool),
    )
    draft = StepDraft(
        tree=tree,
        window_nodes=np.array([3]),
        num_candidates=1,
        sources=np.array([0, P, P, W, W], dtype=np.int8),
        window_start=3,
    )
    report = StepReport()
    report.on_verified("A", StepOutcome(draft=draft, num_nodes=5, argmax=np.zeros(5, int), path=np.array([3, 4])))
    report.on_verified("B", StepOutcome(draft=draft, num_nodes=3, argmax=np.zeros(3, int), path=np.array([1])))
    assert report.trees["A"] == (2, 4, 1, 1, [W, W])
    assert report.trees["B"] == (2, 2, 1, 0, [P])  # cut before the window: it did not run


def test_stat_logger_exports_lookahead_metrics():
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.stats import SchedulerStats

    from vllm_lookahead.engine.hooks.startup import PROPOSER_PATH
    from vllm_lookahead.engine.metrics import prometheus

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(model=PROPOSER_PATH), model_config=SimpleNamespace(served_model_name="m")
    )
    logger = prometheus.LookaheadStatLogger(config, [0])
    try:
        logger.log_engine_initialized()
        labels = {"model_name": "m", "engine": "0"}
        assert REGISTRY.get_sample_value("vllm:lookahead_undrafted_requests_total", {**labels, "reason": "min_p"}) == 0
        stats, _ = _step()
        logger.record(stats, None, engine_idx=0)
        logger.record(SchedulerStats(), None, engine_idx=0)  # a step without lookahead data
        get = lambda name, **extra: REGISTRY.get_sample_value(name, {**labels, **extra})  # noqa: E731
        assert get("vllm:lookahead_accepted_tokens_total", source="window") == 2
        assert get("vllm:lookahead_tokens_per_forward_sum") == 6 and get("vllm:lookahead_tokens_per_forward_count") == 2
        assert get("vllm:lookahead_draft_tokens_per_step_sum") == 11
        assert get("vllm:lookahead_draft_tokens_per_step_bucket", le="4.0") == 1
        assert get("vllm:lookahead_window_steps_total") == 1 and get("vllm:lookahead_drafted_steps_total") == 2
        assert get("vllm:lookahead_undrafted_requests_total", reason="min_p") == 1
        assert get("vllm:lookahead_pool_ngrams") == 42
        assert get("vllm:lookahead_request_states", holder="worker") == 3
        assert get("vllm:lookahead_request_states", holder="scheduler") == 1
        assert get("vllm:lookahead_verify_seconds_count") == 1
        # inert without lookahead
        other = prometheus.LookaheadStatLogger(
            SimpleNamespace(speculative_config=None, model_config=config.model_config)
        )
        other.record(stats, None)
        assert get("vllm:lookahead_window_steps_total") == 1
    finally:
        prometheus._unregister()


def test_gauges_keep_the_latest_step_whichever_api_server_reads_it_last(tmp_path, monkeypatch):
    """With ``--api-server-count 2`` each step's stats reach one API server and prometheus_client
    runs in multiprocess mode.  The step that frees a finished request's state may be read by one
    server before the other reads the step before it: the gauges must still read the later step."""
    from prometheus_client import CollectorRegistry, values
    from prometheus_client.multiprocess import MultiProcessCollector
    from vllm.v1.metrics.stats import SchedulerStats

    from vllm_lookahead.engine.hooks.startup import PROPOSER_PATH
    from vllm_lookahead.engine.metrics import prometheus

    server = ["api-0"]  # the process the values are written from: one file each, as per pid
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: server[0]))
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(model=PROPOSER_PATH), model_config=SimpleNamespace(served_model_name="m")
    )
    logger = prometheus.LookaheadStatLogger(config, [0])
    try:
        logger.log_engine_initialized()

        def step(holding: int, at: float) -> SchedulerStats:
            stats = SchedulerStats()
            stats.lookahead = {"pool_ngrams": 100 * holding, "request_states": {"worker": holding}, "at": at}
            return stats

        logger.record(step(0, at=2.0), None, engine_idx=0)  # the later step, read first by api-0
        server[0] = "api-1"
        logger.record(step(1, at=1.0), None, engine_idx=0)  # the step before, read afterwards by api-1
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))
        labels = {"model_name": "m", "engine": "0"}
        assert registry.get_sample_value("vllm:lookahead_request_states", {**labels, "holder": "worker"}) == 0
        assert registry.get_sample_value("vllm:lookahead_pool_ngrams", labels) == 0
    finally:
        prometheus._unregister()
