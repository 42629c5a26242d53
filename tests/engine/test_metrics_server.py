"""Metrics at the OpenAI server: vLLM's spec-decode counters and ``vllm:lookahead_*`` agree with
the tokens the client received, and every query of the shipped Grafana dashboard
(``deploy/grafana/vllm_lookahead.json``) returns data from a real Prometheus scraping the server.

A toy-model server (full trees with the window, per-request spec-decode metrics on; the
session's shared one with one API server, then one with two) serves
OpenAI chat and completion requests, streaming and not, through the ``openai`` client;
``/metrics`` is read before and after.  Prometheus is Debian's ``prometheus`` package, installed
here if missing (the test is skipped, saying why, only when it cannot be installed).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from servers import TOY_ARGS, TOY_NAME, TOY_SPEC, Server, free_port, metric_total, scrape, start_all
from servers import stop_process as _stop

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "vllm_lookahead.json"
MODEL_NAME = TOY_NAME
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
total = metric_total


def _wait_http(url: str, proc: subprocess.Popen, seconds: float, log: Path) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{url}: process exited:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"{url} did not come up in {seconds} s:\n{log.read_text()[-4000:]}")


# One API server (the session's shared toy server: full trees + window every step, per-request
# spec-decode metrics on), and two: then vLLM runs prometheus_client in multiprocess mode and an
# engine core's stats reach one of the API servers, whichever process serves /metrics.
@pytest.fixture(scope="module", params=[1, 2], ids=["api-servers-1", "api-servers-2"])
def server(request, toy_model, tmp_path_factory):
    if request.param == 1:
        shared = request.getfixturevalue("toy_servers")["lookahead"]
        yield shared.base, shared.proc, shared.log
        return
    own = Server(
        "lookahead-2-api-servers",
        toy_model,
        TOY_SPEC,
        [*TOY_ARGS, "--per-request-spec-decode-metrics", "summary", "--api-server-count", "2"],
        tmp_path_factory.mktemp("server"),
    )
    try:
        start_all([own])
        yield own.base, own.proc, own.log
    finally:
        own.stop()


def _send_requests(base: str) -> list[dict]:
    """Chat and completion, streaming and not; returns per request: tokens received and vLLM's
    per-request spec-decode record."""
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="none")
    results = []
    for max_tokens in (48, 6, 96):  # 6: drafts run past max_tokens and must not count
        r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=max_tokens, temperature=0)
        results.append({"tokens": r.usage.completion_tokens, "spec": (r.model_extra or {}).get("metrics")})
        r = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, temperature=0
        )
        results.append({"tokens": r.usage.completion_tokens, "spec": (r.model_extra or {}).get("metrics")})
    for kind in ("completion", "chat"):
        if kind == "completion":
            stream = client.completions.create(
                model=MODEL_NAME,
                prompt=PROMPT,
                max_tokens=40,
                temperature=0.7,
                seed=3,
                stream=True,
                stream_options={"include_usage": True},
            )
        else:
            stream = client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=40,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        usage, spec = None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
                spec = (chunk.model_extra or {}).get("metrics")
        results.append({"tokens": usage, "spec": spec})
    # served without drafts: min_p (vLLM's speculative path cannot apply it) and max_tokens 1
    r = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0.8, extra_body={"min_p": 0.1}
    )
    results.append({"tokens": r.usage.completion_tokens, "spec": None, "undrafted": "min_p"})
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1, temperature=0)
    results.append({"tokens": r.usage.completion_tokens, "spec": None, "undrafted": "no_room"})
    # and one that asks for no drafts (a per-request setting, vllm_xargs)
    r = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"vllm_xargs": {"lookahead": "off"}}
    )
    results.append({"tokens": r.usage.completion_tokens, "spec": None, "undrafted": "request"})
    return results


@pytest.fixture(scope="module")
def traffic(server, tmp_path_factory):
    """Prometheus (if it can be had) scraping the server while the requests run; the metrics
    before and after."""
    base, proc, _ = server
    prom = _start_prometheus(base, tmp_path_factory.mktemp("prometheus"))
    try:
        if prom is not None:
            _wait_for_scrapes(prom[1], 2)
        before = scrape(base)
        results = _send_requests(base)
        time.sleep(2)  # stats reach the API server with the next engine step / stats interval
        after = scrape(base)
        if prom is not None:
            _wait_for_scrapes(prom[1], 3)
        yield before, after, results, prom
    finally:
        if prom is not None:
            _stop(prom[0])


def delta(before: dict, after: dict, name: str, **labels) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def test_counters_agree_with_tokens_received(traffic):
    before, after, results, _ = traffic
    d = lambda name, **labels: delta(before, after, name, **labels)  # noqa: E731
    received = sum(r["tokens"] for r in results)
    assert d("vllm:generation_tokens_total") == received

    drafts = d("vllm:spec_decode_num_drafts_total")
    accepted = d("vllm:spec_decode_num_accepted_tokens_total")
    draft_tokens = d("vllm:spec_decode_num_draft_tokens_total")
    assert drafts > 0 and accepted > 0, "no draft accepted: the test proves nothing"
    # Per request (vLLM's --per-request-spec-decode-metrics): every drafted step emitted
    # 1 + accepted tokens, the prefill one more -- so accepted tokens never exceed what was received.
    per_request_accepted = 0
    for r in results:
        spec = (r["spec"] or {}).get("speculative_decoding")
        if r.get("undrafted"):
            continue
        assert spec is not None, r
        assert 1 + spec["num_spec_steps"] + spec["num_accepted_draft_tokens"] <= r["tokens"], r
        assert spec["num_accepted_draft_tokens"] <= spec["num_draft_tokens"]
        per_request_accepted += spec["num_accepted_draft_tokens"]
    assert per_request_accepted == accepted
    # Mean acceptance length = tokens per target forward of drafted request-steps (our histogram).
    tpf_sum = d("vllm:lookahead_tokens_per_forward_sum")
    tpf_count = d("vllm:lookahead_tokens_per_forward_count")
    assert tpf_count == drafts == d("vllm:lookahead_drafted_steps_total")
    assert 1 + accepted / drafts == pytest.approx(tpf_sum / tpf_count)
    # draft tokens = tree depth; the trees' nodes are more (full trees with the window)
    nodes = d("vllm:lookahead_draft_tokens_per_step_sum")
    assert drafts <= draft_tokens < nodes
    assert d("vllm:lookahead_draft_tokens_per_step_count") == drafts
    # accepted tokens by source add up to vLLM's accepted tokens
    by_source = {
        s: d("vllm:lookahead_accepted_tokens_total", source=s) for s in ("prompt", "output", "shared", "window")
    }
    assert sum(by_source.values()) == accepted, by_source
    # per-position: position 0 accepted at most once per draft, positions sum to accepted
    per_pos = d("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_pos == accepted
    assert d("vllm:lookahead_window_steps_total") > 0
    assert d("vllm:lookahead_candidates_per_step_count") == drafts
    assert d("vllm:lookahead_propose_seconds_count") > 0 and d("vllm:lookahead_verify_seconds_sum") > 0


def test_undrafted_requests_counted_by_reason(traffic):
    before, after, results, _ = traffic
    for reason in ("min_p", "no_room", "request"):
        expected = sum(1 for r in results if r.get("undrafted") == reason)
        assert delta(before, after, "vllm:lookahead_undrafted_requests_total", reason=reason) == expected, reason
    assert 'model_name="toy"' in next(s for s in after if s.startswith("vllm:lookahead_undrafted_requests_total"))


def test_every_api_server_refuses_a_bad_lookahead_setting(server):
    """The input processor of each API server process validates per-request settings (vLLM loads
    the plugin in each): a bad value is a 400 naming the key, on fresh connections to either."""
    base, proc, _ = server
    body = json.dumps(
        {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "vllm_xargs": {"lookahead_max_lead_tokens": -3}}
    ).encode()
    for _ in range(6):
        req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=60)
        assert info.value.code == 400
        assert "max_lead_tokens must be an integer in [0, 256]" in json.load(info.value)["error"]["message"]
    assert proc.poll() is None


def _state_gauges(base: str) -> dict[str, float]:
    metrics = scrape(base)
    return {
        "worker": total(metrics, "vllm:lookahead_request_states", holder="worker"),
        "scheduler": total(metrics, "vllm:lookahead_request_states", holder="scheduler"),
        "pool_ngrams": total(metrics, "vllm:lookahead_pool_ngrams"),
    }


def test_an_idle_server_holds_no_request_state(server, traffic):
    """While a request streams, the worker holds its pools; once it has finished, the gauges read 0.
    The engine step that tells the worker a request finished runs no forward (nothing else is
    scheduled), and the worker's report of what it still holds must come from that step."""
    from openai import OpenAI

    base = server[0]
    client = OpenAI(base_url=base + "/v1", api_key="none")
    during = None
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=64, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 4:
            during = _state_gauges(base)
    assert during is not None and during["worker"] >= 1 and during["pool_ngrams"] > 0, during
    deadline = time.time() + 15
    idle = _state_gauges(base)
    while any(idle.values()) and time.time() < deadline:
        time.sleep(0.5)
        idle = _state_gauges(base)
    assert idle == {"worker": 0, "scheduler": 0, "pool_ngrams": 0}, idle


# -- Prometheus ------------------------------------------------------------------------------


def _start_prometheus(base: str, workdir: Path):
    binary = shutil.which("prometheus")  # Debian's package: `make services` installs it (as root)
    if binary is None:
        return None
    port = free_port()
    target = base.removeprefix("http://")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: ['{target}']\n"
    )
    log = workdir / "prometheus.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/-/ready", proc, 60, log)
    return proc, url


def _query(prom_url: str, expr: str) -> dict:
    url = prom_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _wait_for_scrapes(prom_url: str, n: int) -> None:
    """Until Prometheus holds ``n`` more samples of the server than now."""
    expr = 'count_over_time(up{job="vllm"}[10m])'
    start = time.time()
    first = None
    while time.time() - start < 60:
        result = _query(prom_url, expr)["data"]["result"]
        count = int(float(result[0]["value"][1])) if result else 0
        first = count if first is None else first
        if count >= first + n:
            return
        time.sleep(0.5)
    raise AssertionError("Prometheus did not scrape the server")


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of the shipped dashboard, variables filled in."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "5m")
            expr = re.sub(r"\$(job|model_name|instance|engine)\b", ".*", expr)
            assert "$" not in expr, expr
            out.append((panel["title"], expr))
    return out


def test_every_dashboard_query_returns_data(traffic):
    _, _, _, prom = traffic
    if prom is None:
        pytest.skip("prometheus is not installed (`make services` installs Debian's package when run as root)")
    up = _query(prom[1], 'up{job="vllm"}')["data"]["result"]
    assert up and up[0]["value"][1] == "1", up
    queries = dashboard_queries()
    assert len(queries) >= 15
    empty = []
    for title, expr in queries:
        answer = _query(prom[1], expr)
        assert answer["status"] == "success", (title, expr, answer)
        if not answer["data"]["result"]:
            empty.append((title, expr))
    assert not empty, f"dashboard queries without data: {empty}"


def test_dashboard_keeps_vllm_spec_decode_panels():
    """vLLM's own speculative-decoding panels (same metrics and variables) stay in our dashboard."""
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "model_name", "instance", "engine"} <= variables
    exprs = " ".join(e for _, e in dashboard_queries())
    for name in (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:lookahead_accepted_tokens_total",
        "vllm:lookahead_undrafted_requests_total",
        "vllm:lookahead_tokens_per_forward",
        "vllm:lookahead_draft_tokens_per_step",
        "vllm:lookahead_candidates_per_step",
        "vllm:lookahead_window_steps_total",
        "vllm:lookahead_pool_ngrams",
        "vllm:lookahead_request_states",
        "vllm:lookahead_propose_seconds",
        "vllm:lookahead_verify_seconds",
    ):
        assert name in exprs, name
