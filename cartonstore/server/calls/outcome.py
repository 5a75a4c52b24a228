"""How every door ends a call: the status, message and headers that answer
an exception (one table: errors.http_status_for, with the daemon's own
Retry-After and WWW-Authenticate), and the call's counter and log line."""

from __future__ import annotations

import logging
import math
import time

from cartonstore.errors import CartonStoreError, Unauthenticated, http_status_for
from cartonstore.server.models.metrics import Metrics
from cartonstore.server.runner_processes.settings import RunnersBusy

from .access import REALM
from .bodies import BuffersFull

log = logging.getLogger("cartonstore.server")


def failure(exc: Exception, method: str, path: str) -> tuple[int, str, dict[str, str]]:
    """The status, message and extra headers that answer an exception from
    a handler; an unexpected one is logged with its traceback (a bug must
    not take the daemon down)."""
    if isinstance(exc, CartonStoreError):
        # a source's Retry-After (FetchError's) is not the daemon's to give
        extra = {}
        if isinstance(exc, (RunnersBusy, BuffersFull)):
            extra["Retry-After"] = str(math.ceil(exc.retry_after))
        elif isinstance(exc, Unauthenticated):
            extra["WWW-Authenticate"] = REALM
        return http_status_for(exc), str(exc), extra
    log.exception("unexpected error handling %s %s", method, path)
    return 500, "internal error (see the daemon's log)", {}


def record_request(metrics: Metrics, access_log: bool, route: str, method: str, path_qs: str, status: int,
                   error_text: str | None, polled: bool, started: float) -> None:
    """The request counter, and the log line: one per error, one per
    request with the access log on."""
    metrics.count_request(route, method, status)
    if status >= 400:
        # Every error answered leaves a line: an operator sees why a load failed.
        # "Not ready" is what a waiting client polls for: a line per poll at debug only.
        level = logging.WARNING if status >= 500 else logging.DEBUG if polled else logging.INFO
        log.log(level, "%s %s -> %d: %s", method, path_qs, status, error_text)
    elif access_log or log.isEnabledFor(logging.DEBUG):
        log.log(logging.INFO if access_log else logging.DEBUG, "%s %s -> %d in %.2f ms",
                method, path_qs, status, (time.perf_counter() - started) * 1000)
