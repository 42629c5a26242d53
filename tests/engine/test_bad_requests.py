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
    for body in (_completion(max_tokens=64, temperature=0), _completion(prompt=[5] * (MAX_MODEL_LEN - 12), max_tokens=100, temperature=0)):
        answers = {}
        for name, base in bases.items():
            status, answer = _post(base, "/v1/completions", body)
            assert status == 200, answer
            answers[name] = (answer["choices"][0]["text"], answer["usage"]["completion_tokens"])
        assert answers["lookahead"] == answers["none"], answers
