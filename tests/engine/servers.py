"""OpenAI servers for the tests: ``vllm-lookahead serve`` processes on loopback ports.

:class:`Server` is one process (its log in a file, its resident memory summed over its
process tree: the API server and the engine core it spawns).  :func:`start_all` starts
several side by side and waits for each ``/health``.

The toy servers most server tests share (lookahead and no speculation, same settings) are
started once per session by the ``toy_servers`` fixture in ``conftest.py``: see
:data:`TOY_SPEC` and :data:`TOY_ARGS` for what they run.
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

import pytest

CLI = [sys.executable, "-m", "vllm_lookahead.cli"]
TOY_NAME = "toy"
TOY_MAX_MODEL_LEN = 1024
# full trees and the window on every step (W7/N5/G7, no per-step cap): the most the plugin does
TOY_SPEC = {"method": "lookahead", "max_tokens_per_step": 0}
TOY_ARGS = ["--served-model-name", TOY_NAME, "--enforce-eager", "--max-model-len", str(TOY_MAX_MODEL_LEN)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``vllm-lookahead serve`` process (``spec`` None: no speculation; ``env``: variables
    added to this process's environment)."""

    def __init__(
        self,
        name: str,
        model: str,
        spec: dict | None,
        args: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        argv = [*CLI, "serve", model, "--host", "127.0.0.1", "--port", str(self.port), *args]
        argv += ["--no-speculation"] if spec is None else ["--speculative-config", json.dumps(spec)]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **(env or {})}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def healthy(self, timeout: float = 10) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=timeout) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, deadline: float) -> None:
        while not self.healthy(timeout=2):
            if not self.alive():
                pytest.fail(f"{self.name} server exited:\n{self.tail()}")
            if time.time() > deadline:
                pytest.fail(f"{self.name} server did not come up:\n{self.tail()}")
            time.sleep(1)

    def _processes(self) -> list:
        """The server's process tree (API server, engine core, workers) as psutil processes."""
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def allocator(self) -> str:
        """The malloc the server's processes run on: one of ``vllm_lookahead.cli.ALLOCATORS`` or
        "glibc" (from their memory maps; `vllm-lookahead serve` preloads a system one on CPU)."""
        import psutil

        from vllm_lookahead.cli import ALLOCATORS

        procs = self._processes()
        try:
            maps = " ".join(m.path for p in procs for m in p.memory_maps())
        except (psutil.Error, OSError):
            return "unknown"
        if not procs:
            return "unknown"
        return next((name for name in ALLOCATORS if name in maps), "glibc")

    def rss_bytes(self) -> int:
        """Resident memory of the server's process tree (API server + engine core)."""
        import psutil

        total = 0
        for p in self._processes():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def metrics(self) -> dict[str, float]:
        return scrape(self.base)

    def stop(self) -> None:
        stop_process(self.proc)


def scrape(base: str) -> dict[str, float]:
    """``/metrics`` of the server at ``base`` as {series (name + labels): value}."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate, wait up to a minute, then kill."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_all(servers: list[Server], seconds: float = 600) -> None:
    """Wait for servers started together (stopping them all if one fails)."""
    deadline = time.time() + seconds
    try:
        for server in servers:
            server.wait_ready(deadline)
    except BaseException:
        for server in servers:
            server.stop()
        raise


def metric_total(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of a metric's series whose labels include ``labels``."""
    s = 0.0
    for series, value in metrics.items():
        if series.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            s += value
    return s
