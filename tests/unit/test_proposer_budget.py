"""The proposer's per-request draft budget from the step cap (engine/proposer.py)."""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm_lookahead.engine.proposer import LookaheadProposer  # noqa: E402


def _proposer(device: str, **keys) -> LookaheadProposer:
    cfg = SimpleNamespace(
        additional_config={"lookahead": keys},
        model_config=SimpleNamespace(max_model_len=4096),
        device_config=SimpleNamespace(device_type=device),
    )
    return LookaheadProposer(cfg)


def test_auto_on_cpu_is_one_chain_per_request_within_24_tokens():
    p = _proposer("cpu")  # W7 N5 G7, max_tokens_per_step "auto"
    assert [p._budget_per_request(n) for n in (1, 2, 4, 5, 8, 32)] == [4, 4, 4, 3, 2, 0]


def test_auto_elsewhere_and_explicit_caps():
    assert _proposer("cuda")._budget_per_request(8) is None
    assert _proposer("cpu", max_tokens_per_step=0)._budget_per_request(8) is None
    capped = _proposer("cpu", max_tokens_per_step=40)
    assert [capped._budget_per_request(n) for n in (1, 8, 40, 41)] == [39, 4, 0, 0]
