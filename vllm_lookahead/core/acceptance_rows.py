"""Every request's acceptance records as rows of one table, a step's observations in one compiled call.

The draft rule reads, per proposing request, its lead records' log-odds shifts and its further
candidates' and window columns' rates (:class:`~.draft_rule.Acceptance`), and every verified
step changes them.  As Python objects that is a dozen calls per request and step (the records'
``add``, the lead model's logits and sigmoids, the shifts worked out again), ~6 us each on a
2-core CPU: at 32 in flight about a tenth of a proposal's host work.  Here a request's records are
one row of :class:`AcceptanceRows` (its slot, held while its :class:`~.draft_rule.LeadConfidence`
lives): an observation -- and a pooled record's ageing, a step at a time -- is appended to the
table's pending rows (:meth:`AcceptanceRows.observe`, :meth:`AcceptanceRows.age`), and the first
read after it applies every pending one in one compiled call (:func:`observe_rows`), which also
works out what the rule reads -- per row its own
shifts and rates (:attr:`AcceptanceRows.reads`), per kind the pooled shifts
(:attr:`AcceptanceRows.pooled_reads`).  A batch step reads them for all its requests at once by
slot (:meth:`AcceptanceRows.gather`).  The arithmetic is the same, in the same order, as the
records' definitions in :mod:`.draft_rule`, so the floats are the same
(tests/unit/test_acceptance_rows.py checks them against a Python reference).

Columns of :attr:`~AcceptanceRows.records` (a request's row): its first lead tokens' calibration
(tries, hits, expected), its next tokens' (the same), its further candidates' rate (hits, tries)
and its window columns' (hits, tries).  :attr:`~AcceptanceRows.pooled` has a row per kind of
request (an engine's greedy and sampled ones, :class:`~.draft_rule.PooledConfidence`): first and
next tokens' calibration, pooled over the requests of that kind; its last row, and
:attr:`~AcceptanceRows.pooled_reads`' last row, stay zero -- the kind of a request with no pooled
record is -1, which indexes them.

Observations and reads are the engine thread's, but a request's state may be built on a worker
thread beside it (:mod:`vllm_lookahead.engine.propose.state_builds`): slots are handed out under a
lock, which also covers every change of the arrays' size and every application of the pending
rows.  A slot freed
(its record collected) is handed out again only after the next application, so that no pending
observation of its last holder reaches its next one.
"""

from __future__ import annotations

import math
import threading
import weakref
from types import SimpleNamespace

import numpy as np

# records' columns
FIRST, NEXT = 0, 3  # a calibration's first column: tries, hits, expected
CANDIDATE, WINDOW = 6, 8  # a rate's first column: hits, tries
RECORD_COLUMNS = 10
# reads' columns: own first-token shift, own next-token shift, candidate rate, window-column rate
SHIFT_FIRST, SHIFT_NEXT, CANDIDATE_RATE, WINDOW_RATE = range(4)
# an observation's columns (pending rows)
(SLOT, LEAD, LEAD_ACCEPTED, CANDIDATES, ACCEPTED, COLUMNS, COLUMNS_ACCEPTED, CONTEXT, SUPPORT, SHARED, DRAFTED) = range(
    11
)
OBSERVATION = 11
_AGE_PADDING = (0.0,) * (OBSERVATION - 2)  # an ageing row: slot -1 - kind, decay, nothing else


class AcceptanceRows:
    """Acceptance records by slot, with ``kinds`` pooled records (see the module docstring).
    ``constants`` = (decay, prior weight, pooled prior weight, candidate prior, window prior),
    ``logit_tables``: the lead model's (own first, own next, shared first, shared next, the two
    support slopes), as :mod:`.draft_rule` defines them."""

    def __init__(self, kinds: int, constants: tuple[float, ...], logit_tables: np.ndarray, capacity: int = 4) -> None:
        self._constants = np.array(constants, dtype=np.float64)
        self._tables = logit_tables
        self._lock = threading.Lock()
        self._pending: list[float] = []  # observations not yet applied, OBSERVATION numbers each
        self._free: list[int] = []  # slots to hand out
        self._freed: list[int] = []  # slots whose records went, free from the next application on
        self.records = np.zeros((0, RECORD_COLUMNS), dtype=np.float64)
        self.reads = np.zeros((0, 4), dtype=np.float64)
        self.kinds = np.zeros(0, dtype=np.int64)
        self.pooled = np.zeros((kinds + 1, 6), dtype=np.float64)
        self.pooled_reads = np.zeros((kinds + 1, 2), dtype=np.float64)
        self._grow(capacity)

    def __len__(self) -> int:
        """Slots the arrays have room for (held or free)."""
        return len(self.kinds)

    def add(self, kind: int, owner: object) -> int:
        """A slot for a new record of ``kind`` (-1: none pooled), at its priors, held while
        ``owner`` lives."""
        with self._lock:
            if not self._free:
                self._grow(2 * len(self))
            slot = self._free.pop()
            _, weight, _, candidate, window = self._constants.tolist()
            hits = (candidate * weight, window * weight)  # each rate's prior: its value in `weight` tries
            self.records[slot] = 0.0
            self.records[slot, CANDIDATE : CANDIDATE + 2] = (hits[0], weight)
            self.records[slot, WINDOW : WINDOW + 2] = (hits[1], weight)
            self.reads[slot] = (0.0, 0.0, hits[0] / weight, min(1.0, hits[1] / weight))  # _rate's reading
            self.kinds[slot] = kind
        weakref.finalize(owner, self._freed.append, slot)
        return slot

    def _grow(self, capacity: int) -> None:
        old = len(self)
        for name in ("records", "reads", "kinds"):
            array = getattr(self, name)
            grown = np.zeros((capacity, *array.shape[1:]), dtype=array.dtype)
            grown[:old] = array
            setattr(self, name, grown)
        self.kinds[old:] = -1
        self._free.extend(range(capacity - 1, old - 1, -1))  # the lowest slots first

    def observe(self, slot: int, *numbers: float) -> None:
        """One verified step of ``slot``'s request, applied at the next read: the observation's
        numbers after the slot, in :data:`OBSERVATION`'s order (:meth:`.draft_rule.Acceptance.observe`)."""
        self._pending += (slot, *numbers)

    def fresh(self) -> None:
        """Apply the pending observations (every read calls this first)."""
        if self._pending:
            self._apply()

    def _apply(self) -> None:
        with self._lock:
            rows, self._pending = self._pending, []
            load().observe_rows(
                self.records,
                self.reads,
                self.kinds,
                self.pooled,
                self.pooled_reads,
                np.array(rows, dtype=np.float64).reshape(-1, OBSERVATION),
                self._constants,
                self._tables,
            )
            self._release()

    def _release(self) -> None:
        while self._freed:
            slot = self._freed.pop()
            self.kinds[slot] = -1
            self._free.append(slot)

    def shifts(self, slot: int) -> tuple[float, float]:
        """``slot``'s log-odds shifts of first and next lead tokens: its own plus its kind's pooled ones."""
        self.fresh()
        own = self.reads[slot].tolist()
        pooled = self.pooled_reads[self.kinds[slot]].tolist()
        return own[0] + pooled[0], own[1] + pooled[1]

    def rate(self, slot: int, column: int) -> float:
        """``slot``'s candidate (:data:`CANDIDATE_RATE`) or window-column (:data:`WINDOW_RATE`) rate."""
        self.fresh()
        return float(self.reads[slot, column])

    def gather(self, slots: list[int]) -> np.ndarray:
        """What the rule reads of each slot, ``(len(slots), 4)``: its shifts (:meth:`shifts`) and
        its two rates, in :attr:`reads`' columns."""
        self.fresh()
        at = np.array(slots, dtype=np.int64)
        out = self.reads[at]
        out[:, :2] += self.pooled_reads[self.kinds[at]]
        return out

    def age(self, kind: int, decay: float) -> None:
        """One proposal step has passed for ``kind``'s pooled record (both calibrations aged by
        ``decay``): a pending row of its own (slot ``-1 - kind``, the decay after it), applied in
        order with the observations."""
        self._pending += (-1 - kind, decay, *_AGE_PADDING)

    def add_rate(self, slot: int, column: int, hits: float, tries: float) -> None:
        """One step's outcome of ``slot``'s rate at ``column`` (:data:`CANDIDATE` or :data:`WINDOW`),
        as an observation adds it."""
        self.fresh()
        with self._lock:
            load().add_rate(self.records, self.reads, slot, column, float(hits), float(tries), self._constants)


# -- the compiled loops (numba, made on first use: see ngram_table.load) --------------------------
def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z)) if z > -30 else 0.0


def _logit(p):
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _shift(record, at, prior_weight):
    """A calibration's log-odds shift (:attr:`.draft_rule._Calibration.shift`): ``record[at : at + 3]``
    = tries, hits, expected."""
    tries, hits, expected = record[at], record[at + 1], record[at + 2]
    if tries <= 0:
        return 0.0
    predicted = expected / tries
    observed = (hits + prior_weight * predicted) / (tries + prior_weight)
    return _logit(observed) - _logit(predicted)


def _calibrate(record, at, decay, tries, hits, expected):
    """:meth:`.draft_rule._Calibration.add`."""
    record[at] = decay * record[at] + tries
    record[at + 1] = decay * record[at + 1] + hits
    record[at + 2] = decay * record[at + 2] + expected


def _rate(record, read, at, column, decay, hits, tries, cap):
    """:meth:`.draft_rule._Rate.add`, then its value into ``read[column]``."""
    if tries > 0 or hits > 0:
        record[at] = decay * record[at] + hits
        record[at + 1] = decay * record[at + 1] + tries
    read[column] = min(cap, record[at] / record[at + 1]) if record[at + 1] > 0 else cap


def _by_context(table, context):
    return table[min(max(context, 1), len(table)) - 1]


def observe_rows(records, reads, kinds, pooled, pooled_reads, rows, constants, tables):
    """Every pending observation, in order (:meth:`.draft_rule.Acceptance.observe` of each; a row
    of slot ``-1 - kind``: that kind's pooled record aged by ``row[1]``):
    ``tables`` = (lengths of the four logit tables, then own first, own next, shared first,
    shared next, own support slope, shared support slope)."""
    decay, weight, pooled_weight = constants[0], constants[1], constants[2]
    n0, n1, n2, n3 = int(tables[0]), int(tables[1]), int(tables[2]), int(tables[3])
    own_first, own_next = tables[4 : 4 + n0], tables[4 + n0 : 4 + n0 + n1]
    shared_first = tables[4 + n0 + n1 : 4 + n0 + n1 + n2]
    shared_next = tables[4 + n0 + n1 + n2 : 4 + n0 + n1 + n2 + n3]
    slopes = tables[4 + n0 + n1 + n2 + n3 :]
    for k in range(rows.shape[0]):
        row = rows[k]
        s = int(row[SLOT])
        if s < 0:  # a kind's pooled record ages one step (PooledConfidence.age)
            kind = -1 - s
            for at in range(6):
                pooled[kind, at] = row[1] * pooled[kind, at]
            pooled_reads[kind, 0] = _shift(pooled[kind], FIRST, pooled_weight)
            pooled_reads[kind, 1] = _shift(pooled[kind], NEXT, pooled_weight)
            continue
        record, read = records[s], reads[s]
        tried, accepted = int(row[LEAD]), int(row[LEAD_ACCEPTED])
        if tried > 0:  # LeadConfidence.observe
            nexts = min(tried - 1, accepted)
            context, support, shared = int(row[CONTEXT]), int(row[SUPPORT]), row[SHARED] > 0
            first_table, next_table = (shared_first, shared_next) if shared else (own_first, own_next)
            first = _by_context(first_table, context) + slopes[1 if shared else 0] * math.log(max(support, 1))
            following = _by_context(next_table, context) if nexts > 0 else 0.0
            kind = kinds[s]
            if row[DRAFTED] > 0 and kind >= 0:  # against the request's own estimate
                _calibrate(pooled[kind], FIRST, 1.0, 1, int(accepted > 0), _sigmoid(first + read[SHIFT_FIRST]))
                if nexts > 0:
                    expected = nexts * _sigmoid(following + read[SHIFT_NEXT])
                    _calibrate(pooled[kind], NEXT, 1.0, nexts, accepted - 1, expected)
                pooled_reads[kind, 0] = _shift(pooled[kind], FIRST, pooled_weight)
                pooled_reads[kind, 1] = _shift(pooled[kind], NEXT, pooled_weight)
            _calibrate(record, FIRST, decay, 1, int(accepted > 0), _sigmoid(first))
            if nexts > 0:
                _calibrate(record, NEXT, decay, nexts, accepted - 1, nexts * _sigmoid(following))
            read[SHIFT_FIRST] = _shift(record, FIRST, weight)
            read[SHIFT_NEXT] = _shift(record, NEXT, weight)
        candidates = row[CANDIDATES]
        if candidates > 0:
            hits = max(0.0, row[ACCEPTED] - accepted)
            _rate(record, read, CANDIDATE, CANDIDATE_RATE, decay, hits, candidates, np.inf)
        _rate(record, read, WINDOW, WINDOW_RATE, decay, row[COLUMNS_ACCEPTED], row[COLUMNS], 1.0)


def add_rate(records, reads, slot, column, hits, tries, constants):
    """:meth:`.draft_rule._Rate.add` of ``slot``'s rate at ``column``."""
    cap = np.inf if column == CANDIDATE else 1.0
    read = CANDIDATE_RATE if column == CANDIDATE else WINDOW_RATE
    _rate(records[slot], reads[slot], column, read, constants[0], hits, tries, cap)


_INLINED = ("_sigmoid", "_logit", "_shift", "_calibrate", "_rate", "_by_context")
LOOPS = ("observe_rows", "add_rate")
loops = SimpleNamespace()
_loading = threading.Lock()


def load() -> SimpleNamespace:
    """The compiled loops (numba, ``cache=True``), made on first use: see :func:`.ngram_table.load`."""
    if not vars(loops):
        with _loading:
            if not vars(loops):
                from numba import njit

                module = globals()
                for name in _INLINED:
                    module[name] = njit(cache=True, inline="always")(module[name])
                compiled = {name: njit(cache=True)(module[name]) for name in LOOPS}
                module.update(compiled)
                vars(loops).update(compiled)
    return loops
