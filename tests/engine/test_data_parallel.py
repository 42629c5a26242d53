"""Data parallel 2 at the OpenAI server: ``vllm-lookahead serve --data-parallel-size 2`` runs two
engine cores behind one API endpoint, one CPU core each, lookahead in both.

vLLM runs each data-parallel rank of a dense model as an independent engine (its own scheduler,
workers and KV cache; ``EngineCoreProc`` after ``reconfigure_for_independent_dp_rank``), and
lookahead's state is each engine's own: request pools and windows, the draft rule's forward-cost
model, the scheduler's undrafted-reason table and the opt-in shared pool.  Against one server with
``shared_pool`` on and otherwise the default config (the cost-aware draft rule):

* greedy completions, sent concurrently and spread over both engines by vLLM's load balancer, and
  seeded sampled ones are token for token those of a no-speculation toy server (``toy_reference``:
  the session's ``toy_servers["none"]`` when it runs; one engine, same arguments otherwise);
* both engines served requests and accepted drafts;
* the one ``/metrics`` endpoint carries both engines' ``vllm:spec_decode_*`` and
  ``vllm:lookahead_*`` series, told apart by the ``engine`` label, and per engine the two agree
  (drafted steps, accepted tokens = accepted tokens by source, generated tokens = tokens received);
* the shared pool is per engine: after one request served by engine 0 (routed with vLLM's
  ``X-data-parallel-rank`` header) engine 0 holds that output's n-grams and engine 1 none
  (``vllm:lookahead_pool_ngrams`` per engine, the pools of finished requests being freed); after
  the same request on engine 1, engine 1 holds its own;
* each engine's worker profiled its own forward-cost model (one start-up line per engine; no
  agreement across engines, there is nothing to agree on);
* a request whose prompt is all in the prefix cache is not padded with placeholder drafts (vLLM
  drops lookahead's draft-length schedule under data parallelism; the plugin puts it back).

Threads: ``VLLM_CPU_OMP_THREADS_BIND=0|1``, which vLLM's CPU executor splits by local DP rank
(``vllm/utils/ompmultiprocessing.py``): engine 0's worker runs on core 0, engine 1's on core 1.
Left at ``auto`` on this one-NUMA-node machine, both workers would be bound to core 0.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from servers import TOY_ARGS, TOY_NAME, Server, metric_total, scrape, start_all

pytestmark = pytest.mark.engine

ENGINES = ("0", "1")
SPEC = {"method": "lookahead", "shared_pool": True}
DP_ARGS = [*TOY_ARGS, "--data-parallel-size", "2"]
DP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # one core per engine
MAX_TOKENS = 48
GREEDY = 16  # concurrent greedy requests (the load balancer gives each engine some)
CYCLES = 4  # of which copy-friendly (toy_model.cycle_prompt)
SEEDED = 4  # concurrent seeded sampled requests
SOURCES = ("prompt", "output", "shared", "window")


@pytest.fixture(scope="module")
def servers(toy_model, tmp_path_factory, toy_reference):
    """(the DP 2 lookahead server, a no-speculation toy server), both up."""
    dp = Server("lookahead-dp2", toy_model, SPEC, DP_ARGS, tmp_path_factory.mktemp("dp-server"), env=DP_ENV)
    try:
        start_all([dp] if toy_reference.healthy() else [dp, toy_reference])  # side by side if both start
        yield dp, toy_reference
    finally:
        dp.stop()


def complete(base: str, prompt: list[int], rank: int | None = None, **params) -> list[int]:
    """Token ids of one completion (``rank``: the data-parallel engine to serve it)."""
    body = {
        "model": TOY_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "return_token_ids": True,
        **params,
    }
    headers = {"Content-Type": "application/json"}
    if rank is not None:
        headers["X-data-parallel-rank"] = str(rank)
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)["choices"][0]["token_ids"]


def per_engine(metrics: dict, name: str, **labels: str) -> dict[str, float]:
    return {e: metric_total(metrics, name, engine=e, **labels) for e in ENGINES}


def delta(before: dict, after: dict, name: str, **labels: str) -> dict[str, float]:
    """Per engine: how much the series of ``name`` with ``labels`` grew."""
    a, b = per_engine(after, name, **labels), per_engine(before, name, **labels)
    return {e: a[e] - b[e] for e in ENGINES}


def settled(base: str, before: dict, received: int, seconds: float = 20) -> dict:
    """``/metrics`` once the engines' stats of ``received`` generated tokens reached it."""
    deadline = time.time() + seconds
    while True:
        after = scrape(base)
        got = metric_total(after, "vllm:generation_tokens_total") - metric_total(before, "vllm:generation_tokens_total")
        if got >= received or time.time() > deadline:
            return after
        time.sleep(0.5)


def idle(base: str, seconds: float = 20) -> dict:
    """``/metrics`` once no engine's worker holds request state (finished requests freed)."""
    deadline = time.time() + seconds
    while True:
        metrics = scrape(base)
        if metric_total(metrics, "vllm:lookahead_request_states", holder="worker") == 0 or time.time() > deadline:
            return metrics
        time.sleep(0.5)


def pooled(base: str, engine: str, seconds: float = 20) -> dict:
    """``/metrics`` once no worker holds request state and ``engine``'s pool gauge has arrived (the
    engines' stats reach the API server asynchronously, after the tokens do)."""
    deadline = time.time() + seconds
    while True:
        metrics = idle(base)
        if metric_total(metrics, "vllm:lookahead_pool_ngrams", engine=engine) > 0 or time.time() > deadline:
            return metrics
        time.sleep(0.5)


@pytest.fixture(scope="module")
def traffic(servers, toy_model):
    """Both phases' completions, the reference's, and ``/metrics`` around each phase."""
    from test_toy_exactness import toy_prompts

    from support.toy_model import cycle_prompt

    dp, reference = servers
    prompts = toy_prompts(toy_model, GREEDY - CYCLES)
    # copy-friendly prompts: the draft rule drafts them on any machine, so both engines accept drafts
    prompts += [cycle_prompt(Path(toy_model), 24, start=100 + 37 * i) for i in range(CYCLES)]
    out: dict = {"start": scrape(dp.base)}

    # Phase 1 (sequential, routed): one prompt on engine 0, then on engine 1.  A copy-friendly
    # probe: its first draft (the prompt's lead, priced by a fresh engine's cost model) is accepted
    # whole, so the request's pools learn an output of several n-grams from that one step, however
    # the cost model prices the next steps at batch 1 on the toy model (a forward of ~0.6 ms, where
    # one slow step can price every draft out).
    probe = cycle_prompt(Path(toy_model), 24, start=900)
    out["probe_reference"] = complete(reference.base, probe)
    runs = []
    for rank in (0, 1):
        # an engine whose cost model says no draft pays at that moment keeps
        for attempt in range(1, 4):  # noqa: B007 (read after the loop)
            before = idle(dp.base)  # no request state, so shares nothing: the probe is sent again
            tokens = complete(dp.base, probe, rank=rank)
            settled(dp.base, before, len(tokens))
            after = pooled(dp.base, str(rank))
            if metric_total(after, "vllm:lookahead_pool_ngrams", engine=str(rank)) > 0:
                break
        runs.append({"rank": rank, "tokens": tokens, "before": before, "after": after, "attempts": attempt})
    out["probe_runs"] = runs

    # Phase 2 (concurrent, the load balancer decides): greedy and seeded sampled requests.
    jobs = [(p, {}) for p in prompts]
    jobs += [(prompts[i], {"temperature": 0.8, "top_p": 0.95, "seed": 11 + i}) for i in range(SEEDED)]
    before = scrape(dp.base)
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: complete(dp.base, job[0], **job[1]), jobs))
    after = settled(dp.base, before, sum(len(t) for t in got))
    with ThreadPoolExecutor(len(jobs)) as pool:
        expected = list(pool.map(lambda job: complete(reference.base, job[0], **job[1]), jobs))
    out.update(jobs=jobs, got=got, expected=expected, before=before, after=after, end=idle(dp.base))
    return out


def test_completions_equal_no_speculation(traffic):
    mismatches = [i for i, (g, e) in enumerate(zip(traffic["got"], traffic["expected"])) if g != e]
    assert not mismatches, f"requests {mismatches} differ from the no-speculation server ({len(traffic['jobs'])} sent)"
    assert all(len(t) == MAX_TOKENS for t in traffic["got"][:GREEDY])  # greedy on the toy model never ends early
    for run in traffic["probe_runs"]:
        assert run["tokens"] == traffic["probe_reference"], f"probe on engine {run['rank']}"


def test_both_engines_served_and_accepted_drafts(traffic):
    """The concurrent phase: both engines served, drafts were accepted.  Per engine, drafts
    accepted over the module's traffic (the routed probes included) are checked by
    ``test_metrics_of_both_engines_on_one_endpoint``: in the concurrent phase an engine's cost
    model may price every draft of its share out (ten requests at once on a forward of under a
    millisecond, on a loaded machine), which is the rule doing its job."""
    before, after = traffic["before"], traffic["after"]
    served = delta(before, after, "vllm:request_success_total")
    accepted = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    drafted = delta(before, after, "vllm:spec_decode_num_drafts_total")
    undrafted = {
        reason: delta(before, after, "vllm:lookahead_undrafted_requests_total", reason=reason)
        for reason in ("batch_full", "no_candidate", "no_room")
    }
    print(
        f"requests per engine {served}, drafted steps {drafted}, accepted draft tokens {accepted}, "
        f"finished undrafted by reason {undrafted}"
    )
    assert sum(served.values()) == len(traffic["jobs"])
    assert all(served[e] > 0 for e in ENGINES), served
    assert sum(accepted.values()) > 0, accepted
    generated = delta(before, after, "vllm:generation_tokens_total")
    assert sum(generated.values()) == sum(len(t) for t in traffic["got"]), generated


def test_metrics_of_both_engines_on_one_endpoint(traffic):
    """Per engine, vLLM's spec-decode counters and lookahead's own tell the same story: the
    ``engine`` label of ours is the engine that drafted (a mislabelled series would break the
    per-engine equalities while the sums still matched)."""
    start, end = traffic["start"], traffic["end"]
    for e in ENGINES:

        def d(name: str, e: str = e, **labels: str) -> float:
            return delta(start, end, name, **labels)[e]

        drafts = d("vllm:spec_decode_num_drafts_total")
        accepted = d("vllm:spec_decode_num_accepted_tokens_total")
        by_source = {s: d("vllm:lookahead_accepted_tokens_total", source=s) for s in SOURCES}
        print(f"engine {e}: drafts {drafts}, accepted {accepted}, by source {by_source}")
        assert drafts > 0 and accepted > 0, e
        assert d("vllm:lookahead_drafted_steps_total") == drafts, e
        assert d("vllm:lookahead_tokens_per_forward_count") == drafts, e
        assert sum(by_source.values()) == accepted, (e, by_source)
        assert d("vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted, e
        assert d("vllm:lookahead_propose_seconds_count") > 0, e
    # both engines' series are exported, and only theirs
    engines = {
        s.split('engine="', 1)[1].split('"', 1)[0]
        for s in end
        if s.startswith(("vllm:lookahead_", "vllm:spec_decode_")) and 'engine="' in s
    }
    assert engines == set(ENGINES), engines


def test_shared_pool_is_per_engine(traffic):
    """Once a request has finished, what its engine still holds is the shared pool (the request's
    own pools are freed): after the probe on engine 0, engine 0 holds its output's n-grams and
    engine 1 none; after the probe on engine 1, engine 1 holds its own."""
    on_first, on_second = traffic["probe_runs"]
    for run in (on_first, on_second):
        states = per_engine(run["after"], "vllm:lookahead_request_states", holder="worker")
        assert states == {"0": 0, "1": 0}, states
        served = delta(run["before"], run["after"], "vllm:request_success_total")
        assert served == {e: float(e == str(run["rank"])) for e in ENGINES}, f"probe for engine {run['rank']}: {served}"
    first = per_engine(on_first["after"], "vllm:lookahead_pool_ngrams")
    second = per_engine(on_second["after"], "vllm:lookahead_pool_ngrams")
    print(
        f"shared pool n-grams per engine: after the probe on engine 0 {first}, then on engine 1 {second} "
        f"(probes sent {on_first['attempts']} / {on_second['attempts']} times)"
    )
    for run in (on_first, on_second):
        drafted = delta(run["before"], run["after"], "vllm:spec_decode_num_drafts_total")
        undrafted = {
            reason: delta(run["before"], run["after"], "vllm:lookahead_undrafted_requests_total", reason=reason)
            for reason in ("batch_full", "no_candidate", "no_room")
        }
        print(f"probe on engine {run['rank']}: drafted steps {drafted}, finished undrafted by reason {undrafted}")
    assert first["0"] > 0 and first["1"] == 0, first
    assert second["1"] > 0 and second["0"] == first["0"], second


def test_each_engine_profiled_its_own_cost_model(servers, traffic):
    log = servers[0].log.read_text(errors="replace")
    assert log.count("lookahead: forward cost profiled") == len(ENGINES), "one profile per engine's worker"
    assert "share one forward-cost model" not in log


def test_a_fully_cached_prompt_is_not_padded_with_placeholder_drafts(servers, toy_model, traffic):
    """vLLM drops every draft-length schedule under data parallelism, which brings back its padding
    of a request whose prompt is all in the prefix cache to 1 + K placeholder rows (84 here); the
    plugin puts lookahead's schedule back (``engine/hooks/startup.py: restore_draft_schedule``), so the
    second request for a 257-token prompt (two blocks of 128 + 1 token) computes one row."""
    from support.toy_model import cycle_prompt

    dp = servers[0]
    prompt = cycle_prompt(Path(toy_model), 257, start=700)
    complete(dp.base, prompt, rank=0, max_tokens=1)
    before = idle(dp.base)
    complete(dp.base, prompt, rank=0, max_tokens=1)
    settled(dp.base, before, 1)
    after = idle(dp.base)
    assert delta(before, after, "vllm:prefix_cache_hits_total")["0"] >= 256
    assert delta(before, after, "vllm:spec_decode_num_draft_tokens_total")["0"] == 0
    assert "does not apply to lookahead" in dp.log.read_text(errors="replace")
