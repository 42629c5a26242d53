"""One method's OpenAI server for the serving benchmark: ``vllm-lookahead serve`` as a user runs it.

Every method gets the same model, the same serve arguments and the same environment
(:func:`benchmarks.engine_env.engine_env`); only its speculation differs: ``--no-speculation``,
a ``--speculative-config`` (vLLM's ngram or suffix, or lookahead), and for a lookahead method's
ablation keys vLLM's ``--additional-config``.  The server's log is kept beside the results.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.engine_env import engine_env
from benchmarks.methods import Method, engine_arguments

# vLLM's per-request histograms that split a request's time to first token on the server:
# arrival to first token (API server); queued, from the scheduler taking it (between two steps:
# the step in progress when it arrived is not in it) to its first scheduled step; and prefill,
# from that step's start to its first token.
SERVER_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
)


def histogram_totals(text: str, names: tuple[str, ...] = SERVER_HISTOGRAMS) -> dict[str, tuple[float, float]]:
    """(sum, count) of each histogram ``names`` in a Prometheus text exposition, over its label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {name: [0.0, 0.0] for name in names}
    for family in text_string_to_metric_families(text):
        if family.name not in totals:
            continue
        for sample in family.samples:
            if sample.name == family.name + "_sum":
                totals[family.name][0] += sample.value
            elif sample.name == family.name + "_count":
                totals[family.name][1] += sample.value
    return {name: (s, c) for name, (s, c) in totals.items()}


def histogram_means_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float | None]:
    """Each histogram's mean (ms) over the observations between two :func:`histogram_totals`."""
    means: dict[str, float | None] = {}
    for name, (s1, c1) in after.items():
        s0, c0 = before.get(name, (0.0, 0.0))
        means[name] = 1e3 * (s1 - s0) / (c1 - c0) if c1 > c0 else None
    return means


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def speculation_args(method: Method) -> list[str]:
    """The serve arguments that choose ``method``'s speculation."""
    if method.speculative_config is None:
        return ["--no-speculation"]
    args = engine_arguments(method.speculative_config)
    out = ["--speculative-config", json.dumps(args["speculative_config"])]
    if "additional_config" in args:
        out += ["--additional-config", json.dumps(args["additional_config"])]
    return out


class Server:
    """``vllm-lookahead serve MODEL ARGS`` on a free port, until :meth:`stop`."""

    def __init__(
        self, method: Method, model: str, serve_args: list[str], log_path: Path, inherit_malloc: bool = False
    ) -> None:
        self.method = method
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env, self.allocator = engine_env(os.environ, inherit_malloc)
        cmd = [
            sys.executable,
            "-m",
            "vllm_lookahead.cli",
            "serve",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *serve_args,
            *speculation_args(method),
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")  # open while the server runs
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self, timeout: float = 900.0) -> float:
        """Seconds until ``/health`` answers; raises with the log's tail if the server exits or
        never answers."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.method.label}: server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2):
                    return time.monotonic() - start
            except OSError:
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.method.label}: no answer on {self.base}/health in {timeout:.0f} s:\n{self.tail()}")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
            return r.read().decode()

    def histogram_totals(self) -> dict[str, tuple[float, float]]:
        """Each of :data:`SERVER_HISTOGRAMS`' (sum, count) now, summed over label sets."""
        return histogram_totals(self.metrics())

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the API server, which shuts its engine down; anything of the server's session
        still there a minute later is killed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, 9)  # an engine process its server left behind
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self._log.close()
