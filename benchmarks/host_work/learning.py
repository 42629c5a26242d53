"""``python -m benchmarks.host_work.learning``: a request's pools learning its output, alone.

Every recorded stream gets a request's pools (:class:`~vllm_lookahead.core.request_text.RequestText`,
the shipped config, its prompt indexed) and catches up on its output ``--chunk`` tokens at a time,
the streams in turn -- as the engine's requests do when they propose again after a rest -- with
the garbage collector off (:mod:`benchmarks.host_work` times it apart).  Prints microseconds per
learnt token (min and median of ``--rounds``, each over fresh pools): the part of a step's host
work that grows with the tokens the batch emits, which no draft rule can skip without learning less.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import numpy as np

from benchmarks.host_work.streams import RECORDING, Stream, recorded_streams


def learning_us_per_token(streams: list[Stream], chunk: int, rounds: int) -> list[float]:
    """Microseconds per output token of catching every stream's pools up, ``chunk`` tokens at a
    time, one figure per round."""
    from vllm_lookahead.config import LookaheadConfig
    from vllm_lookahead.core.request_text import RequestText

    config = LookaheadConfig()
    longest = max(len(s.output) for s in streams)
    figures = []
    for _ in range(rounds):
        texts = [RequestText(config, s.prompt) for s in streams]
        histories = [list(s.prompt) for s in streams]
        tokens, seconds = 0, 0.0
        gc.collect()
        gc.disable()
        try:
            for position in range(0, longest, chunk):
                for stream, text, history in zip(streams, texts, histories):
                    new = stream.output[position : position + chunk]
                    if not new:
                        continue
                    history.extend(new)
                    t = time.perf_counter()
                    text.catch_up(history)
                    seconds += time.perf_counter() - t
                    tokens += len(new)
        finally:
            gc.enable()
        assert all(text.known == len(history) for text, history in zip(texts, histories))
        figures.append(1e6 * seconds / max(1, tokens))
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--chunk", type=int, default=21, help="tokens learnt per catch-up")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--recording", type=Path, default=RECORDING)
    args = p.parse_args(argv)
    streams = recorded_streams(args.recording)
    figures = learning_us_per_token(streams, args.chunk, args.rounds)
    print(
        f"{len(streams)} streams, catch-ups of {args.chunk} tokens: {min(figures):.2f} us per token "
        f"(min of {args.rounds} rounds), median {float(np.median(figures)):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
