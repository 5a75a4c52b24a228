"""JSON read strictly: an object that names a key twice is refused, not
resolved. The standard library keeps the last value, other readers (serde,
rapidjson) may keep the first or refuse, so a checker and the program it
checks for would read two different documents from one text. Callers word
the error (RepeatedKey.key) for their own readers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Pairs = list[tuple[str, Any]]


class RepeatedKey(ValueError):
    """An object names ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} appears twice in one object")
        self.key = key


def unique_keys(pairs: Pairs) -> dict[str, Any]:
    """json's object_pairs_hook that refuses a repeated key (RepeatedKey)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return doc


def decoder(*, check_key: Callable[[str], None] | None = None,
            parse_constant: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """A decode(text) that refuses repeated keys (RepeatedKey), calls
    ``check_key`` on every key of every object, and ``parse_constant`` on
    NaN, Infinity and -Infinity (as json.loads does; None: they are floats)."""
    hook = unique_keys if check_key is None else _checking_keys(check_key)
    return json.JSONDecoder(object_pairs_hook=hook, parse_constant=parse_constant).decode


def _checking_keys(check_key: Callable[[str], None]) -> Callable[[Pairs], dict[str, Any]]:
    def hook(pairs: Pairs) -> dict[str, Any]:
        for key, _ in pairs:
            check_key(key)
        return unique_keys(pairs)
    return hook
