"""What vLLM's spec-decode counters mean with lookahead, fixed in the scheduler's process.

vLLM's scheduler counts a request's step as ``draft tokens = len(draft list)`` and
``accepted = tokens sampled - 1`` (``Scheduler.update_from_output``), before it cuts the
sampled tokens at ``max_tokens``, EOS or a stop token id.  With lookahead trees both are
off: the draft list is every tree node, and tokens accepted past the request's end are
thrown away.  After vLLM's own bookkeeping (:func:`finish_step`, called by the patch of
``update_from_output``) this module rebuilds the step's ``SpecDecodingStats`` -- and the
per-request ``--per-request-spec-decode-metrics`` record -- for every drafted request:

* **draft tokens** = the depth of the tree as run: the most tokens the step could have
  accepted.  For a chain (the CPU default) that is its length, as for every vLLM method,
  so vLLM's acceptance-rate and per-position panels read the same for chains and trees;
  what a tree costs (its node count) is ``vllm:lookahead_draft_tokens_per_step``.
* **accepted tokens** = tokens the request actually emitted this step, less one (the
  token every step samples): ``1 + accepted / drafts``, vLLM's "mean acceptance length",
  is then exactly the tokens per target forward of drafted steps.  (Stop *strings* are
  matched by the API server's detokenizer, after this point: a draft accepted past a
  stop string still counts, as it does for every vLLM method.)

It then hands the step's lookahead facts (:class:`~vllm_lookahead.engine.metrics.stats.StepReport`,
cut the same way) to the API server inside ``SchedulerStats`` (the ``lookahead`` field the
patch table adds), where :mod:`.prometheus` exports them.  The state kept here is one reason
label per live request never drafted so far (for ``vllm:lookahead_undrafted_requests``), pruned
as requests leave (aborted ones, which never reach an output, on the next step); its size is
exported as ``vllm:lookahead_request_states{holder="scheduler"}``.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from vllm_lookahead.core.source import Source

# Per-scheduler state: req_id -> why it has had no draft so far ("" once it has had one).
_STATE_ATTR = "_lookahead_undrafted"


def before_step(scheduler_output: Any, model_runner_output: Any) -> dict[str, tuple[int, int]] | None:
    """Before vLLM's ``update_from_output``: what vLLM will count per drafted request,
    ``req_id -> (draft tokens, accepted)``, taken before vLLM trims the sampled lists in place."""
    spec = scheduler_output.scheduled_spec_decode_tokens
    if not spec:
        return {}
    sampled = model_runner_output.sampled_token_ids
    index = model_runner_output.req_id_to_index
    invalid = scheduler_output.num_invalid_spec_tokens or {}
    seen = {}
    for req_id, tokens in spec.items():
        i = index.get(req_id)
        if not tokens or i is None or not sampled or not sampled[i]:
            continue
        seen[req_id] = (len(tokens) - invalid.get(req_id, 0), max(len(sampled[i]) - 1, 0))
    return seen


def finish_step(
    scheduler: Any,
    scheduler_output: Any,
    report: dict,
    vllm_counted: dict[str, tuple[int, int]],
    outputs: dict[int, Any],
) -> None:
    """After vLLM's ``update_from_output``: rebuild its spec-decode stats and attach ours."""
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    trees: dict[str, tuple] = report.get("trees", {})
    undrafted = _track_undrafted(scheduler, scheduler_output, report.get("undrafted", {}))
    level = getattr(scheduler, "spec_decode_metrics_level", "none")
    spec = SpecDecodingStats.new(scheduler.num_spec_tokens) if scheduler.log_stats else None
    accepted_by_source: Counter[str] = Counter()
    nodes_hist: Counter[str] = Counter()
    tokens_hist: Counter[str] = Counter()
    cands_hist: Counter[str] = Counter()
    window_steps = 0
    state = getattr(scheduler, _STATE_ATTR)
    for eco in outputs.values():
        for out in eco.outputs:
            req_id = out.request_id
            if out.finish_reason is not None:
                reason = state.pop(req_id, None)
                if reason:
                    undrafted[reason] += 1
            tree = trees.get(req_id)
            if tree is None or req_id not in vllm_counted:
                continue
            depth, nodes, candidates, window, path_sources = tree
            emitted = len(out.new_token_ids)
            accepted = min(max(emitted - 1, 0), len(path_sources))
            if spec is not None:
                spec.observe_draft(num_draft_tokens=depth, num_accepted_tokens=accepted)
            _fix_request_metrics(scheduler, out, req_id, vllm_counted[req_id], depth, accepted, level)
            for s in path_sources[:accepted]:
                accepted_by_source[Source(s).name.lower() if s else "other"] += 1
            nodes_hist[str(nodes)] += 1
            tokens_hist[str(accepted + 1)] += 1
            cands_hist[str(candidates)] += 1
            window_steps += window
    stats = next((eco.scheduler_stats for eco in outputs.values() if eco.scheduler_stats is not None), None)
    if stats is None:  # --disable-log-stats (or nothing to send this step)
        return
    stats.spec_decoding_stats = spec if spec is not None and spec.num_drafts else None
    stats.lookahead = {
        "drafts": sum(nodes_hist.values()),
        "draft_tokens": dict(nodes_hist),
        "tokens_per_forward": dict(tokens_hist),
        "candidates": dict(cands_hist),
        "window_steps": window_steps,
        "accepted": dict(accepted_by_source),
        "undrafted": dict(undrafted),
        "propose_seconds": float(report.get("propose_seconds", 0.0)),
        "verify_seconds": float(report.get("verify_seconds", 0.0)),
        "pool_ngrams": int(report.get("pool_ngrams", -1)),
        "request_states": {"worker": int(report.get("request_states", -1)), "scheduler": len(state)},
        "at": time.time(),  # when the gauges' values were true: each API server sets them as of this
    }


def _track_undrafted(scheduler: Any, scheduler_output: Any, reasons: dict[str, str]) -> Counter[str]:
    """Update the per-request reason table; returns counts of requests already gone (aborted)."""
    state: dict[str, str] | None = getattr(scheduler, _STATE_ATTR, None)
    if state is None:
        state = {}
        setattr(scheduler, _STATE_ATTR, state)
    for req_id in scheduler_output.scheduled_spec_decode_tokens or ():
        state[req_id] = ""
    for req_id, reason in reasons.items():
        if state.get(req_id) != "":
            state[req_id] = reason
    gone: Counter[str] = Counter()
    live = scheduler.requests
    # Every entry is a request that was live when it was added and is popped when its output
    # finishes it; one more entry than live requests means some left without an output
    # (aborted): drop those now.  A scan of at most the live requests plus this step's aborts.
    if len(state) > len(live):
        for req_id in [r for r in state if r not in live]:
            reason = state.pop(req_id)
            if reason:
                gone[reason] += 1
    return gone


def _fix_request_metrics(
    scheduler: Any, out: Any, req_id: str, counted: tuple[int, int], depth: int, accepted: int, level: str
) -> None:
    """Replace what vLLM observed for this step in the request's per-request spec-decode record."""
    metrics = getattr(out, "spec_decode_metrics", None)
    if metrics is None:
        request = scheduler.requests.get(req_id)
        metrics = getattr(request, "spec_decode_metrics", None)
    if metrics is None:
        return
    drafted, vllm_accepted = counted
    if vllm_accepted < len(metrics.histogram):
        metrics.histogram[vllm_accepted] -= 1
    metrics.histogram[min(accepted, len(metrics.histogram) - 1)] += 1
    metrics.num_draft_tokens += depth - drafted
    if level == "detailed" and metrics.per_step_accepted:
        metrics.per_step_accepted[-1] = accepted
        metrics.per_step_drafted[-1] = depth
