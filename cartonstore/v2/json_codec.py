"""JSON for the v2 wire: orjson's speed, the strictness of the daemon's
own rules, and the standard library's answers wherever the two differ.

Why not json alone: a tensor of 1M numbers as JSON "data" took the stdlib
~0.22 s to parse and ~0.38 s to write here, and a request is parsed twice
(the daemon validates it, the runner decodes it) and answered once; orjson
does each in a fifth of that.

Why not orjson alone:
- A key repeated in one object must be refused, not resolved: orjson keeps
  the last value, a rapidjson runner the first, so the daemon would
  validate one request and forward another. orjson cannot say it dropped
  one, so ``loads`` counts: every ':' of a JSON text separates a key from
  its value or lies inside a string, so a text whose colons outnumber the
  parsed keys plus the colons inside parsed strings lost a key. Only an
  escaped colon (\\u003a) could hide one, so a text holding that goes to
  the strict stdlib decoder, as does one that fails the count.
- orjson refuses what the stdlib accepted (NaN, 1e400, lone surrogates):
  the stdlib decides those, with its own error messages. And it reads an
  integer past 64 bits as a float, so a text with a run of 19 digits or
  more (which no float Python writes holds) is read by the stdlib, which
  keeps every digit: a parameter passed on, or the number a range error
  names, is the one the client wrote.
- orjson writes NaN and infinities as null and refuses ints past 64 bits;
  ``dumps`` callers say when a document may hold either (``exact=False``)
  and get the stdlib's output, NaN literals included, as before.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import orjson

__all__ = ["dumps", "loads", "loads_noting_numbers"]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
MAX_DEPTH = 256   # a tensor's data nests one level per dimension; nothing in a request needs more
SMALL = 4096      # shorter texts are read by the stdlib alone (its fixed cost is lower than orjson's checks')
_ESCAPED_COLON = re.compile(rb"\\u003[aA]")
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
# orjson reads an integer outside [-2**63, 2**64) as a float; the shortest
# such (-2**63 - 1) has 19 digits, and so does every int64 near its limits.
_LONG_RUN = b"0" * 19


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        repeated = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]  # add() is None: false
        raise ValueError(f"key {repeated!r} appears twice in one object")
    return doc


# One decoder, fed str: json.loads would sniff the encoding of every body,
# but HTTP JSON is UTF-8 (RFC 8259).
_strict_decode = json.JSONDecoder(object_pairs_hook=_unique_keys).decode


def loads(raw: bytes | bytearray) -> Any:
    """The JSON value of ``raw`` (UTF-8). ValueError (or RecursionError) for
    text that is not JSON, repeats a key within one object, or nests arrays
    and objects more than MAX_DEPTH deep."""
    return loads_noting_numbers(raw)[0]


def loads_noting_numbers(raw: bytes | bytearray) -> tuple[Any, frozenset[int]]:
    """loads, and the ids of the arrays in the document that hold numbers
    alone (int and float: no bool, string, null, array or object), so a
    checker of tensor data need not look at each element's type again
    (valid while the document lives). Conservative: empty when the text
    holds a true or false anywhere, or was read by the stdlib."""
    if len(raw) < SMALL:   # an infer header with binary data, a lease: the stdlib is quicker than the checks
        return strict_loads(raw), frozenset()
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return strict_loads(raw), frozenset()
    colons, depth, numbers = _walk(doc)
    if _ESCAPED_COLON.search(raw) or raw.count(b":") != colons or _has_long_digit_run(raw):
        return strict_loads(raw), frozenset()
    _check_depth(depth)
    if numbers and (raw.find(b"true") >= 0 or raw.find(b"false") >= 0):
        numbers = []   # sum() takes booleans for numbers: which arrays hold one is not known
    return doc, frozenset(numbers)


def _has_long_digit_run(raw: bytes | bytearray) -> bool:
    # Two passes in C (~6 ms for 7 MB), where a regex took 75 ms.
    return raw.translate(_DIGITS_AS_ZERO).find(_LONG_RUN) >= 0


def strict_loads(raw: bytes | bytearray) -> Any:
    """The standard library's reading of ``raw``, repeated keys refused."""
    doc = _strict_decode(raw.decode("utf-8"))
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:   # else it cannot nest that deep: no walk
        _check_depth(_walk(doc)[1])
    return doc


def _check_depth(depth: int) -> None:
    # What reads the document next recurses (flattening nested data, writing
    # the header on): past Python's own limit that would be a crash, not a 400.
    if depth > MAX_DEPTH:
        raise ValueError(f"arrays and objects nested {depth} deep (at most {MAX_DEPTH})")


def _walk(doc: Any) -> tuple[int, int, list[int]]:
    """Keys in ``doc`` plus the colons inside its keys and strings; how
    deep its arrays and objects nest; the ids of its arrays of numbers and
    booleans alone."""
    count = deepest = 0
    numbers: list[int] = []
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is dict:
            deepest = max(deepest, depth)
            count += len(value)
            for key in value:
                count += key.count(":")
            stack.extend((item, depth + 1) for item in value.values())
        elif kind is list:
            deepest = max(deepest, depth)
            try:   # tensor data: a million numbers add up in C in a few ms, and hold no colon
                sum(value, 0.0)
                numbers.append(id(value))
                continue
            except (TypeError, OverflowError):
                pass
            kinds = set(map(type, value))
            if str in kinds:
                count += sum(item.count(":") for item in value if type(item) is str)
            if list in kinds or dict in kinds:
                stack.extend((item, depth + 1) for item in value if type(item) is list or type(item) is dict)
        elif kind is str:
            count += value.count(":")
    return count, deepest, numbers


def dumps(doc: Any, *, exact: bool = True) -> bytes:
    """``doc`` as compact UTF-8 JSON. numpy arrays (C-contiguous, native
    order) are written as arrays of their numbers. ``exact=False``: the
    document may hold non-finite floats or ints past 64 bits, which the
    stdlib writes as it always did (NaN, Infinity, every digit)."""
    if exact:
        try:
            return orjson.dumps(doc, option=_NUMPY)
        except orjson.JSONEncodeError:
            pass   # an int past 64 bits, or an array orjson does not take: the stdlib's way
    return json.dumps(doc, separators=(",", ":"), default=_as_list).encode("utf-8")


def _as_list(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
