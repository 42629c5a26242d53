"""The n-gram pool's storage: numpy arrays and the compiled (numba) loops over them.

A pool (:class:`~.pool.NgramPool`) learns every n-gram a request emits, and a server emits
thousands of tokens a step: in Python dicts each learnt n-gram costs a few microseconds of
interpreted work and three tracked tuples for the garbage collector; here it is one hash probe
and a few array writes inside a compiled loop, and the arrays are no garbage collector's concern.
One call learns a whole tail of new tokens (:func:`add_ngrams`; into several pools at once,
:func:`add_to_pools`); a lookup (:func:`get_into`) or a support count (:func:`support_of`) is one
call, and so is a request's lookup over all its pools (:func:`lookup_pools`) or the growth of its
lead (:func:`grow_lead`).

The layout, for a pool of key length ``ctx``, continuations of ``L`` tokens, ``G`` per key:

- ``slots`` int32 ``(S,)``: an open-addressing hash table (linear probing, backward-shift
  deletion, ``S`` a power of two at least twice the key capacity) of key indices, -1 empty;
- ``keys`` int32 ``(C, ctx)``: each key's tokens;
- ``links`` int64 ``(C, 3)``: the key LRU as a doubly linked list (previous, next: least recent
  key first) and the key's continuations held;
- ``conts`` int32 ``(C, G, L)`` and ``entries`` int64 ``(C, G)``: a key's continuations, least
  recent first, each with its entry -- the :class:`~.source.Source` in the low
  :data:`COUNT_SHIFT` bits, the times it was added above them;
- ``meta`` int64 ``(6,)``: the counters below (``KEYS`` .. ``TOP``).

A call that meets a new key with the arrays full stops there and says so; the Python side
(:class:`~.pool.NgramPool`) grows them (:func:`rehash`) and calls again from that n-gram, so the
arrays follow the keys a pool holds, not the n-grams it was given; nothing here allocates.  The
long loops -- a prompt's learning (:func:`add_to_pools_unlocked`) and :func:`rehash` -- run without
the GIL: a new request's state is built on a worker thread beside the engine's.  The functions are
compiled by :func:`load`, on first use (numba is not imported before), once whichever thread asks.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

COUNT_SHIFT = 3  # an entry: the Source in the low bits, the times added above them
SOURCE_MASK = (1 << COUNT_SHIFT) - 1
ONCE = 1 << COUNT_SHIFT

# meta's counters
KEYS = 0  # keys in the table
HEAD = 1  # least recently used key (-1: none)
TAIL = 2  # most recently used key (-1: none)
COUNT = 3  # continuations held
FREE = 4  # first free key index (a list through links[:, NEXT]; -1: none)
TOP = 5  # key indices ever handed out
META_SIZE = 6

PREV, NEXT, HELD = 0, 1, 2  # links' columns


def new_meta() -> np.ndarray:
    meta = np.zeros(META_SIZE, dtype=np.int64)
    meta[HEAD] = meta[TAIL] = meta[FREE] = -1
    return meta


def _hash(tokens) -> np.uint64:
    h = np.uint64(0x9E3779B97F4A7C15)
    for t in tokens:
        h = (h ^ np.uint64(t)) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    return h


def _find(slots, keys, key) -> tuple[int, int]:
    """(the key's index or -1, its slot or the empty slot where it would go)."""
    mask = len(slots) - 1
    s = np.int64(_hash(key) & np.uint64(mask))
    ctx = len(key)
    while True:
        i = slots[s]
        if i < 0:
            return -1, s
        same = True
        for j in range(ctx):
            if keys[i, j] != key[j]:
                same = False
                break
        if same:
            return i, s
        s = (s + 1) & mask


def _unslot(slots, keys, s) -> None:
    """Empty slot ``s``, shifting back the entries after it that probed past it."""
    mask = len(slots) - 1
    hole = s
    j = s
    while True:
        j = (j + 1) & mask
        i = slots[j]
        if i < 0:
            break
        home = np.int64(_hash(keys[i]) & np.uint64(mask))
        # the entry at j stays where its home lies cyclically in (hole, j]
        if (hole < j and hole < home <= j) or (hole > j and (home > hole or home <= j)):
            continue
        slots[hole] = i
        hole = j
    slots[hole] = -1


def _unlink(links, meta, i) -> None:
    prev, nxt = links[i, PREV], links[i, NEXT]
    if prev >= 0:
        links[prev, NEXT] = nxt
    else:
        meta[HEAD] = nxt
    if nxt >= 0:
        links[nxt, PREV] = prev
    else:
        meta[TAIL] = prev


def _append(links, meta, i) -> None:
    tail = meta[TAIL]
    links[i, PREV] = tail
    links[i, NEXT] = -1
    if tail >= 0:
        links[tail, NEXT] = i
    else:
        meta[HEAD] = i
    meta[TAIL] = i


def _added(conts, entries, n, seq, at, source) -> int:
    """Add ``seq[at : at + L]`` to one key's ``n`` continuations (``conts`` (G, L), ``entries``
    (G,)) as the most recent: an equal one moves to the end, counted once more, its source the
    lowest seen; else it is appended, the least recent dropped from a full key.  Returns the
    continuations held after."""
    G, L = conts.shape
    for j in range(n):
        same = True
        for k in range(L):
            if conts[j, k] != seq[at + k]:
                same = False
                break
        if same:
            e = entries[j]
            e = min(e & SOURCE_MASK, source) | ((e & ~SOURCE_MASK) + ONCE)
            for m in range(j, n - 1):
                conts[m] = conts[m + 1]
                entries[m] = entries[m + 1]
            for k in range(L):
                conts[n - 1, k] = seq[at + k]
            entries[n - 1] = e
            return n
    if n == G:
        for m in range(n - 1):
            conts[m] = conts[m + 1]
            entries[m] = entries[m + 1]
        n -= 1
    for k in range(L):
        conts[n, k] = seq[at + k]
    entries[n] = source | ONCE
    return n + 1


def _evict_head(slots, keys, links, meta) -> None:
    """The least recently used key leaves."""
    i = meta[HEAD]
    _unlink(links, meta, i)
    _, s = _find(slots, keys, keys[i])
    _unslot(slots, keys, s)
    meta[COUNT] -= links[i, HELD]
    meta[KEYS] -= 1
    links[i, NEXT] = meta[FREE]
    meta[FREE] = i


def _new_index(links, meta) -> int:
    i = meta[FREE]
    if i >= 0:
        meta[FREE] = links[i, NEXT]
    else:
        i = meta[TOP]
        meta[TOP] += 1
    return i


def add_ngrams(slots, keys, links, conts, entries, meta, seq, first, stride, count, max_keys, source) -> int:
    """Add the n-grams ``seq[p : p + ctx + L]`` for ``p = first + k * stride``, ``k < count``, in
    order, each under its first ``ctx`` tokens as the most recent continuation of the most
    recent key (a key new to a pool of ``max_keys`` keys evicts the least recent first).
    Returns how many were added: fewer than ``count`` where a new key finds the arrays full (the
    caller grows them and adds the rest)."""
    if keys.shape[0] == 0:
        return 0
    ctx = keys.shape[1]
    for k in range(count):
        p = first + k * stride
        key = seq[p : p + ctx]
        i, s = _find(slots, keys, key)
        if i >= 0:
            _unlink(links, meta, i)
        else:
            if meta[KEYS] >= max_keys:
                _evict_head(slots, keys, links, meta)
                _, s = _find(slots, keys, key)
            elif meta[FREE] < 0 and meta[TOP] >= keys.shape[0]:
                return k
            i = _new_index(links, meta)
            keys[i] = key
            slots[s] = i
            links[i, HELD] = 0
            meta[KEYS] += 1
        _append(links, meta, i)
        n = links[i, HELD]
        held = _added(conts[i], entries[i], n, seq, p + ctx, source)
        links[i, HELD] = held
        meta[COUNT] += held - n
    return count


def add_to_pools(tables, seq, start, max_keys, source, from_pool, from_ngram) -> tuple[int, int]:
    """Each pool's (``tables``: its arrays) n-grams of ``seq`` that end at an index >= ``start``,
    as :func:`add_ngrams` adds them (a pool's n-grams span its key and ``L`` tokens), from pool
    ``from_pool``'s n-gram ``from_ngram`` on.  Returns ``(-1, 0)`` when all are added, else the
    pool whose arrays are full and how many of its n-grams are in (grow it, call again from there)."""
    for p in range(from_pool, len(tables)):
        slots, keys, links, conts, entries, meta = tables[p]
        span = keys.shape[1] + conts.shape[2]
        first = max(0, start - span + 1)
        count = len(seq) - first - span + 1
        done = from_ngram if p == from_pool else 0
        if count > done:
            done += add_ngrams(
                slots, keys, links, conts, entries, meta, seq, first + done, 1, count - done, max_keys, source
            )
            if done < count:
                return p, done
    return -1, 0


def add_to_pools_unlocked(tables, seq, start, max_keys, source, from_pool, from_ngram) -> tuple[int, int]:
    """:func:`add_to_pools`, compiled to run without the GIL: a long text (a prompt) learnt on one
    thread leaves the interpreter to the others meanwhile."""
    return add_to_pools(tables, seq, start, max_keys, source, from_pool, from_ngram)


def get_into(slots, keys, links, conts, entries, meta, key, limit, out, out_sources) -> int:
    """Up to ``limit`` continuations of ``key`` into ``out`` / ``out_sources``, most recent
    first (the key becomes the most recent; nothing is stored for a key not held); returns
    how many."""
    i, _ = _find(slots, keys, key)
    if i < 0:
        return 0
    _unlink(links, meta, i)
    _append(links, meta, i)
    n = links[i, HELD]
    m = min(n, limit)
    for j in range(m):
        out[j] = conts[i, n - 1 - j]
        out_sources[j] = entries[i, n - 1 - j] & SOURCE_MASK
    return m


def support_of(slots, keys, links, conts, entries, key, first) -> int:
    """How many times continuations of ``key`` that begin with ``first`` were added (the LRU
    order untouched)."""
    i, _ = _find(slots, keys, key)
    if i < 0:
        return 0
    total = 0
    for j in range(links[i, HELD]):
        if conts[i, j, 0] == first:
            total += entries[i, j] >> COUNT_SHIFT
    return total


def _same_row(out, n, row) -> bool:
    """Whether ``row`` equals one of ``out[:n]``."""
    for r in range(n):
        same = True
        for k in range(len(row)):
            if out[r, k] != row[k]:
                same = False
                break
        if same:
            return True
    return False


def lookup_pools(tables, text, limit, out, out_sources) -> tuple[int, int, int]:
    """Up to ``limit`` distinct continuations of ``text``'s end from several pools (``tables``:
    each pool's arrays, asked in order; a pool keyed by more tokens than ``text`` holds is
    skipped), most recent first within a pool, into ``out`` / ``out_sources``; each pool asked
    answers as :func:`get_into` does (its key becomes its most recent).  Returns how many, the
    index of the pool the first came from (-1: none) and that first continuation's support there
    (:func:`support_of` of its first token)."""
    return _lookup(tables, 0, len(tables), text, limit, out, out_sources)


def _lookup(tables, at, count, text, limit, out, out_sources) -> tuple[int, int, int]:
    """:func:`lookup_pools` over the pools ``tables[at : at + count]`` (the pool it returns
    counted from ``at``)."""
    n = 0
    first = -1
    t = len(text)
    for p in range(count):
        if n >= limit:
            break
        slots, keys, links, conts, entries, meta = tables[at + p]
        ctx = keys.shape[1]
        if t < ctx or meta[KEYS] == 0:
            continue
        i, _ = _find(slots, keys, text[t - ctx :])
        if i < 0:
            continue
        _unlink(links, meta, i)
        _append(links, meta, i)
        held = links[i, HELD]
        for j in range(min(held, limit)):
            c = held - 1 - j
            if _same_row(out, n, conts[i, c]):
                continue
            out[n] = conts[i, c]
            out_sources[n] = entries[i, c] & SOURCE_MASK
            if first < 0:
                first = p
            n += 1
            if n >= limit:
                break
    support = 0
    if first >= 0:
        slots, keys, links, conts, entries, meta = tables[at + first]
        support = support_of(slots, keys, links, conts, entries, text[t - keys.shape[1] :], out[0, 0])
    return n, first, support


def grow_lead(tables, context, buf, t, d, length, sources) -> int:
    """Grow a lead in ``buf`` (``t`` tokens of text, then the lead's ``d`` tokens so far) to
    ``length`` tokens: while shorter, the most recent continuation of the last ``context``
    tokens of text and lead, from the first pool that holds their key (``tables`` in order, as
    :func:`lookup_pools`), is appended, its source into ``sources``.  Returns the lead's length
    (short of ``length`` where no pool knows how it goes on)."""
    return _grow(tables, 0, len(tables), context, buf, t, d, length, sources)


def _grow(tables, at, count, context, buf, t, d, length, sources) -> int:
    """:func:`grow_lead` from the pools ``tables[at : at + count]``."""
    while d < length:
        end = t + d
        w = min(context, end)
        found = False
        for p in range(count):
            slots, keys, links, conts, entries, meta = tables[at + p]
            ctx = keys.shape[1]
            if w < ctx or meta[KEYS] == 0:
                continue
            i, _ = _find(slots, keys, buf[end - ctx : end])
            if i < 0:
                continue
            _unlink(links, meta, i)
            _append(links, meta, i)
            c = links[i, HELD] - 1
            source = entries[i, c] & SOURCE_MASK
            take = min(conts.shape[2], length - d)
            for k in range(take):
                buf[end + k] = conts[i, c, k]
                sources[d + k] = source
            d += take
            found = True
            break
        if not found:
            break
    return d


# -- a batch of requests: every request's pools in one list (:class:`~.pool_batch.PoolBatch`) --
def learn_rows(tables, learns, count, tokens, max_keys, source, resume) -> bool:
    """Request ``r``'s pools ``tables[at : at + count]`` learn the n-grams of its text
    ``tokens[row, :length]`` that end at an index >= ``start`` (as :func:`add_to_pools`), where
    ``learns[:, r]`` = (at, row, start, length), from ``resume`` = (request, pool, n-gram) on.
    False when a pool's arrays are full: ``resume`` then says where (grow that pool, call again).
    (A batch's calls take each request's numbers as one array: every argument is unboxed per call.)"""
    r0, p0, d0 = resume[0], resume[1], resume[2]
    for r in range(r0, learns.shape[1]):
        at, start, length = learns[0, r], learns[2, r], learns[3, r]
        seq = tokens[learns[1, r], :length]
        for p in range(p0 if r == r0 else 0, count):
            slots, keys, links, conts, entries, meta = tables[at + p]
            span = keys.shape[1] + conts.shape[2]
            first = max(0, start - span + 1)
            n = length - first - span + 1
            done = d0 if r == r0 and p == p0 else 0
            if n > done:
                done += add_ngrams(
                    slots, keys, links, conts, entries, meta, seq, first + done, 1, n - done, max_keys, source
                )
                if done < n:
                    resume[0], resume[1], resume[2] = r, p, done
                    return False
    return True


def put_block(tables, at, block) -> None:
    """``tables[at + p] = block[p]`` for each of a request's pools (``block``: a tuple of their
    arrays), appended where the list ends at ``at``: a request's pools entering or leaving the
    batch in one call (each of the list's own item writes is a compiled call of its own)."""
    for p in range(len(block)):
        if at + p == len(tables):
            tables.append(block[p])
        else:
            tables[at + p] = block[p]


def lookup_rows(tables, asks, count, tokens, context, limit, out, out_sources, answers) -> None:
    """:func:`lookup_pools` for each request ``r`` of a batch, ``asks[:, r]`` = (at, row, length,
    root), from its pools ``tables[at : at + count]``, after its text: the last ``context`` tokens
    of ``tokens[row, :length]``, or its root alone where the text does not end with it.  Its
    continuations go to ``out[r]`` / ``out_sources[r]``, (how many, first pool, support) to
    ``answers[r]``."""
    root = np.empty(1, dtype=tokens.dtype)
    for r in range(asks.shape[1]):
        at, end = asks[0, r], asks[2, r]
        row = tokens[asks[1, r]]
        if end > 0 and row[end - 1] == asks[3, r]:
            text = row[max(0, end - context) : end]
            n, first, support = _lookup(tables, at, count, text, limit, out[r], out_sources[r])
        else:
            root[0] = asks[3, r]
            n, first, support = _lookup(tables, at, count, root, limit, out[r], out_sources[r])
        answers[r, 0], answers[r, 1], answers[r, 2] = n, first, support


def grow_rows(tables, asks, count, tokens, context, found, found_sources, want, buf, sources, grown):
    """Each request's lead (:func:`grow_lead`): its first continuation ``found[r, 0]`` cut or grown
    to ``want[r]`` tokens (none where ``want[r]`` is 0) after the text :func:`lookup_rows` asked
    with (``asks`` as there; ``t`` tokens), into ``buf[r, t : t + d]``, each token's source into
    ``sources[r, :d]``; ``grown[r]`` = (t, d)."""
    for r in range(asks.shape[1]):
        if want[r] <= 0:
            grown[r, 0], grown[r, 1] = 0, 0
            continue
        end = asks[2, r]
        row = tokens[asks[1, r]]
        text = buf[r]
        if end > 0 and row[end - 1] == asks[3, r]:
            t = min(context, end)
            text[:t] = row[end - t : end]
        else:
            t = 1
            text[0] = asks[3, r]
        d = min(found.shape[2], want[r])
        text[t : t + d] = found[r, 0, :d]
        sources[r, : want[r]] = found_sources[r, 0]
        if d < want[r]:
            d = _grow(tables, asks[0, r], count, context, text, t, d, want[r], sources[r])
        grown[r, 0], grown[r, 1] = t, d


def rehash(slots, keys, links, meta) -> None:
    """Fill empty ``slots`` with the table's keys (after the arrays grew)."""
    i = meta[HEAD]
    while i >= 0:
        _, s = _find(slots, keys, keys[i])
        slots[s] = i
        i = links[i, NEXT]


def lru_keys(links, meta, out) -> None:
    """The indices of the table's keys, least recent first, into ``out`` (``KEYS`` long)."""
    n = 0
    i = meta[HEAD]
    while i >= 0:
        out[n] = i
        n += 1
        i = links[i, NEXT]


_INLINED = ("_hash", "_unlink", "_append", "_same_row")  # compiled into their callers
_HELPERS = ("_find", "_unslot", "_added", "_evict_head", "_new_index", "_lookup", "_grow")
# what the pools and a request's lookups call
LOOPS = (
    *("add_ngrams", "get_into", "support_of", "rehash", "lru_keys"),
    *("add_to_pools", "add_to_pools_unlocked", "lookup_pools", "grow_lead"),
    *("learn_rows", "lookup_rows", "grow_rows", "put_block"),
)
_UNLOCKED = ("add_to_pools_unlocked", "rehash")  # compiled to release the GIL: the long loops
loops = SimpleNamespace()  # the compiled LOOPS, once load() ran
_loading = threading.Lock()  # a request's state may be built on another thread (its first load() too)


def load() -> SimpleNamespace:
    """The compiled loops (numba, ``cache=True``: compiled once per install, then read from
    numba's cache), made on first use rather than at import: vLLM 0.32's CPU worker scans every
    loaded module when it starts (``vllm.triton_utils.dispatcher._rebind_kernels``) and fails on
    llvmlite's ``ffi.lib``, which importing numba loads -- a serving process makes its first pool
    after its worker started."""
    if vars(loops):
        return loops
    with _loading:
        if not vars(loops):
            _compile()
    return loops


def _compile() -> None:
    from numba import njit

    module = globals()
    for name in _INLINED:
        module[name] = njit(cache=True, inline="always")(module[name])
    for name in (*_HELPERS, *LOOPS):
        module[name] = njit(cache=True, nogil=name in _UNLOCKED)(module[name])
    vars(loops).update({name: module[name] for name in LOOPS})  # at once: seen only when all are made
