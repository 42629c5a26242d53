"""The OpenAI-compatible server with lookahead, and start-up failures on bad configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from harness import readme_python_block
from servers import CLI, TOY_ARGS, Server, metric_total, start_all
from servers import free_port as _free_port

pytestmark = pytest.mark.engine


@pytest.mark.parametrize(
    "spec,args,needle,in_file",
    [
        ('{"method": "lookahead", "window_size": 65}', [], "window_size", False),
        ('{"method": "lookahead", "ngram": 3}', [], "ngram", False),
        # the default trees (84 tokens a step) cannot fit the step's token budget (max_model_len:
        # tests/unit/test_startup_gpu_settings.py)
        (
            '{"method": "lookahead"}',
            ["--max-num-batched-tokens", "48"],
            "--max-num-batched-tokens is 48: raise it to >= 84",
            False,
        ),
        # in a config file the CLI does not read it: the plugin stops vLLM's start-up, in one line
        ('{"method": "lookahead", "window_size": 65}', [], "window_size", True),
    ],
    ids=["range", "unknown-key", "over-max-num-batched-tokens", "in-a-config-file"],
)
def test_bad_config_exits_nonzero_with_one_line(spec, args, needle, in_file, toy_model, tmp_path):
    if in_file:
        config = tmp_path / "serve.yaml"
        config.write_text(f"speculative-config: '{spec}'\n")
        args = [*args, "--config", str(config)]
    else:
        args = [*args, "--speculative-config", spec]
    proc = subprocess.run(
        [*CLI, "serve", toy_model, "--port", str(_free_port()), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    lines = [
        line for line in proc.stderr.splitlines() if needle in line and not line.startswith("+ ")
    ]  # not the echoed command
    assert len(lines) == 1 and "lookahead" in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr.split(lines[0])[-1]
    # a config on the command line is refused before vLLM is started (the "+ " line echoes its command)
    assert any(line.startswith("+ ") for line in proc.stderr.splitlines()) == in_file


def test_bad_config_in_python_api_raises(toy_model):
    from vllm import LLM

    from vllm_lookahead.config import LookaheadConfigError

    with pytest.raises(LookaheadConfigError, match="guess_set_size"):
        LLM(model=toy_model, speculative_config={"method": "lookahead", "guess_set_size": 100})


def test_serve_default_model_answers_chat_completion(real_model):
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--enforce-eager", "--max-model-len", "2048"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail("server exited:\n" + (proc.stdout.read() if proc.stdout else ""))
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=2) as r:
                    models = json.load(r)
                break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail("server did not come up in 600 s")
        name = models["data"][0]["id"]
        body = json.dumps(
            {
                "model": name,
                "temperature": 0,
                "max_tokens": 48,
                "messages": [{"role": "user", "content": "List the first five prime numbers."}],
            }
        ).encode()
        req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            answer = json.load(r)
        text = answer["choices"][0]["message"]["content"]
        print(text)
        assert "2" in text and "3" in text
        # The README's OpenAI-client example, as written but for the port.
        example = readme_python_block("# OpenAI client").replace("http://127.0.0.1:8000", base)
        done = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "2" in done.stdout, done.stderr[-3000:]
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        drafts = [l for l in metrics.splitlines() if l.startswith("vllm:spec_decode_num_drafts")]
        assert drafts and float(drafts[0].split()[-1]) > 0, drafts
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_named_model_no_speculation_keeps_the_cpu_defaults(toy_model, tmp_path):
    """``serve MODEL --no-speculation``: vLLM gets the CPU defaults and no speculative config, says
    so in one line, and the server answers without drafting -- a seeded request whose prompt is
    prefilled in chunks too, which kills a stock vLLM 0.32 CPU engine (the plugin stays loaded for
    that fix, engine/hooks/seeded_prefill.py)."""
    server = Server("no-speculation", toy_model, None, [*TOY_ARGS, "--max-num-batched-tokens", "64"], tmp_path)
    try:
        start_all([server], seconds=300)
        for prompt, extra in (
            ("def f(x):", {"temperature": 0}),
            (list(range(5, 305)), {"temperature": 0.8, "seed": 7}),
        ):
            body = json.dumps({"model": "toy", "prompt": prompt, "max_tokens": 8, **extra}).encode()
            req = urllib.request.Request(server.base + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                assert json.load(r)["usage"]["completion_tokens"] == 8
        assert metric_total(server.metrics(), "vllm:spec_decode_num_drafts_total") == 0
    finally:
        server.stop()
    log = server.log.read_text(errors="replace").splitlines()
    (note,) = [
        line
        for line in log
        if line.startswith("vllm-lookahead serve:") and " allocator: " not in line and " OpenMP " not in line
    ]
    assert note.startswith(
        "vllm-lookahead serve: no speculative decoding (stock vLLM, with the plugin's fix for seeded chunked "
        "prefills on CPU); defaults added: --dtype float32"
    )
    assert "RuntimeError" not in "\n".join(log)
    assert any(line.startswith("vllm-lookahead serve: allocator: ") for line in log)  # and which malloc it runs on
    (command,) = [line for line in log if line.startswith("+ ")]
    assert "--speculative-config" not in command and "--no-speculation" not in command
    assert "--dtype float32" in command and "--gpu-memory-utilization 0.3" in command
