"""vLLM's own drafters on the same streams: the anchors of the host-work benchmark.

``ngram``: vLLM's ``NgramProposer`` (its numba batch path over the input batch's token array,
``v1/spec_decode/ngram_proposer.py``); ``suffix``: vLLM's ``SuffixDecodingProposer``
(ArcticInference's suffix trees; needs ``arctic-inference``).  Each is what vLLM runs on the host
between two forwards for its method (``propose``), timed per step over the same continuously
served streams as lookahead, its chain drafts verified against the recording (the rejection
sampler's work is the device's, not timed).
"""

from __future__ import annotations

import importlib.util
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.host_work.served import MAX_NUM_BATCHED_TOKENS, ServedBatch, accepted_chain
from benchmarks.host_work.streams import Stream
from benchmarks.methods import NGRAM_DEFAULTS

ANCHORS = ("ngram", "suffix")


def missing(name: str) -> str | None:
    """Why an anchor cannot run here (None: it can)."""
    if name == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        return "arctic-inference is not installed (pip install 'vllm-lookahead[suffix]')"
    return None


class AnchorReplay:
    """``batch`` requests over ``streams`` drafted by vLLM's ``name`` proposer."""

    def __init__(
        self,
        name: str,
        streams: list[Stream],
        batch: int,
        max_model_len: int,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
        forward: Any = None,
    ) -> None:
        self.name, self.batch = name, batch
        self.forward = forward  # a cost model: each step sleeps through its forward (``--device-time``)
        self.served = ServedBatch(streams, batch, max_model_len, max_num_batched_tokens=max_num_batched_tokens)
        spec = SimpleNamespace(
            num_speculative_tokens=NGRAM_DEFAULTS["num_speculative_tokens"],
            prompt_lookup_min=NGRAM_DEFAULTS["prompt_lookup_min"],
            prompt_lookup_max=NGRAM_DEFAULTS["prompt_lookup_max"],
        )
        config = SimpleNamespace(
            speculative_config=spec,
            model_config=SimpleNamespace(max_model_len=max_model_len),
            scheduler_config=SimpleNamespace(max_num_seqs=max(batch, 1024)),
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        if name == "ngram":
            from vllm.v1.spec_decode.ngram_proposer import NgramProposer

            self.k = spec.num_speculative_tokens
            self.proposer = NgramProposer(config)
        elif name == "suffix":
            from vllm.config import SpeculativeConfig
            from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

            defaults = SpeculativeConfig.__dataclass_fields__
            for key in (
                "suffix_decoding_max_tree_depth",
                "suffix_decoding_max_spec_factor",
                "suffix_decoding_min_token_prob",
                "suffix_decoding_max_cached_requests",
            ):
                setattr(spec, key, defaults[key].default)
            spec.num_speculative_tokens = spec.suffix_decoding_max_tree_depth
            self.k = spec.num_speculative_tokens
            self.proposer = SuffixDecodingProposer(config)
        else:
            raise ValueError(f"unknown anchor {name!r}: {ANCHORS}")
        self._drafts: list[list[int]] = [[] for _ in range(batch)]

    def _input_batch(self) -> SimpleNamespace:
        served = self.served
        return SimpleNamespace(
            req_ids=served.req_ids,
            req_id_to_index={r: i for i, r in enumerate(served.req_ids)},
            num_tokens_no_spec=served.num_tokens,
            num_prompt_tokens=np.array([len(s.stream.prompt) for s in served.slots]),
            token_ids_cpu=served.token_ids,
        )

    def step(self, seconds: list[float] | None) -> tuple[int, int]:
        """One step; the proposer's host time appended to ``seconds`` (None: warm-up).  Returns
        (draft tokens the step ran, tokens the decoding requests emitted)."""
        served = self.served
        outputs = []
        drafted = 0
        scheduled = served.schedule(self._drafts)
        if self.forward is not None:
            time.sleep(self.forward.forward(int(scheduled.sum())))
        for slot, draft in zip(served.slots, self._drafts):
            if slot.prefill:
                outputs.append([slot.stream.output[0]] if slot.emits else [])
            else:
                drafted += len(draft)
                outputs.append(accepted_chain(draft, slot.stream.output, slot.emitted))
        emitted = served.advance(outputs)
        batch = self._input_batch() if self.name == "suffix" else None
        t = time.perf_counter()
        if self.name == "ngram":
            drafts = self.proposer.propose(self.k, outputs, served.num_tokens, served.token_ids)
        else:
            drafts = self.proposer.propose(self.k, batch, outputs)
        if seconds is not None:
            seconds.append(time.perf_counter() - t)
        self._drafts = [list(d) for d in drafts]
        for i in served.replace_finished():
            self._drafts[i] = []
        return drafted, emitted
