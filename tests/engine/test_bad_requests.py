"""Bad requests and dropped clients at the OpenAI server: with lookahead exactly what vLLM does
without speculation -- the same 4xx status for every malformed request, never an engine crash --
and a client that disconnects mid-stream leaves the server healthy and exact.

The session's two toy-model servers side by side (``toy_servers``): lookahead (full trees and the
window on every step) and no speculation.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from servers import TOY_MAX_MODEL_LEN as MAX_MODEL_LEN
from servers import TOY_NAME as MODEL

pytestmark = pytest.mark.engine

PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"


@pytest.fixture(scope="module")
def servers(toy_servers):
    """({"lookahead": base_url, "none": base_url}, {name: Popen}) -- the session's toy servers."""
    return {n: s.base for n, s in toy_servers.items()}, {n: s.proc for n, s in toy_servers.items()}


def _post(base: str, path: str, body: bytes) -> tuple[int, dict | str]:
    req = urllib.request.Request(base + path, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def _completion(**fields) -> bytes:
    return json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 16, **fields}).encode()


BAD = {
    "malformed JSON": ("/v1/completions", b'{"model": "toy", "prompt": '),
    "temperature < 0": ("/v1/completions", _completion(temperature=-1)),
    "top_p > 1": ("/v1/completions", _completion(top_p=2)),
    "top_k < -1": ("/v1/completions", _completion(top_k=-5)),
    "max_tokens < 0": ("/v1/completions", _completion(max_tokens=-3)),
    "n = 0": ("/v1/completions", _completion(n=0)),
    "logprobs over the limit": ("/v1/completions", _completion(logprobs=100000)),
    "prompt over max_model_len": ("/v1/completions", _completion(prompt=[5] * (MAX_MODEL_LEN + 10))),
    "unknown model": ("/v1/completions", json.dumps({"model": "nope", "prompt": "x"}).encode()),
    "chat without messages": ("/v1/chat/completions", json.dumps({"model": MODEL}).encode()),
    "bad stop type": ("/v1/completions", _completion(stop=123)),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_gets_the_same_4xx_as_without_speculation(servers, case):
    bases, procs = servers
    path, body = BAD[case]
    got = {name: _post(base, path, body)[0] for name, base in bases.items()}
    assert got["lookahead"] == got["none"], got
    assert 400 <= got["lookahead"] < 500, got
    for name, base in bases.items():
        assert procs[name].poll() is None, f"{name} server died on {case}"
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            assert r.status == 200


def test_client_dropping_a_stream_leaves_the_server_healthy_and_exact(servers):
    from openai import OpenAI

    bases, procs = servers
    la = OpenAI(base_url=bases["lookahead"] + "/v1", api_key="none")
    for _ in range(3):  # disconnect after a few chunks, mid-generation
        stream = la.completions.create(model=MODEL, prompt=PROMPT, max_tokens=300, temperature=0, stream=True)
        for k, _chunk in enumerate(stream):
            if k == 3:
                break
        stream.close()
    time.sleep(1)
    assert procs["lookahead"].poll() is None
    with urllib.request.urlopen(bases["lookahead"] + "/health", timeout=10) as r:
        assert r.status == 200
    # then a plain request, and one whose prompt + max_tokens exceed max_model_len (vLLM accepts
    # it and stops at the limit): the same answers as without speculation
    for body in (
        _completion(max_tokens=64, temperature=0),
        _completion(prompt=[5] * (MAX_MODEL_LEN - 12), max_tokens=100, temperature=0),
    ):
        answers = {}
        for name, base in bases.items():
            status, answer = _post(base, "/v1/completions", body)
            assert status == 200, answer
            answers[name] = (answer["choices"][0]["text"], answer["usage"]["completion_tokens"])
        assert answers["lookahead"] == answers["none"], answers


# -- per-request lookahead settings (vllm_xargs -> SamplingParams.extra_args) ------------------

BAD_SETTINGS = {  # needle -> vllm_xargs; the lookahead server runs servers.TOY_SPEC (W=7, the defaults)
    "max_lead_tokens": {"lookahead_max_lead_tokens": -3},
    "window_size": {"lookahead_window_size": 8},  # above the engine's 7
    "ngram_size": {"lookahead_ngram_size": 3},  # per engine
    "lookahead_windowsize": {"lookahead_windowsize": 2},  # unknown
    "'lookahead'": {"lookahead": "sometimes"},
    "shared_pool": {"lookahead_shared_pool": True},  # per engine
}


def _chat(**fields) -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16, **fields}
    ).encode()


@pytest.mark.parametrize("needle", list(BAD_SETTINGS))
def test_a_bad_lookahead_setting_is_a_400_naming_the_key(servers, needle):
    bases, procs = servers
    xargs = BAD_SETTINGS[needle]
    (key,) = xargs
    for path, body in (
        ("/v1/completions", _completion(vllm_xargs=xargs)),
        ("/v1/chat/completions", _chat(vllm_xargs=xargs)),
    ):
        status, answer = _post(bases["lookahead"], path, body)
        assert status == 400, (path, status, answer)
        assert needle in answer["error"]["message"] and answer["error"]["param"] == key, answer
        # without lookahead nobody reads the key, as vLLM leaves extra_args alone
        status, answer = _post(bases["none"], path, body)
        assert status == 200, answer
    assert procs["lookahead"].poll() is None
    status, answer = _post(bases["lookahead"], "/v1/completions", _completion(max_tokens=8, temperature=0))
    assert status == 200 and answer["usage"]["completion_tokens"] == 8, answer


def test_per_request_settings_in_a_concurrent_batch_are_exact_and_off_is_never_drafted(servers):
    """Requests sent together (one batch): those turned off get no draft (vLLM's per-request
    spec-decode metrics, on for this server), the others draft; every greedy answer equals the
    server without speculation; the turned-off ones count as ``reason="request"``."""
    from concurrent.futures import ThreadPoolExecutor

    from servers import metric_total, scrape

    bases, _ = servers
    settings = [
        None,
        {"lookahead": "off"},
        {"lookahead_window_size": 0, "lookahead_max_lead_tokens": 4},
        None,
        {"lookahead": "off"},
        {"lookahead_guess_set_size": 1, "lookahead_window_size": 2},
    ]
    prompts = [PROMPT + "    " * k for k in range(len(settings))]

    def body(i: int) -> bytes:
        extra = {"vllm_xargs": settings[i]} if settings[i] else {}
        return json.dumps({"model": MODEL, "prompt": prompts[i], "max_tokens": 96, "temperature": 0, **extra}).encode()

    before = scrape(bases["lookahead"])
    answers = {}
    for name, base in bases.items():
        with ThreadPoolExecutor(len(settings)) as pool:
            post = lambda i, base=base: _post(base, "/v1/completions", body(i))
            answers[name] = list(pool.map(post, range(len(settings))))
    time.sleep(2)  # the engine's stats reach the API server with its next stats message
    after = scrape(bases["lookahead"])
    for i, ((status, got), (status_none, want)) in enumerate(zip(answers["lookahead"], answers["none"])):
        assert status == status_none == 200, (got, want)
        assert got["choices"][0]["text"] == want["choices"][0]["text"], (i, settings[i])
        drafts = ((got.get("metrics") or {}).get("speculative_decoding") or {}).get("num_draft_tokens", 0)
        if settings[i] and settings[i].get("lookahead") == "off":
            assert drafts == 0, (i, got.get("metrics"))
        else:
            assert drafts > 0, (i, settings[i], got.get("metrics"))
    undrafted = metric_total(after, "vllm:lookahead_undrafted_requests_total", reason="request") - metric_total(
        before, "vllm:lookahead_undrafted_requests_total", reason="request"
    )
    assert undrafted == 2


def test_the_readme_http_example_runs(servers):
    import subprocess
    import sys

    from harness import readme_python_block

    bases, _ = servers
    example = readme_python_block("# OpenAI client")  # its second request carries per-request settings
    example = example.replace("http://127.0.0.1:8000", bases["lookahead"]).replace(
        '"SmolLM2-135M-Instruct"', repr(MODEL)
    )
    done = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]
