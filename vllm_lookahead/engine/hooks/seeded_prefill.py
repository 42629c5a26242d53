"""Seeded requests whose prefill is chunked, on CPU: keep vLLM's engine alive and their seed exact.

vLLM 0.32 samples a token for every request in the batch, also for one whose prompt is only
partly prefilled this step, and throws that token away.  To leave a seeded request's random
stream as if nothing had been drawn, ``GPUModelRunner._bookkeeping_sync`` then rewinds the
request's generator by four Philox offsets (``gen.set_offset(gen.get_offset() - 4)``), which
only CUDA generators have: a CPU generator raises ``RuntimeError: CPU Generator does not use
offset`` and the engine core dies, answering 500 to every request in flight.  Measured here
without speculation too (a seeded request with a 300-token prompt under
``--max-num-batched-tokens 64``); other CPU backends carry the same fix
(RBLN-SW/vllm-rbln#1025 skips the rewind).  Lookahead makes chunked prefills much more
frequent -- draft rows share the step's token budget with prefills -- so a lookahead engine
must not inherit the crash: the soak test (tests/engine/test_soak.py) hit it within a minute.

The fix, for every engine in a process where the plugin is loaded -- lookahead, vLLM's other
methods and no speculation alike, so that a comparison without speculation runs the same
traffic (patch of ``GPUModelRunner.sample_tokens``): the generators of the rows vLLM will
discard are taken out of the batch's generator table for the step and put back afterwards.
vLLM's sampler then draws the discarded row's token from the global stream (it is dropped
anyway) and the request's own generator is untouched -- exactly "as if the token was not
sampled", what vLLM's rewind does on CUDA, on any device, with no rewind to undo.  Without
speculation a seeded request's tokens are then the same whether its prefill was chunked or not,
and lookahead's, verified against vLLM's own sampler noise, are the same tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def hide_discarded_generators(runner: Any) -> dict[int, Any]:
    """Remove (and return) the per-request generators of the rows whose sampled token vLLM
    discards this step (``runner.discard_request_mask``); CPU generators only, where vLLM's
    rewind cannot run."""
    batch = runner.input_batch
    generators: dict[int, Any] = batch.generators
    if not generators:
        return {}
    num_reqs = batch.num_reqs
    hidden = {}
    for i in np.flatnonzero(runner.discard_request_mask.np[:num_reqs]):
        gen = generators.get(int(i))
        if gen is not None and gen.device.type == "cpu":
            hidden[int(i)] = generators.pop(int(i))
    return hidden


def restore_generators(runner: Any, hidden: dict[int, Any]) -> None:
    runner.input_batch.generators.update(hidden)
