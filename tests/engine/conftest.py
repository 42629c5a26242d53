"""Engines are expensive (~40 s each on this machine): one baseline run per engine
setting is cached for the whole session and at most one engine is alive at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import Engine

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

REAL_MODEL_TOKENS = 64


@pytest.fixture(scope="session")
def toy_model() -> str:
    from vllm_lookahead.models import cache_root
    from vllm_lookahead.testing.toy_model import build_toy_llama

    return str(build_toy_llama(Path(cache_root()) / "toy-llama"))


@pytest.fixture(scope="session")
def real_model() -> str:
    from vllm_lookahead.models import prepare_default_model

    return str(prepare_default_model())


class Baselines:
    """No-speculation results, computed once per (model, engine settings, prompts, params)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, list] = {}

    @staticmethod
    def _key(model, settings, prompts, max_tokens, batch, params):
        return (model, repr(sorted(settings.items())), repr(prompts), max_tokens, batch, repr(sorted(params.items())))

    def prefetch(self, model: str, settings: dict, jobs: list[tuple]) -> None:
        """Compute every missing ``(prompts, max_tokens, batch, params)`` job in one engine."""
        missing = [j for j in jobs if self._key(model, settings, *j) not in self._cache]
        if not missing:
            return
        engine = Engine(model, None, **settings)
        try:
            for prompts, max_tokens, batch, params in missing:
                key = self._key(model, settings, prompts, max_tokens, batch, params)
                self._cache[key] = engine.generate(prompts, max_tokens, batch=batch, logprobs=2, **params)
        finally:
            engine.close()

    def get(self, model: str, settings: dict, prompts: list[list[int]], max_tokens: int, batch: int, **params):
        self.prefetch(model, settings, [(prompts, max_tokens, batch, params)])
        return self._cache[self._key(model, settings, prompts, max_tokens, batch, params)]


@pytest.fixture(scope="session")
def baselines() -> Baselines:
    return Baselines()
