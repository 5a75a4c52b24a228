"""Error answers: JSON {"error": ...}, the message kept on the response for
the daemon's log line (app.errors_and_metrics writes one per error)."""

from __future__ import annotations

from aiohttp import web

ERROR_TEXT = "cartonstore.error"   # the key under which an error response keeps its message
POLLED = "cartonstore.polled"      # an answer clients poll for (not ready yet): logged at debug


def error(status: int, message: str, *, polled: bool = False, details: dict | None = None) -> web.Response:
    """{"error": message, **details} (details: a runner's "stderr" lines)."""
    response = web.json_response({**(details or {}), "error": message}, status=status)
    response[ERROR_TEXT] = message
    if polled:
        response[POLLED] = True
    return response
