"""The one exception hierarchy of cartonstore.

Exceptions are grouped by what a caller can do about them, not by where they
were raised. Each carries the thing it is about (a path, a digest, a URL) as
``subject`` so that the CLI and the HTTP API can report it without parsing
messages. Foreign exceptions (OSError, sqlite3, zlib, zstandard, tomli) are
translated into these once, at the boundary of the module that calls them.
"""

from __future__ import annotations

from typing import Any


class CartonStoreError(Exception):
    """Base of every error cartonstore raises on purpose."""

    def __init__(self, message: str, *, subject: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.subject = subject
        # what an error answer carries beside its message, as JSON (a runner's stderr lines)
        self.details = details or {}

    def __str__(self) -> str:
        return self.message


class NotFound(CartonStoreError):
    """A blob, carton, name, lease or file that does not exist."""


class AlreadyExists(CartonStoreError):
    """The thing being created is already there (often a normal outcome)."""


class Conflict(CartonStoreError):
    """The request clashes with the store's state: a carton in use, an
    ambiguous reference."""


class InvalidInput(CartonStoreError):
    """The caller gave something malformed: a bad carton, request or config."""


class TooLarge(InvalidInput):
    """A request bigger than the daemon takes (HTTP 413)."""


class InvalidCarton(InvalidInput):
    """A carton (or one file in it) breaks the format.

    ``file`` is the path inside the carton (``carton.toml``, ``MANIFEST``,
    ``model/x.safetensors``...), ``field`` the key or line within it when
    there is one. The message always starts with them so users can find the
    problem without reading code.
    """

    def __init__(self, file: str, problem: str, *, field: str | None = None) -> None:
        where = f"{file}: {field}" if field else file
        super().__init__(f"{where}: {problem}", subject=file)
        self.file = file
        self.field = field
        self.problem = problem


class IntegrityError(CartonStoreError):
    """Bytes that do not match their digest, or a store that disagrees with its index."""


class ManifestMismatch(IntegrityError):
    """A file of a carton whose bytes do not hash to its MANIFEST line: the
    carton is damaged or was tampered with. An integrity failure (exit 5);
    to the HTTP API it is a bad carton from the caller (400)."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: does not match MANIFEST: {problem}", subject=file)
        self.file = file
        self.problem = problem


class PermissionDenied(CartonStoreError):
    """The caller's credential does not cover what it asked (HTTP 403): the
    peer token outside /v1/blobs, say."""


class Unauthenticated(PermissionDenied):
    """A route that needs a credential got none, or a wrong one (HTTP 401)."""


class Unavailable(CartonStoreError):
    """Something needed is out of reach right now: network, disk space, a lock."""


class BadUpstream(Unavailable):
    """A process the daemon relays to (a model's runner) answered what the
    protocol does not allow: more than its limit, not HTTP, an output the
    model does not declare (HTTP 502). The runner's fault, never the caller's."""


class FetchError(Unavailable):
    """A source could not deliver: a network failure, an HTTP error status, a
    response that breaks the protocol (wrong Content-Range, an unknown or
    bomb-sized Content-Encoding, a body shorter or longer than announced).
    ``subject`` is the URL. ``retryable`` says whether the same URL may
    succeed if asked again (timeouts, resets, 408/429/5xx). ``status`` and
    ``error_code`` are the refusing answer's HTTP status and X-Error-Code
    header, when an answer came: a source that names its refusals there
    (the Hugging Face Hub) is read without asking it twice."""

    def __init__(self, message: str, *, subject: str | None = None, retryable: bool = False,
                 retry_after: float | None = None, status: int | None = None,
                 error_code: str | None = None) -> None:
        super().__init__(message, subject=subject)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.error_code = error_code


class FetchNotFound(FetchError, NotFound):
    """The server says there is no such resource (HTTP 404 or 410): a
    FetchError to the fetcher, not found (exit 3) to the user."""


# What each category means to a command's exit status and to an HTTP status:
# the one table both the CLI and the API read (first match wins, so
# subclasses come before their bases).
CATEGORIES: list[tuple[type[CartonStoreError], int, int]] = [
    (NotFound, 3, 404),
    (TooLarge, 4, 413),
    (InvalidInput, 4, 400),
    (ManifestMismatch, 5, 400),   # the caller's carton is bad, not the store
    (IntegrityError, 5, 500),
    (BadUpstream, 6, 502),
    (Unavailable, 6, 503),
    (Conflict, 7, 409),
    (Unauthenticated, 9, 401),
    (PermissionDenied, 9, 403),
    (AlreadyExists, 7, 409),
    (CartonStoreError, 1, 500),
]


def exit_code_for(exc: CartonStoreError) -> int:
    return next(code for cls, code, _ in CATEGORIES if isinstance(exc, cls))


def http_status_for(exc: CartonStoreError) -> int:
    return next(status for cls, _, status in CATEGORIES if isinstance(exc, cls))
