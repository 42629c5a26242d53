"""Lookahead's own metrics on vLLM's ``/metrics``: a stat-logger plugin.

Entry point ``vllm.stat_logger_plugins: lookahead =
vllm_lookahead.engine.metrics.prometheus:LookaheadStatLogger``.  vLLM's API server builds it
beside its own loggers and hands it every ``SchedulerStats`` an engine core sends; the
lookahead part of those (``SchedulerStats.lookahead``, filled by :mod:`.spec_metrics` in
the engine core from what the workers reported) becomes, in vLLM's naming and labels
(``model_name``, ``engine``):

==========================================  =========  ============================================
``vllm:lookahead_accepted_tokens_total``    counter    accepted draft tokens by ``source``: prompt,
                                                       output, shared (other requests' output) or
                                                       window (n-grams only the Jacobi window found)
``vllm:lookahead_draft_tokens_per_step``    histogram  tree nodes a drafted request ran in one step
``vllm:lookahead_tokens_per_forward``       histogram  tokens a drafted request emitted per forward
``vllm:lookahead_candidates_per_step``      histogram  pool n-grams verified per drafted request-step
``vllm:lookahead_window_steps_total``       counter    drafted request-steps that ran the window
``vllm:lookahead_drafted_steps_total``      counter    drafted request-steps (the histograms' count)
``vllm:lookahead_undrafted_requests_total`` counter    finished requests that never had a draft, by
                                                       ``reason`` (min_p, logit_bias, ..., no_room,
                                                       batch_full, no_candidate)
``vllm:lookahead_pool_ngrams``              gauge      n-grams in the live requests' pools (a
                                                       request's recounted every 16 steps)
``vllm:lookahead_request_states``           gauge      requests with lookahead state, by ``holder``
                                                       (worker, scheduler): follows the running
                                                       requests if finished/aborted ones are freed
``vllm:lookahead_propose_seconds``          histogram  plugin time proposing, per engine step
``vllm:lookahead_verify_seconds``           histogram  plugin time verifying + compacting KV, per step
==========================================  =========  ============================================

The metrics live in the API server process; with ``--api-server-count > 1`` vLLM runs
prometheus_client in multiprocess mode and so do these (the gauges keep the most recent value,
as vLLM's gauges do -- most recent by the engine core's clock, :func:`_set_as_of`).  The plugin
is inert for engines without lookahead.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from vllm.v1.metrics.loggers import AggregateStatLoggerBase

PREFIX = "vllm:lookahead_"
_NODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64)
_CANDIDATE_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
_SECOND_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


class LookaheadStatLogger(AggregateStatLoggerBase):
    """Exports ``SchedulerStats.lookahead`` as ``vllm:lookahead_*`` (see the module docstring)."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        from vllm_lookahead.engine.hooks.startup import is_lookahead_config

        self.vllm_config = vllm_config
        self.enabled = is_lookahead_config(getattr(vllm_config, "speculative_config", None))
        model_name = vllm_config.model_config.served_model_name
        self.labelvalues = {idx: (model_name, str(idx)) for idx in (engine_indexes or [0])}
        self.metrics: _Metrics | None = None

    def _ready(self) -> _Metrics:
        # Created after every logger's __init__: vLLM's PrometheusStatLogger unregisters all
        # "vllm:" collectors when it is built, ours included.
        if self.metrics is None or not self.metrics.registered():
            self.metrics = _Metrics()
            for labels in self.labelvalues.values():
                self.metrics.touch(labels)
        return self.metrics

    def log_engine_initialized(self) -> None:
        if self.enabled:
            self._ready()

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        data = getattr(scheduler_stats, "lookahead", None) if self.enabled else None
        if not data:
            return
        labels = self.labelvalues.get(engine_idx) or (self.vllm_config.model_config.served_model_name, str(engine_idx))
        self._ready().observe(labels, data)


class _Metrics:
    """The collectors, registered in prometheus_client's default registry (vLLM serves it)."""

    def __init__(self) -> None:
        _unregister()
        base = ["model_name", "engine"]
        self.accepted = Counter(
            PREFIX + "accepted_tokens", "Accepted draft tokens by where the draft came from.", [*base, "source"]
        )
        self.draft_tokens = Histogram(
            PREFIX + "draft_tokens_per_step",
            "Draft tree nodes a drafted request ran in one target forward.",
            base,
            buckets=_NODE_BUCKETS,
        )
        self.tokens = Histogram(
            PREFIX + "tokens_per_forward",
            "Tokens a drafted request emitted per target forward (accepted + 1).",
            base,
            buckets=_TOKEN_BUCKETS,
        )
        self.candidates = Histogram(
            PREFIX + "candidates_per_step",
            "Pool n-grams verified per drafted request-step.",
            base,
            buckets=_CANDIDATE_BUCKETS,
        )
        self.window_steps = Counter(PREFIX + "window_steps", "Drafted request-steps that ran the Jacobi window.", base)
        self.drafted_steps = Counter(
            PREFIX + "drafted_steps", "Drafted request-steps (target forwards with a tree).", base
        )
        self.undrafted = Counter(
            PREFIX + "undrafted_requests", "Finished requests that never had a draft, by reason.", [*base, "reason"]
        )
        self.pool = Gauge(
            PREFIX + "pool_ngrams", "N-grams held by the live requests' pools.", base, multiprocess_mode="mostrecent"
        )
        self.states = Gauge(
            PREFIX + "request_states",
            "Requests lookahead holds per-request state for, by holder (worker: pools, windows, "
            "drafts; scheduler: the undrafted-reason table). Tracks running requests when "
            "finished and aborted ones are freed.",
            [*base, "holder"],
            multiprocess_mode="mostrecent",
        )
        self.propose = Histogram(
            PREFIX + "propose_seconds",
            "Plugin time spent proposing drafts, per engine step.",
            base,
            buckets=_SECOND_BUCKETS,
        )
        self.verify = Histogram(
            PREFIX + "verify_seconds",
            "Plugin time spent verifying drafts and compacting KV, per engine step.",
            base,
            buckets=_SECOND_BUCKETS,
        )

    def registered(self) -> bool:
        return self.accepted in REGISTRY._collector_to_names  # vLLM may have unregistered us since

    def touch(self, labels: tuple[str, str]) -> None:
        """Create every series at 0, so dashboards see them before the first draft."""
        from vllm_lookahead.core.source import SOURCE_NAMES
        from vllm_lookahead.engine.propose.eligibility import UNDRAFTED_REASONS

        for source in SOURCE_NAMES:
            self.accepted.labels(*labels, source)
        for reason in UNDRAFTED_REASONS:
            self.undrafted.labels(*labels, reason)
        for holder in ("worker", "scheduler"):
            self.states.labels(*labels, holder)
        for m in (
            self.draft_tokens,
            self.tokens,
            self.candidates,
            self.window_steps,
            self.drafted_steps,
            self.pool,
            self.propose,
            self.verify,
        ):
            m.labels(*labels)

    def observe(self, labels: tuple[str, str], data: dict) -> None:
        for source, n in data.get("accepted", {}).items():
            self.accepted.labels(*labels, source).inc(n)
        for hist, key in (
            (self.draft_tokens, "draft_tokens"),
            (self.tokens, "tokens_per_forward"),
            (self.candidates, "candidates"),
        ):
            child = hist.labels(*labels)
            for value, count in data.get(key, {}).items():
                for _ in range(int(count)):
                    child.observe(float(value))
        self.window_steps.labels(*labels).inc(data.get("window_steps", 0))
        self.drafted_steps.labels(*labels).inc(data.get("drafts", 0))
        for reason, n in data.get("undrafted", {}).items():
            self.undrafted.labels(*labels, reason).inc(n)
        at = data.get("at")
        if data.get("pool_ngrams", -1) >= 0:
            _set_as_of(self.pool.labels(*labels), data["pool_ngrams"], at)
        for holder, n in data.get("request_states", {}).items():
            if n >= 0:
                _set_as_of(self.states.labels(*labels, holder), n, at)
        if data.get("drafts") or data.get("propose_seconds"):
            self.propose.labels(*labels).observe(float(data.get("propose_seconds", 0.0)))
            self.verify.labels(*labels).observe(float(data.get("verify_seconds", 0.0)))


def _set_as_of(gauge: Any, value: float, at: float | None) -> None:
    """Set a ``mostrecent`` gauge's child to ``value`` as of ``at``, the engine core's clock when
    the step's stats were made, not when this API server read them.  With several API servers
    each step's stats reach one of them, and one slower to read its share would otherwise stamp
    an older step's value later than a newer one's: a finished request's state still counted
    after the step that freed it, for good (nothing runs after that step).  ``Gauge.set`` stamps
    its own clock; its value's ``set`` takes the timestamp (single-process values ignore it)."""
    if at is None:
        gauge.set(value)
    else:
        gauge._value.set(float(value), timestamp=float(at))


def _unregister() -> None:
    for collector in list(REGISTRY._collector_to_names):
        if getattr(collector, "_name", "").startswith(PREFIX):
            REGISTRY.unregister(collector)
