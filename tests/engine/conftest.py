"""Engines run in the test process (``harness.Engine``: ~2 s to start) and are shared.

* :class:`EnginePool` (fixture ``engines``): the engine for a (model, speculative config,
  settings), kept until a test asks for another one -- one engine lives at a time
  (``harness.Engine``).  Tests read counters as deltas around their own calls.
* :class:`Baselines`: no-speculation results, computed once per (model, settings,
  prompts, params) in the pool's no-speculation engine.
* ``toy_servers``: two OpenAI servers on the toy model (lookahead and no speculation, see
  ``servers.py``) for the server tests; started on first use, stopped after the last test
  that asks for them.  ``toy_reference``: their no-speculation one while it runs, else a
  module's own.
* The test order groups the tests that share engines (``ORDER``): toy model first, then
  the bundled model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness import Engine

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


REAL_MODEL_TOKENS = 64


@pytest.fixture(scope="session")
def toy_model() -> str:
    from support.toy_model import build_toy_llama
    from vllm_lookahead.models import cache_root

    return str(build_toy_llama(Path(cache_root()) / "toy-llama"))


@pytest.fixture(scope="session")
def sharp_toy_model() -> str:
    """The toy model with a 4x sharper LM head: at temperature 1 its next token is still fairly
    predictable, so sampled drafts get accepted (the default toy is nearly flat over its tail)."""
    from support.toy_model import build_toy_llama
    from vllm_lookahead.models import cache_root

    return str(build_toy_llama(Path(cache_root()) / "toy-llama-sharp", logit_std=64.0))


@pytest.fixture(scope="session")
def real_model() -> str:
    from vllm_lookahead.models import prepare_default_model

    return str(prepare_default_model())


# Files (and, for files mixing models, test-name substrings) in the order they run.
ORDER = (
    "test_startup.py",
    "test_toy_exactness.py",
    "test_edge_cases.py",
    "test_toy_sampling_features.py",
    "test_large_batch.py",
    "test_per_request_settings.py",
    "test_sampling_stats.py::test_toy",
    "test_bench_cli.py",
    "test_metrics_server.py",  # these four share the toy servers (``toy_servers``)
    "test_bad_requests.py",
    "test_data_parallel.py",
    "test_soak.py",
    "test_tensor_parallel.py",
    "test_serve.py",
    "test_readme_examples.py",  # closes the in-process engines: between the toy and the real-model ones
    "test_real_exactness.py",
    "test_sampling_stats.py::test_real",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        where = f"{Path(str(item.fspath)).name}::{item.name}"
        for i, prefix in enumerate(ORDER):
            if where.startswith(prefix):
                return i
        return len(ORDER)

    engine_items = [it for it in items if "tests/engine" in str(it.fspath)]
    others = [it for it in items if "tests/engine" not in str(it.fspath)]
    items[:] = others + sorted(engine_items, key=rank)  # stable: file order within a group


_TOY_SERVERS: dict = {}  # name -> servers.Server while the session's toy servers run
_LAST_TOY_SERVER_USER: list[str] = []  # node id of the last selected test using them (toy_servers, toy_reference)


def pytest_collection_finish(session):
    users = [
        it.nodeid for it in session.items if {"toy_servers", "toy_reference"} & set(getattr(it, "fixturenames", ()))
    ]
    _LAST_TOY_SERVER_USER[:] = users[-1:]


def pytest_runtest_teardown(item, nextitem):
    if _LAST_TOY_SERVER_USER and item.nodeid == _LAST_TOY_SERVER_USER[0]:
        for server in _TOY_SERVERS.values():  # free their memory for the bundled model's engines
            server.stop()


@pytest.fixture(scope="session")
def toy_servers(toy_model, tmp_path_factory, engines):
    """{"lookahead": Server, "none": Server}: ``servers.TOY_SPEC`` (with per-request spec-decode
    metrics) and no speculation, same settings otherwise.  The in-process engines are closed
    first (memory: the servers take ~7 GB under the soak; no later test reuses those engines)."""
    from servers import TOY_ARGS, TOY_SPEC, Server, start_all

    engines.close_all()
    log_dir = tmp_path_factory.mktemp("toy-servers")
    servers = {
        "lookahead": Server(
            "lookahead", toy_model, TOY_SPEC, [*TOY_ARGS, "--per-request-spec-decode-metrics", "summary"], log_dir
        ),
        "none": Server("none", toy_model, None, TOY_ARGS, log_dir),
    }
    _TOY_SERVERS.update(servers)
    start_all(list(servers.values()))
    yield servers
    for server in servers.values():
        server.stop()
    _TOY_SERVERS.clear()


@pytest.fixture(scope="module")
def toy_reference(toy_model, tmp_path_factory, engines):
    """A no-speculation toy server (``servers.TOY_ARGS``) for one module: the session's
    (``toy_servers["none"]``) while it runs, else the module's own, stopped after the module (the
    in-process engines are closed first, as for the session's).  The module's own may still be
    starting: wait for it with ``servers.start_all``, with the module's other servers, which then
    start side by side."""
    from servers import TOY_ARGS, Server

    shared = _TOY_SERVERS.get("none")
    if shared is not None and shared.alive():
        yield shared
        return
    engines.close_all()
    own = Server("none", toy_model, None, TOY_ARGS, tmp_path_factory.mktemp("toy-reference"))
    try:
        yield own
    finally:
        own.stop()


class EnginePool:
    """The session's engine (see the module docstring): the one for the last key asked for."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._engine: Engine | None = None

    @staticmethod
    def key(model: str, spec: dict | None, settings: dict) -> str:
        return json.dumps([model, spec, settings], sort_keys=True, default=str)

    def get(self, model: str, spec: dict | None = None, **settings) -> Engine:
        key = self.key(model, spec, settings)
        if key != self._key or self._engine is None or self._engine.closed:
            self.close_all()
            self._engine = Engine(model, spec, **settings)
            self._key = key
        return self._engine

    def close_all(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine = self._key = None


@pytest.fixture(scope="session")
def engines():
    pool = EnginePool()
    yield pool
    pool.close_all()


class Baselines:
    """No-speculation results, computed once per (model, engine settings, prompts, params)."""

    def __init__(self, pool: EnginePool) -> None:
        self._cache: dict[tuple, list] = {}
        self.pool = pool

    @staticmethod
    def _key(model, settings, prompts, max_tokens, batch, params):
        return (model, repr(sorted(settings.items())), repr(prompts), max_tokens, batch, repr(sorted(params.items())))

    def prefetch(self, model: str, settings: dict, jobs: list[tuple]) -> None:
        """Compute every missing ``(prompts, max_tokens, batch, params)`` job in one engine."""
        missing = [j for j in jobs if self._key(model, settings, *j) not in self._cache]
        if not missing:
            return
        engine = self.pool.get(model, None, **settings)
        for prompts, max_tokens, batch, params in missing:
            key = self._key(model, settings, prompts, max_tokens, batch, params)
            self._cache[key] = engine.generate(prompts, max_tokens, batch=batch, **{"logprobs": 2, **params})

    def get(self, model: str, settings: dict, prompts: list[list[int]], max_tokens: int, batch: int, **params):
        self.prefetch(model, settings, [(prompts, max_tokens, batch, params)])
        return self._cache[self._key(model, settings, prompts, max_tokens, batch, params)]


@pytest.fixture(scope="session")
def baselines(engines) -> Baselines:
    return Baselines(engines)
