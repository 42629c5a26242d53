"""Part ``sampling`` of the GPU check: what verifying a random request's tree costs on the GPU,
coupled to vLLM's sampler noise, against vLLM's own sampling of one token per request.

vLLM's ``random_sample`` (``v1/sample/ops/topk_topp_sampler.py``, taken on CUDA whenever a request
has a generator) draws a seeded request's token as ``argmax(p / q)`` with ``q`` one vocabulary-sized
``exponential_`` from the request's generator per token.  The plugin's coupled walk
(:func:`vllm_lookahead.core.sampling.coupled_walk`, ``engine/step/verification.py``) does the same at
each node it reaches: temperature and top-k/top-p on that node's row, softmax, the next noise
vector of the generator, the argmax -- read back to the host before the walk can choose the next
node, so one host synchronisation per emitted token.  Timed here, per vocabulary:

* ``vllm_b<B>`` -- vLLM's sampling step for ``B`` seeded requests (rows ``[B, V]``: temperature,
  top-k/top-p, softmax, one ``exponential_`` per row with its generator, argmax, read back once);
* ``walk_k<k>`` -- the coupled walk as the plugin runs it, emitting ``k`` tokens of one request
  (``k`` single-row passes, each read back);
* ``ahead_n<n>_d<D>`` -- the same decisions drawn ahead: every logit row of the tree (``n``) through
  temperature/top-k/top-p/softmax at once, ``D`` noise rows drawn back to back from the generator
  (its state kept after each draw, so it can be set back to just after the tokens emitted), each
  node's token ``argmax(p_node / q_depth(node))`` in one op, read back once;
* ``level_r<R>_d<L>`` -- the walk of ``R`` requests taken level by level for ``L`` levels: per level
  the requests' current rows in one batched pass, one noise draw per request, one read-back;
* ``walks_r<R>_d<L>`` / ``walks_seeded_r<R>_d<L>`` -- the same walk as the engine takes it
  (``engine/step/verification.py``, ``SamplerNoise.sample_rows``): per level one gather of the
  rows reached from the kept rows, each row's own temperature / top-k / top-p as tensors over
  the rows, then (``seeded``: every request has a generator) the noise as vLLM's
  ``random_sample`` draws it, a row per request from its own generator, or (no request has one)
  each row by the inverse CDF (``sampler_noise.inverse_cdf``) -- one read-back per level;
* ``walks_ahead_r<R>_d<L>`` -- the walks without seeds as the engine mostly takes them
  (``verification._ahead``): the rows of all ``L`` levels (the nodes reached through the
  target's argmax) gathered and sampled by the inverse CDF in one pass, one read-back;
* ``noise_torch_r<R>`` / ``noise_fused_r<R>`` -- the noise of ``R`` seeded rows: ``R``
  ``exponential_`` calls, or one launch of the exponential-noise kernel
  (``kernels/exponential_noise.py``: torch's Philox counters computed in the kernel, each
  generator's offset advanced on the host);
* ``fused_seeded_r<R>_d<L>`` -- ``walks_seeded`` with that kernel's noise, as the engine draws
  seeded rows on a GPU (one launch per level for them all).

Each with top-k 50 / top-p 0.9 (vLLM's sort path) and with temperature only.  Exactness on the
device: noise drawn into the rows of a ``[D, V]`` buffer equals ``D`` fresh single-row draws of the
same generator (what drawing ahead needs), a generator set back to the state kept after ``k`` draws
draws row ``k`` again, and the drawn-ahead tokens equal the walk's; also recorded (not required):
whether one ``exponential_`` over ``[D, V]`` equals ``D`` row draws; and that the engine's batched
walk (per-row temperature and top-k/top-p tensors) emits the tokens of one walk per request
(scalar settings, one row at a time); and, on a GPU, whether the exponential-noise kernel's rows
equal torch's ``exponential_`` bit for bit and its walk the walks.  The top-k/top-p here is a
torch rendering of vLLM's sort-based ``apply_top_k_top_p`` (same ops, for cost; this part imports
no vLLM).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.gpu.fixtures import cell, md_table, synchronize
from vllm_lookahead.engine.step.sampler_noise import inverse_cdf
from vllm_lookahead.kernels.exponential_noise import exponential_rows, matches_torch, take_offsets

if TYPE_CHECKING:
    from benchmarks.gpu.record import Part, Settings

TOP_K, TOP_P, TEMPERATURE = 50, 0.9, 0.8


def top_k_top_p(logits: torch.Tensor, k: int | torch.Tensor | None, p: float | torch.Tensor | None) -> torch.Tensor:
    """Rows of ``logits`` with entries outside the top ``k`` / nucleus ``p`` (one for every row,
    or a tensor of one per row) set to -inf, by vLLM's sort path (ascending sort, threshold at
    ``V - k``, cumulative softmax, scatter back)."""
    if k is None and p is None:
        return logits
    rows, vocab = logits.shape
    sorted_logits, index = logits.sort(dim=-1, descending=False)
    if k is not None:
        k = torch.as_tensor(k, device=logits.device).expand(rows)
        threshold = sorted_logits.gather(-1, (vocab - k.long()).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < threshold, -float("inf"))
    if p is not None:
        p = torch.as_tensor(p, device=logits.device, dtype=torch.float32).expand(rows)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        mask = cumulative <= 1 - p.unsqueeze(1)
        mask[:, -1] = False
        sorted_logits.masked_fill_(mask, -float("inf"))
    return logits.scatter(-1, index, sorted_logits)


def probabilities(logits: torch.Tensor, filtered: bool) -> torch.Tensor:
    out = logits.div(TEMPERATURE)
    out = top_k_top_p(out, TOP_K, TOP_P) if filtered else out
    return out.softmax(dim=-1, dtype=torch.float32)


@dataclass(frozen=True)
class RowSettings:
    """Per-row sampling settings as tensors on the device (vLLM's ``SamplingMetadata`` rows)."""

    temperature: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None

    @classmethod
    def uniform(cls, rows: int, filtered: bool, device: torch.device) -> RowSettings:
        full = lambda value, dtype: torch.full((rows,), value, dtype=dtype, device=device)  # noqa: E731
        return cls(
            full(TEMPERATURE, torch.float32),
            full(TOP_K, torch.int32) if filtered else None,
            full(TOP_P, torch.float32) if filtered else None,
        )

    def of(self, index: torch.Tensor) -> RowSettings:
        pick = lambda t: None if t is None else t.index_select(0, index)  # noqa: E731
        return RowSettings(pick(self.temperature), pick(self.top_k), pick(self.top_p))


def batched_walk(
    kept: torch.Tensor,
    reached: list[torch.Tensor],
    settings: RowSettings,
    generators: list[torch.Generator | None],
    fused: bool = False,
) -> list[list[int]]:
    """The step's walks as the engine takes them: per level, the rows reached (indices into
    ``kept``, ``[rows, V]``; row ``i`` of level ``l`` belongs to request ``i``) gathered, each row's
    temperature / top-k / top-p, then either (no row has a generator) each row's token by the
    inverse CDF (``sampler_noise.inverse_cdf``) or (every row has one) softmax, each row's
    ``random_sample`` noise from its generator (``fused``: in one launch of the exponential-noise
    kernel, as the engine draws it on a GPU) and the argmax of every row; one read-back."""
    tokens = []
    for index in reached:
        mine = settings.of(torch.arange(len(index), device=kept.device))
        logits = top_k_top_p(kept.index_select(0, index).div_(mine.temperature.unsqueeze(1)), mine.top_k, mine.top_p)
        if all(g is None for g in generators):  # no seeds: the inverse CDF, as the engine samples such rows
            tokens.append(inverse_cdf(logits).tolist())
            continue
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        q = torch.empty_like(probs)
        seeded = [i for i, g in enumerate(generators) if g is not None]
        if fused:
            rows = torch.tensor(seeded).to(q.device, non_blocking=True)
            exponential_rows(q, rows, *take_offsets([generators[i] for i in seeded], q.device))
        else:
            for i in seeded:
                q[i].exponential_(generator=generators[i])
        tokens.append(probs.div_(q).argmax(dim=-1).tolist())
    return tokens


def vllm_step(logits: torch.Tensor, generators: list[torch.Generator], filtered: bool) -> list[int]:
    """vLLM's ``random_sample`` for rows that each have a generator, read back once."""
    probs = probabilities(logits, filtered)
    q = torch.empty_like(probs)
    for i, generator in enumerate(generators):
        q[i].exponential_(generator=generator)
    return probs.div_(q).argmax(dim=-1).tolist()


def walk(rows: torch.Tensor, generator: torch.Generator, filtered: bool) -> list[int]:
    """The coupled walk along ``rows`` (one per emitted token): one row, one noise draw, one read-back each."""
    tokens = []
    for j in range(rows.shape[0]):
        probs = probabilities(rows[j : j + 1], filtered)
        q = torch.empty_like(probs)
        q[0].exponential_(generator=generator)
        tokens.append(int(probs.div_(q).argmax(dim=-1)[0]))
    return tokens


def ahead(
    rows: torch.Tensor, depths: torch.Tensor, levels: int, generator: torch.Generator, filtered: bool
) -> tuple[list[int], list[Any]]:
    """Every row's token with its depth's noise, drawn ahead: (tokens, generator state after each draw)."""
    probs = probabilities(rows, filtered)
    q = torch.empty((levels, rows.shape[1]), dtype=probs.dtype, device=rows.device)
    states = []
    for d in range(levels):
        q[d].exponential_(generator=generator)
        states.append(generator.get_state())
    return probs.div_(q.index_select(0, depths)).argmax(dim=-1).tolist(), states


def level_walk(rows: torch.Tensor, generators: list[torch.Generator], filtered: bool) -> list[list[int]]:
    """The coupled walk of ``len(generators)`` requests level by level (``rows``: ``[levels, R, V]``):
    per level one batched pass over the requests' current rows, one noise draw per request, one read-back."""
    tokens = []
    for level in rows:
        probs = probabilities(level, filtered)
        q = torch.empty_like(probs)
        for i, g in enumerate(generators):
            q[i].exponential_(generator=g)
        tokens.append(probs.div_(q).argmax(dim=-1).tolist())
    return tokens


def seconds(fn: Callable[[], object], device: torch.device, calls: int, samples_taken: int = 5) -> float:
    """Median wall seconds per call (host synchronisation included: what a verification step waits)."""
    for _ in range(2):
        fn()
    synchronize(device)
    samples = []
    for _ in range(samples_taken):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def check_exactness(vocab: int, device: torch.device, levels: int = 5) -> dict[str, Any]:
    """The facts drawing ahead rests on, checked on this device for one vocabulary."""
    fresh = [
        torch.empty(vocab, device=device).exponential_(generator=g)
        for g in [generator(device, 7)]
        for _ in range(levels)
    ]
    g = generator(device, 7)
    buffer = torch.empty((levels, vocab), device=device)
    states = []
    for d in range(levels):
        buffer[d].exponential_(generator=g)
        states.append(g.get_state())
    rows_equal = all(torch.equal(buffer[d], fresh[d]) for d in range(levels))
    g.set_state(states[1])
    restored = torch.equal(torch.empty(vocab, device=device).exponential_(generator=g), fresh[2])
    one_call = torch.empty((levels, vocab), device=device).exponential_(generator=generator(device, 7))
    one_call_equal = all(torch.equal(one_call[d], fresh[d]) for d in range(levels))
    rows = torch.randn((levels, vocab), device=device, generator=generator(device, 3)) * 4
    tokens_walk = walk(rows, generator(device, 11), True)
    tokens_ahead, _ = ahead(rows, torch.arange(levels, device=device), levels, generator(device, 11), True)
    requests = 6
    kept = torch.randn((levels * requests, vocab), device=device, generator=generator(device, 4)) * 4
    reached = [torch.arange(requests, device=device) + level * requests for level in range(levels)]
    batched = batched_walk(
        kept, reached, RowSettings.uniform(requests, True, device), [generator(device, 20 + i) for i in range(requests)]
    )
    one_by_one = [walk(kept[i::requests], generator(device, 20 + i), True) for i in range(requests)]
    return {
        "vocab": vocab,
        "row_draws_equal_fresh_draws": rows_equal,
        "state_set_back_redraws": restored,
        "ahead_tokens_equal_walk": tokens_ahead == tokens_walk,
        "one_call_equals_row_draws": one_call_equal,
        "batched_walk_equals_walks": [list(t) for t in zip(*batched)] == one_by_one,
        **fused_noise_exactness(vocab, device, kept, reached, one_by_one),
    }


def fused_noise_exactness(
    vocab: int, device: torch.device, kept: torch.Tensor, reached: list[torch.Tensor], walks: list[list[int]]
) -> dict[str, bool]:
    """The exponential-noise kernel's rows equal torch's ``exponential_`` bit for bit (generators'
    offsets included), and the batched walk with it emits the walks' tokens.  GPU only (the
    interpreter has no libdevice)."""
    if device.type != "cuda":
        return {}
    requests = len(walks)
    gens = [generator(device, 20 + i) for i in range(requests)]
    fused = batched_walk(kept, reached, RowSettings.uniform(requests, True, device), gens, fused=True)
    return {
        "fused_noise_bits_equal": matches_torch(vocab, device),
        "fused_walk_equals_walks": [list(t) for t in zip(*fused)] == walks,
    }


def measure(vocab: int, name: str, filtered: bool, device: torch.device, smoke: bool) -> dict[str, Any]:
    kind, _, rest = name.partition("_")
    rng = generator(device, 5)
    if kind == "vllm":
        batch = int(rest[1:])
        logits = torch.randn((batch, vocab), device=device, generator=rng) * 4
        gens = [generator(device, i) for i in range(batch)]
        fn: Callable[[], object] = lambda: vllm_step(logits, gens, filtered)
    elif kind == "walk":
        rows = torch.randn((int(rest[1:]), vocab), device=device, generator=rng) * 4
        g = generator(device, 1)
        fn = lambda: walk(rows, g, filtered)
    elif kind == "walks":  # walks[_seeded|_ahead]_r<R>_d<L>
        seeded, drawn_ahead = rest.startswith("seeded_"), rest.startswith("ahead_")
        requests, levels = (int(part[1:]) for part in rest.split("_")[-2:])
        kept = torch.randn((levels * requests, vocab), device=device, generator=rng) * 4
        reached = [torch.arange(requests, device=device) + level * requests for level in range(levels)]
        if drawn_ahead:  # every level's rows in one pass
            reached, requests = [torch.cat(reached)], levels * requests
        row_settings = RowSettings.uniform(requests, filtered, device)
        gens = [generator(device, i) if seeded else None for i in range(requests)]
        fn = lambda: batched_walk(kept, reached, row_settings, gens)
    elif kind == "noise":  # noise_<torch|fused>_r<R>: R seeded rows' noise, R calls or one launch
        how, requests = rest.split("_")
        q = torch.empty((int(requests[1:]), vocab), device=device)
        gens = [generator(device, i) for i in range(q.shape[0])]
        every_row = torch.arange(q.shape[0], device=device)

        def fn() -> object:
            if how == "torch":
                for i, g in enumerate(gens):
                    q[i].exponential_(generator=g)
            else:
                exponential_rows(q, every_row, *take_offsets(gens, device))
            return q[0, 0].item()

    elif kind == "fused":  # fused_seeded_r<R>_d<L>: walks_seeded with the seeded rows in one launch
        requests, levels = (int(part[1:]) for part in rest.removeprefix("seeded_").split("_"))
        kept = torch.randn((levels * requests, vocab), device=device, generator=rng) * 4
        reached = [torch.arange(requests, device=device) + level * requests for level in range(levels)]
        row_settings = RowSettings.uniform(requests, filtered, device)
        gens = [generator(device, i) for i in range(requests)]
        fn = lambda: batched_walk(kept, reached, row_settings, gens, fused=True)
    elif kind == "level":
        requests, levels = (int(part[1:]) for part in rest.split("_"))
        rows = torch.randn((levels, requests, vocab), device=device, generator=rng) * 4
        gens = [generator(device, i) for i in range(requests)]
        fn = lambda: level_walk(rows, gens, filtered)
    else:
        n, levels = (int(part[1:]) for part in rest.split("_"))
        rows = torch.randn((n, vocab), device=device, generator=rng) * 4
        depths = torch.arange(n, device=device) % levels
        g = generator(device, 1)
        fn = lambda: ahead(rows, depths, levels, g, filtered)
    calls = (1, 1) if smoke else (20, 5)
    return {"vocab": vocab, "case": name, "top_k_top_p": filtered, "seconds": seconds(fn, device, *calls)}


def cases(smoke: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if smoke:  # every kind of case once, small
        return (4096,), (
            "vllm_b1",
            "walk_k2",
            "ahead_n8_d4",
            "level_r8_d2",
            "walks_r8_d2",
            "walks_ahead_r8_d2",
            "walks_seeded_r8_d2",
        )
    vocabs = (49152, 128256)
    names = (
        "vllm_b1",
        "vllm_b32",
        "walk_k1",
        "walk_k2",
        "walk_k4",
        "ahead_n8_d4",
        "ahead_n16_d5",
        "ahead_n32_d5",
        "level_r8_d2",
        "level_r32_d2",
        "walks_r8_d2",
        "walks_r32_d2",
        "walks_r32_d4",
        "walks_ahead_r32_d2",
        "walks_ahead_r32_d4",
        "walks_seeded_r32_d2",
        "walks_r128_d2",
        "walks_r256_d2",
        "noise_torch_r32",
        "noise_fused_r32",
        "fused_seeded_r32_d2",
    )
    return vocabs, names


def run(settings: Settings, part: Part) -> None:
    """Exactness per vocabulary, then every case with and without top-k/top-p."""
    vocabs, names = cases(settings.smoke)
    device = settings.device
    for vocab in vocabs:
        part.record(
            "exactness",
            {"vocab": vocab},
            lambda v=vocab: check_exactness(v, device),
            lambda r: "exactness " + ", ".join(f"{k}={v}" for k, v in r.items()),
        )
    for vocab in vocabs:
        for filtered in (True, False):
            for name in names:
                part.record(
                    "cost",
                    {"vocab": vocab, "case": name, "top_k_top_p": filtered},
                    lambda v=vocab, n=name, f=filtered: measure(v, n, f, device, settings.smoke),
                    lambda r: f"V={r['vocab']} {r['case']} top-k/p={r['top_k_top_p']}: {r['seconds'] * 1e6:.1f} us",
                )


def markdown(data: dict[str, Any]) -> list[str]:
    """The exactness facts and the cost table (us per call) by vocabulary and filtering."""
    tables = data.get("tables", {})
    lines = ["### Exactness of drawing the noise ahead", ""]
    facts = tables.get("exactness", [])
    if facts:
        keys = [k for k in facts[0] if k != "vocab"]
        lines += md_table(
            facts, [("vocab", lambda r: str(r["vocab"]))] + [(k, lambda r, k=k: cell(r, k)) for k in keys]
        ) + [""]
    rows = tables.get("cost", [])
    lines += ["### Verification cost of a random request, us per call (host read-back included)", ""]
    by = {(r["vocab"], r["top_k_top_p"], r["case"]): r["seconds"] for r in rows}
    names = list(dict.fromkeys(r["case"] for r in rows))
    table = [
        {"vocab": v, "filtered": f, **{n: by.get((v, f, n)) for n in names}}
        for v, f in dict.fromkeys((r["vocab"], r["top_k_top_p"]) for r in rows)
    ]
    columns = [("vocab", lambda r: str(r["vocab"])), ("top-k/p", lambda r: "yes" if r["filtered"] else "no")]
    columns += [(n, lambda r, n=n: cell(r, n, 1e6)) for n in names]
    return lines + md_table(table, columns) + [""]
