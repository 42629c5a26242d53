"""What verifying one emitted token of a random request costs on the host, per rule.

Per emitted token (one tree depth the walk reaches), at vocabulary sizes of the bundled model
(49,152) and of Llama 3 (128,256), median of 200 repetitions, one thread:

* coupled, splitmix -- vLLM's CPU sampler noise: one seed from the request's generator and
  ``fused_gumbel_argmax`` over the row (engine/sampler_noise.py);
* coupled, exponential -- ``random_sample``'s noise (vLLM's CUDA path for seeded requests,
  timed here on the CPU): a vocabulary-sized ``exponential_`` draw, softmax, ``argmax(p / q)``;
* SpecInfer -- the rule it replaces for random requests: softmax, a float64 copy to numpy,
  one uniform, the acceptance test (``r[x] / sum(r)``) and, when the draft is rejected, an
  inverse-CDF residual sample (``cumsum``).

Run: ``.venv/bin/python docs/bench/2026-11-26-sampler-noise/noise_cost.py``
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
import vllm._custom_ops  # noqa: F401  (registers the CPU ops, fused_gumbel_argmax among them)

from vllm_lookahead.core.sampling import sample_from
from vllm_lookahead.engine.sampler_noise import SamplerNoise


def timed(fn, repeats: int = 200) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    rows = ["| vocabulary | coupled, splitmix (µs) | coupled, exponential (µs) | SpecInfer, accept (µs) | SpecInfer, reject + residual (µs) |",
            "|---|---|---|---|---|"]
    for vocab in (49_152, 128_256):
        logits = torch.randn(1, vocab) * 3
        splitmix, exponential = SamplerNoise("splitmix"), SamplerNoise("exponential")

        def specinfer(reject: bool) -> None:
            p = logits.softmax(dim=-1, dtype=torch.float32)[0].to(torch.float64).numpy()
            r = p.copy()
            total = float(r.sum())
            x = int(np.argmax(r))
            u = float(torch.rand(1, generator=generator, dtype=torch.float64))
            if reject or u * total >= r[x]:
                r[x] = 0.0
                sample_from(r, total - p[x], float(torch.rand(1, generator=generator, dtype=torch.float64)))

        cells = [timed(lambda: splitmix.sample(logits, generator)), timed(lambda: exponential.sample(logits, generator)),
                 timed(lambda: specinfer(False)), timed(lambda: specinfer(True))]
        rows.append(f"| {vocab:,} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
