"""How an n-gram pool names a key: one int for a key of up to three tokens.

A pool keyed by the last 2 or 3 tokens (``lookup_context``) is a Python dict, and every n-gram a
request learns updates it: with tuple keys each update builds the tuple and hashes it (CPython does
not cache a tuple's hash) two or three times.  A key of two or three tokens below ``2**21`` (any
vocabulary under two million tokens) is named instead by one int, its tokens 21 bits apart, first
token lowest; an int hashes to itself.  A key with a larger token keeps its tuple (an int and a
tuple never compare equal, so the two kinds of names cannot collide).  One token is its own name.
"""

from __future__ import annotations

from collections.abc import Sequence

NAME_BITS = 21
_LIMIT = 1 << NAME_BITS
_MASK = _LIMIT - 1


def packs(context: int) -> bool:
    """Whether keys of ``context`` tokens are named by one int (2 or 3 tokens)."""
    return 1 < context <= 3


def key_name(tokens: Sequence[int]) -> object:
    """The name of the key ``tokens`` (Python ints; 1-3 tokens packed, see the module docstring)."""
    if len(tokens) == 1:
        return tokens[0]
    if len(tokens) <= 3 and max(tokens) < _LIMIT and min(tokens) >= 0:
        name = tokens[0] | tokens[1] << NAME_BITS
        return name | tokens[2] << 2 * NAME_BITS if len(tokens) == 3 else name
    return tuple(tokens)


def key_names(seq: list[int], context: int, count: int) -> list:
    """The names of the keys ``seq[p : p + context]`` for ``p < count`` (``seq``: Python ints)."""
    if context == 1:
        return seq[:count]
    if not packs(context):
        return list(zip(*(seq[i : i + count] for i in range(context))))
    if seq and (max(seq) >= _LIMIT or min(seq) < 0):  # some keys keep their tuple: name each
        return [key_name(seq[p : p + context]) for p in range(count)]
    first, second = seq[:count], seq[1 : count + 1]
    if context == 2:
        return [a | b << NAME_BITS for a, b in zip(first, second)]
    return [a | b << NAME_BITS | c << 2 * NAME_BITS for a, b, c in zip(first, second, seq[2 : count + 2])]


def key_tokens(name: object, context: int) -> tuple[int, ...]:
    """The tokens a key's name stands for."""
    if isinstance(name, tuple):
        return name
    assert isinstance(name, int)
    return tuple((name >> NAME_BITS * i) & _MASK for i in range(context))
