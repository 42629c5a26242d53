"""Requests served continuously over recorded streams: the batch every host-work replay steps.

``batch`` slots, each holding one request; a request that has emitted its whole recorded output
ends and the next stream takes its slot.  Its prompt is computed in chunks within the step's token
budget, as vLLM's scheduler does with chunked prefill: the decoding requests' tokens (one each,
plus their drafts) come first, then the prefilling requests' chunks in slot order; the step that
computes a prompt's last chunk emits its first token (the first step admits every prompt whole:
the batch as it stands before measuring).  The token history of every slot lives in one
``[batch, max_model_len]`` array, as in vLLM's input batch, which both lookahead's proposer and
vLLM's ``ngram`` proposer read.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from benchmarks.host_work.streams import Stream

# vLLM's max_num_batched_tokens for `vllm serve` on an H100 or H200 (engine/arg_utils.py)
MAX_NUM_BATCHED_TOKENS = 8192


@dataclass
class Slot:
    stream: Stream
    req_id: str
    emitted: int = 0  # output tokens served so far
    prefill: bool = True  # its prompt is not computed yet (or its first token not emitted)
    computed: int = 0  # prompt tokens computed
    chunk: int = 0  # prompt tokens this step computes

    @property
    def emits(self) -> bool:
        """Whether this step emits a token for it (it decodes, or its prompt's last chunk runs)."""
        return not self.prefill or self.computed + self.chunk == len(self.stream.prompt)


class ServedBatch:
    def __init__(
        self,
        streams: list[Stream],
        batch: int,
        max_model_len: int,
        sampling_params: object = None,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
        follows_recording: bool = True,
    ) -> None:
        self.streams, self.max_model_len, self._params = streams, max_model_len, sampling_params
        self.budget = max_num_batched_tokens
        self.follows_recording = follows_recording  # emitted tokens checked against it (greedy)
        self._scheduled = False  # whether a step has been scheduled (the first admits every prompt whole)
        self.requests: dict[str, SimpleNamespace] = {}  # vLLM's per-request states, as the runner keeps them
        self.token_ids = np.zeros((batch, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(batch, dtype=np.int32)
        self._next_stream = self._next_id = 0
        self.finished: set[str] = set()  # request ids that ended at the last step
        self.admitted: list[SimpleNamespace] = []  # requests admitted since the last schedule (vLLM's NewRequestData)
        self.scheduled_new: list[SimpleNamespace] = []  # those the last schedule ran first (scheduled_new_reqs)
        self.slots = [self._admit(i) for i in range(batch)]

    @property
    def req_ids(self) -> list[str]:
        return [s.req_id for s in self.slots]

    def _admit(self, i: int) -> Slot:
        stream = self.streams[self._next_stream % len(self.streams)]
        self._next_stream += 1
        # the recording's own tuple where it fits (a tuple's full slice is itself): the engine holds
        # a new request's prompt as one list, and a copy here would be the collector's to scan too
        kept = stream.prompt[-(self.max_model_len - len(stream.output) - 1) :]
        prompt = list(kept)
        slot = Slot(Stream(kept, stream.output), f"r{self._next_id}")
        self._next_id += 1
        self.requests[slot.req_id] = SimpleNamespace(
            prompt_token_ids=prompt, sampling_params=self._params, output_token_ids=[]
        )
        self.admitted.append(SimpleNamespace(req_id=slot.req_id, prompt_token_ids=prompt, sampling_params=self._params))
        self.token_ids[i, : len(prompt)] = prompt
        self.num_tokens[i] = len(prompt)
        return slot

    def schedule(self, drafts: list[list[int]]) -> np.ndarray:
        """This step's tokens per slot: each decoding request's token and draft, then prompt chunks
        in slot order within the token budget (see the module docstring)."""
        self.scheduled_new, self.admitted = self.admitted, []
        scheduled = np.array([0 if s.prefill else 1 + len(d) for s, d in zip(self.slots, drafts)], dtype=np.int32)
        left = self.budget - int(scheduled.sum()) if self._scheduled else 1 << 62
        self._scheduled = True
        for i, slot in enumerate(self.slots):
            if slot.prefill:
                slot.chunk = max(0, min(len(slot.stream.prompt) - slot.computed, left))
                left -= slot.chunk
                scheduled[i] = slot.chunk
        return scheduled

    def next_tokens(self) -> list[int]:
        """Each request's next recorded token: what vLLM samples at its root (or after its prefill)."""
        return [s.stream.output[s.emitted] for s in self.slots]

    def advance(self, outputs: list[list[int]]) -> int:
        """Every request's emitted tokens appended, cut where its recording ends and (greedy)
        checked against it (``outputs`` is cut in place); the tokens the decoding requests emitted."""
        emitted = 0
        for i, (slot, tokens) in enumerate(zip(self.slots, outputs)):
            text = slot.stream.output
            tokens = tokens[: len(text) - slot.emitted]
            want = list(text[slot.emitted : slot.emitted + len(tokens)])
            if self.follows_recording and tokens != want:
                raise AssertionError(f"{slot.req_id}: emitted {tokens}, the recording says {want}")
            if not slot.prefill:
                emitted += len(tokens)
            elif not slot.emits:
                if tokens:
                    raise AssertionError(f"{slot.req_id}: emitted {tokens} before its prompt was computed")
                slot.computed += slot.chunk
                continue
            start = int(self.num_tokens[i])
            self.token_ids[i, start : start + len(tokens)] = tokens
            self.num_tokens[i] = start + len(tokens)
            self.requests[slot.req_id].output_token_ids.extend(tokens)
            slot.emitted += len(tokens)
            slot.computed, slot.prefill = len(slot.stream.prompt), False
            outputs[i] = tokens
        return emitted

    def replace_finished(self) -> list[int]:
        """Requests whose recording is fully emitted end; the next streams take their slots.
        Returns the slots that changed hands."""
        self.finished = set()
        replaced = []
        for i, slot in enumerate(self.slots):
            if slot.emitted >= len(slot.stream.output):
                self.finished.add(slot.req_id)
                del self.requests[slot.req_id]
                self.slots[i] = self._admit(i)
                replaced.append(i)
        return replaced


def accepted_chain(draft: list[int], text: tuple[int, ...], at: int) -> list[int]:
    """A chain draft verified greedily against the recording from position ``at``: the matching
    prefix and the bonus token (what vLLM's rejection sampler emits)."""
    n = 0
    while n < len(draft) and at + n < len(text) and draft[n] == text[at + n]:
        n += 1
    return list(text[at : at + n + 1])
