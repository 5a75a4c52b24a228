"""What a v2 error answer says: the ``{"error": "..."}`` body a server (the
daemon, a runner) sends with a 4xx or 5xx status. Pure."""

from __future__ import annotations

import json


def error_text(payload: bytes | bytearray | memoryview) -> str:
    """The message of a runner's error answer: its {"error": ...}, else
    what the answer was instead."""
    if len(payload) <= 1 << 20:
        try:
            return str(json.loads(bytes(payload))["error"])
        except (ValueError, KeyError, TypeError, RecursionError):   # a hostile runner nests its JSON deep
            pass
    first = bytes(payload[:300]).decode("utf-8", "replace").splitlines()
    return f"{len(payload)} byte(s), not a JSON error: {first[0] if first else ''}"
